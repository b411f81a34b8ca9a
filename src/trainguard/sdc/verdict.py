"""Silent data corruption, the pure part: combine parameter checksums into one fingerprint, find the replica
that disagrees with the majority, and the marker a detecting worker leaves for its agent (no torch here).

The torch side (checksums of parameter bytes, the all-gather, the chaos bit flip) is `trainguard.sdc.check`;
the agent's rollback and exclusion use `rollback_plan` and `exclusion_decision`. See docs/sdc.md.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainguard.core.numeric import in_range, is_number
from trainguard.errors import UsageError

DEFAULT_CHECK_EVERY = 100
"""Default interval of the check in optimizer steps (``--sdc-check-every``); 0 turns the check off."""
DEMO_CHECK_EVERY = 10
"""The demo's default: its runs are 100 steps, so a fault injected there is found mid-run."""
MAX_CHECK_EVERY = 1_000_000_000
ENV_CHECK_EVERY = "TRAINGUARD_SDC_EVERY"
"""Worker environment variable the agent sets to the interval (absent or 0: no check)."""
MARKER_DIR = "sdc"
"""Folder of the run directory holding detection markers (``detected-attempt-<k>.json``)."""
MASK64 = (1 << 64) - 1
_FORMAT = "trainguard-sdc"


def check_every(value: Any, flag: str = "--sdc-check-every") -> int:
    """A validated interval (0 = off, else 1..1e9); `UsageError` naming ``flag`` otherwise."""
    text = str(value).strip()
    if not text.isdigit() or len(text) > 10 or int(text) > MAX_CHECK_EVERY:
        raise UsageError(f"{flag} must be an integer from 0 (off) to {MAX_CHECK_EVERY}, got {value!r}")
    return int(text)


def env_check_every(environ: dict[str, str] | Any) -> int:
    """The interval the agent handed the worker (0 when absent or unreadable: a worker never fails on it)."""
    try:
        return check_every(environ.get(ENV_CHECK_EVERY, "0"))
    except UsageError:
        return 0


def _mix(x: int) -> int:
    """splitmix64's finalizer: every input bit flips about half the output bits."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def combine(values: Iterable[int]) -> int:
    """One 64-bit fingerprint of an ordered sequence of integers (per-parameter checksums).

    Order-sensitive and position-mixed, so the same checksums on two different parameters, or two
    parameters swapped, give different fingerprints; any single changed value changes the result.
    """
    h = 0x9E3779B97F4A7C15
    for i, v in enumerate(values):
        h = _mix(h ^ _mix((v & MASK64) + i + 1))
    return h


def dtype_code(name: str) -> int:
    """A stable number for a dtype's name (Python's own ``hash`` of a string differs per process)."""
    return zlib.crc32(name.encode())


def structure_fingerprint(shapes: Iterable[tuple[int, str]]) -> int:
    """Fingerprint of (element count, dtype name) per parameter: replicas must agree on it to be compared."""
    flat: list[int] = []
    for numel, dtype in shapes:
        flat += [numel, dtype_code(dtype)]
    return combine(flat)


def to_signed(value: int) -> int:
    """A 64-bit unsigned value as the int64 a tensor can hold (and back with ``& MASK64``)."""
    value &= MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


@dataclass(frozen=True)
class SdcVerdict:
    """What one comparison of the replicas' fingerprints found."""

    clean: bool
    """All replicas agree."""
    comparable: bool
    """The ranks hold replicas at all (same parameter structure, and with 3+ ranks at least two agree);
    False: the job is not pure data parallel and the check should turn itself off."""
    culprits: tuple[int, ...]
    """Ranks outside the majority; with no strict majority, every rank that is a suspect."""
    majority: bool
    """A strict majority of ranks agreed, so the culprits are named with confidence."""
    explanation: str
    """One line for people."""


def judge(ranks: Sequence[int], fingerprints: Sequence[int], structures: Sequence[int] | None = None) -> SdcVerdict:
    """Compare the fingerprints of data-parallel replicas (``fingerprints[i]`` belongs to ``ranks[i]``).

    The odd ones out of a strict majority (more than half the ranks) are the culprits. Without one
    (two ranks that differ, a 2-2 split) nobody can be singled out: every rank outside the largest
    group, or every rank of a tie, is a suspect and ``majority`` is False.
    """
    if len(ranks) != len(fingerprints) or (structures is not None and len(structures) != len(ranks)):
        raise ValueError("one fingerprint (and structure) per rank")
    n = len(ranks)
    if structures is not None and len(set(structures)) > 1:
        return SdcVerdict(False, False, (), False, "ranks hold differently shaped parameters: not data-parallel "
                                                   "replicas, nothing to compare")
    counts = Counter(fingerprints)
    if len(counts) <= 1:
        return SdcVerdict(True, True, (), n > 2, f"{n} replicas agree")
    if n >= 3 and len(counts) == n:
        return SdcVerdict(False, False, (), False, f"all {n} ranks differ: not data-parallel replicas (or every "
                                                   f"rank is corrupt); nothing to compare")
    top, top_count = counts.most_common(1)[0]
    if top_count * 2 > n:
        culprits = tuple(sorted(r for r, f in zip(ranks, fingerprints, strict=True) if f != top))
        return SdcVerdict(False, True, culprits, True,
                          f"rank{'s' if len(culprits) > 1 else ''} {_list(culprits)} disagree"
                          f"{'' if len(culprits) > 1 else 's'} with the other {top_count} of {n} replicas")
    tied = [fp for fp, c in counts.items() if c == top_count]
    if len(tied) > 1:  # a tie for the largest group: every rank is a suspect
        suspects = tuple(sorted(ranks))
    else:
        suspects = tuple(sorted(r for r, f in zip(ranks, fingerprints, strict=True) if f != top))
    return SdcVerdict(False, True, suspects, False,
                      f"replicas disagree and no strict majority of the {n} ranks agrees: ranks {_list(suspects)} "
                      f"are suspects (it takes 3 or more ranks to name a culprit)")


def _list(ranks: Iterable[int]) -> str:
    return ",".join(str(r) for r in ranks)


@dataclass(frozen=True)
class SdcMarker:
    """What a worker that detected corruption tells its agent (``<run dir>/sdc/detected-attempt-<k>.json``)."""

    attempt: int
    """The attempt in which the check failed."""
    step: int
    """The step after whose optimizer update the check ran and failed."""
    last_clean_step: int
    """Newest step known clean in this attempt: the last passing check, else the attempt's starting
    point (step 0, or the step it resumed from, when the replicas were made identical by the restore)."""
    last_clean_time: float
    """Wall-clock time of ``last_clean_step``'s check (or of the attempt's first step); the corruption
    happened after it, so ``time - last_clean_time`` bounds how old it is."""
    time: float
    """Wall-clock time of the failed check."""
    ranks: tuple[int, ...]
    """The ranks compared, in the order of ``fingerprints``."""
    fingerprints: tuple[str, ...]
    """Each rank's parameter fingerprint, 16 hex digits."""
    culprit_ranks: tuple[int, ...]
    """Culprits (``majority``) or suspects (no majority)."""
    majority: bool
    explanation: str
    source: str = "optimizer"
    """``script`` (trainguard.attach() steps) or ``optimizer`` (automatic hooks)."""

    def to_json(self) -> dict[str, Any]:
        return {"format": _FORMAT, **asdict(self), "ranks": list(self.ranks),
                "fingerprints": list(self.fingerprints), "culprit_ranks": list(self.culprit_ranks)}

    def encode(self) -> bytes:
        return (json.dumps(self.to_json(), sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: Any) -> SdcMarker:
        """Validated marker; `ValueError` naming the bad field otherwise."""
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError("not a trainguard SDC marker")

        def integer(key: str) -> int:
            v = data.get(key)
            if not in_range(v, 0, (1 << 62) - 1, integer=True):
                raise ValueError(f"field {key!r}: expected a non-negative integer")
            return int(v)

        def number(key: str) -> float:
            v = data.get(key)
            if not is_number(v):
                raise ValueError(f"field {key!r}: expected a finite number")
            return float(v)

        def ints(key: str) -> tuple[int, ...]:
            v = data.get(key)
            if not isinstance(v, list) or len(v) > 1 << 20 or not all(
                    in_range(x, 0, (1 << 31) - 1, integer=True) for x in v):
                raise ValueError(f"field {key!r}: expected a list of ranks")
            return tuple(v)

        fps = data.get("fingerprints")
        if not isinstance(fps, list) or not all(isinstance(x, str) and len(x) <= 16 for x in fps):
            raise ValueError("field 'fingerprints': expected a list of hex strings")
        text = data.get("explanation", "")
        source = data.get("source", "optimizer")
        if not isinstance(text, str) or not isinstance(source, str) or not isinstance(data.get("majority"), bool):
            raise ValueError("fields 'explanation', 'source', 'majority': wrong type")
        return cls(attempt=integer("attempt"), step=integer("step"), last_clean_step=integer("last_clean_step"),
                   last_clean_time=number("last_clean_time"), time=number("time"), ranks=ints("ranks"),
                   fingerprints=tuple(fps), culprit_ranks=ints("culprit_ranks"), majority=data["majority"],
                   explanation=text[:2000], source=source[:32])


def marker_path(run_dir: Path, attempt: int) -> Path:
    return run_dir / MARKER_DIR / f"detected-attempt-{attempt}.json"


def read_marker(path: Path) -> SdcMarker | None:
    """The marker at ``path``; None when absent, unreadable or malformed (the caller logs nothing twice)."""
    try:
        raw = path.read_bytes()[: 1 << 20]
        return SdcMarker.from_json(json.loads(raw))
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class RollbackPlan:
    """Which checkpoints a restart after corruption may resume from."""

    resume_step: int | None
    """Newest checkpoint at or before the last clean step; None: none, the job starts over."""
    set_aside: tuple[int, ...]
    """Checkpoints newer than the last clean step: they may hold corrupted state, newest first."""


def rollback_plan(committed: Iterable[int], last_clean_step: int) -> RollbackPlan:
    """Keep only checkpoints taken no later than the last clean check; everything newer goes aside."""
    steps = sorted(set(committed), reverse=True)
    newer = tuple(s for s in steps if s > last_clean_step)
    older = [s for s in steps if s <= last_clean_step]
    return RollbackPlan(older[0] if older else None, newer)


@dataclass(frozen=True)
class ExclusionDecision:
    """Whether this node leaves the job at the restart because one of its ranks corrupted parameters."""

    exclude: bool
    reason: str
    """Why (excluded) or why not (kept); empty when this node hosts no culprit."""


def exclusion_decision(marker: SdcMarker, rank_nodes: dict[int, str], node: str, max_nodes: int) -> ExclusionDecision:
    """Exclude this node when it hosts a culprit named by a majority and the job has other nodes to go on.

    Without a majority nobody is excluded (the suspects include healthy ranks); a job whose only node
    is the culprit's keeps it (excluding it would end the job), which the reason says.
    """
    mine = [r for r in marker.culprit_ranks if rank_nodes.get(r, node) == node]
    if not mine:
        return ExclusionDecision(False, "")
    what = (f"sdc: rank{'s' if len(mine) > 1 else ''} {_list(mine)} on node {node} disagreed with the other "
            f"replicas after step {marker.step}")
    if not marker.majority:
        return ExclusionDecision(False, f"{what}; not excluded: no majority, the culprit is unknown")
    if max_nodes <= 1:
        return ExclusionDecision(False, f"{what}; not excluded: it is the job's only node (drain it after the job)")
    return ExclusionDecision(True, what)
