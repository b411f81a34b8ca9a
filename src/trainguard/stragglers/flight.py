"""Collective arrival times from flight-recorder dumps: the straggler signal of scripts without phases.

Reads every ``fr_trace_rank_<r>`` dump under a run's ``diagnostics/`` (the supervisor's straggler probes
in ``diagnostics/stragglers/attempt-<k>/probe-<n>/`` and failure evidence in ``diagnostics/attempt-<k>/``)
with the restricted reader of `trainguard.localize.reader` (never torch, never code from a pickle).
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from pathlib import Path

from trainguard.localize.reader import DumpError, rank_from_name, read_dump

log = logging.getLogger(__name__)

DEFAULT_PG = 0
"""``pg_id`` of the default process group, the one every rank of a data-parallel step joins."""
_ATTEMPT = re.compile(r"^attempt-(\d+)$")


def _attempt_of(path: Path, diagnostics: Path) -> int | None:
    for part in path.relative_to(diagnostics).parts:
        m = _ATTEMPT.match(part)
        if m:
            return int(m.group(1))
    return None


def read_arrivals(run_dir: str | Path, warnings: list[str] | None = None) -> dict[int, dict[int, list[float]]]:
    """attempt -> rank -> enqueue wall-clock times (seconds) of the default group's collectives, aligned:
    index i is the same collective (sequence number) on every rank of the attempt.

    Several dumps of one rank (successive probes) are merged by sequence number. Unreadable dumps are
    skipped and named in ``warnings``.
    """
    diagnostics = Path(run_dir) / "diagnostics"
    if not diagnostics.is_dir():
        return {}
    times: dict[int, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for path in sorted(diagnostics.rglob("fr_trace_rank_*")):
        if not path.is_file() or path.is_symlink():
            continue
        attempt, rank = _attempt_of(path, diagnostics), rank_from_name(path.name)
        if attempt is None or rank is None:
            continue
        try:
            dump = read_dump(path, rank)
        except (DumpError, OSError) as exc:
            if warnings is not None:
                warnings.append(f"{path.relative_to(diagnostics.parent)}: unreadable flight-recorder dump ({exc})")
            continue
        seen = times[attempt][rank]
        for e in dump.entries:
            if not isinstance(e, dict) or e.get("pg_id") != DEFAULT_PG or e.get("is_p2p") is True:
                continue
            seq, t = e.get(dump.fmt.seq_key), e.get("time_created_ns")
            if isinstance(seq, int) and isinstance(t, int) and not isinstance(t, bool) and t > 0:
                seen.setdefault(seq, t / 1e9)
    out: dict[int, dict[int, list[float]]] = {}
    for attempt, per_rank in times.items():
        common = set.intersection(*(set(v) for v in per_rank.values())) if per_rank else set()
        if len(per_rank) >= 2 and common:
            out[attempt] = {r: [v[s] for s in sorted(common)] for r, v in per_rank.items()}
    return out
