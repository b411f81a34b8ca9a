"""Evidence gathering before anything is killed, and the culprit of a hang.

Every live local rank is asked (in parallel, over its control socket) to write its flight-recorder
dump and all threads' stacks into ``diagnostics/attempt-<k>/``; the agent adds each rank's log tail.
The culprit comes from `trainguard.localize.diagnose_path` when that package is present, else from a
simple rule: the rank(s) whose flight recorder enqueued fewer collectives than the others (they never
reached the collective the rest are blocked in), else the rank(s) with the fewest completed steps.
"""

from __future__ import annotations

import logging
import pickle
import signal
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.worker.control import request

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 200


@dataclass
class Evidence:
    """What was gathered for one failure."""

    directory: Path
    files: list[str] = field(default_factory=list)
    """Paths relative to the run directory."""
    replies: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Control-thread reply per rank (includes its step and phase)."""
    unreachable: list[int] = field(default_factory=list)


def _tail(path: Path, lines: int) -> str:
    try:
        data = path.read_bytes()[-256 * 1024 :]
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def gather(
    run_root: Path,
    directory: Path,
    live: dict[int, int],
    logs: dict[int, list[Path]],
    *,
    timeout_seconds: float = 10.0,
) -> Evidence:
    """``live``: rank -> pid of processes still running; ``logs``: rank -> its log files."""
    directory.mkdir(parents=True, exist_ok=True)
    ev = Evidence(directory)

    def ask(item: tuple[int, int]) -> tuple[int, dict[str, Any] | None]:
        rank, pid = item
        try:
            return rank, request(pid, {"cmd": "dump", "dir": str(directory)}, timeout_seconds)
        except (OSError, ValueError) as exc:
            log.warning("rank %d (pid %d) gave no evidence: %s", rank, pid, exc)
            return rank, None

    if live:
        with ThreadPoolExecutor(max_workers=min(16, len(live))) as pool:
            for rank, reply in pool.map(ask, sorted(live.items())):
                if reply is None:
                    ev.unreachable.append(rank)
                else:
                    ev.replies[rank] = reply
    for rank, paths in sorted(logs.items()):
        text = "".join(f"==> {p.name} <==\n{_tail(p, LOG_TAIL_LINES)}\n" for p in paths if p.exists())
        (directory / f"log_tail_rank_{rank}.txt").write_text(text)
    for p in sorted(directory.iterdir()):
        if not p.name.startswith("."):
            ev.files.append(str(p.relative_to(run_root)))
    return ev


def enqueued_per_rank(directory: Path) -> dict[int, int]:
    """Collectives enqueued on the default group per rank, read from the pickled dumps."""
    out: dict[int, int] = {}
    for path in directory.glob("fr_trace_rank_*.pkl"):
        try:
            rank = int(path.stem.rsplit("_", 1)[1])
            data = pickle.loads(path.read_bytes())
            status = data.get("pg_status", {})
            seqs = [int(v.get("last_enqueued_collective", -1)) for v in status.values() if isinstance(v, dict)]
            if "0" in status and isinstance(status["0"], dict):
                seqs = [int(status["0"].get("last_enqueued_collective", -1))]
            out[rank] = max(seqs) if seqs else -1
        except Exception as exc:
            log.warning("cannot read %s: %s", path, exc)
    return out


def crash_culprits(exit_codes: dict[int, int]) -> tuple[list[int], str]:
    """Culprit ranks and failure kind from the exit codes of the ranks that ended.

    Ranks killed by a signal are the cause; ranks exiting with an error may only be its echo. Among
    signalled ranks, SIGABRT is itself usually an echo: gloo and NCCL processes abort (std::terminate)
    when a peer's connection resets, so a rank that died of another signal is preferred.
    """
    failed = sorted(exit_codes)
    signalled = [r for r in failed if exit_codes[r] < 0]
    primary = [r for r in signalled if exit_codes[r] != -signal.SIGABRT]
    return (primary or signalled or failed), ("crash" if signalled else "exit")


def simple_culprits(directory: Path, steps: dict[int, int], world_size: int) -> tuple[list[int], str]:
    """The rank(s) behind the others; ``steps`` = last completed step per rank known to the agent."""
    enq = enqueued_per_rank(directory)
    missing = sorted(set(range(world_size)) - set(enq)) if world_size else []
    if enq and max(enq.values()) > min(enq.values()):
        top = max(enq.values())
        behind = sorted(r for r, s in enq.items() if s < top)
        return behind, f"rank(s) {behind} enqueued fewer collectives than the others ({top})"
    if enq and missing and len(enq) + len(missing) == world_size:
        return missing, f"rank(s) {missing} gave no dump while the others wait in collective {max(enq.values())}"
    if steps and max(steps.values()) > min(steps.values()):
        low = min(steps.values())
        behind = sorted(r for r, s in steps.items() if s == low)
        return behind, f"rank(s) {behind} completed fewer steps ({low}) than the others"
    return [], "no rank is behind the others"


def localize(directory: Path, rank_hosts: dict[int, str]) -> dict[str, Any] | None:
    """The localization verdict on the gathered dumps, or None when localization itself fails."""
    from trainguard.localize import diagnose_path

    try:
        report = diagnose_path(directory, rank_hosts)
    except Exception as exc:
        log.warning("localization failed: %s", exc)
        return None
    return {
        "verdict": str(report.verdict),
        "culprit_ranks": [int(r) for r in report.culprit_ranks],
        "culprit_hosts": [str(h) for h in report.culprit_hosts],
        "explanation": str(report.explanation),
    }
