"""Evidence gathering before anything is killed, and reading it back for blame and localization.

Every live local rank is asked (in parallel, over its control socket) to write its flight-recorder dump and
all threads' stacks into the attempt's diagnostics folder (the worker knows the folder from its start-up
environment); the agent adds each rank's log tail. A stopped process is not asked (it cannot answer) but
noted, since a stopped rank is itself a culprit signal. Dumps are read back through
`trainguard.localize`'s reader, which only unpickles plain data.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.core.protocol import rank_of
from trainguard.core.safefs import make_dirs, write_private
from trainguard.launch.blame import backend_of, default_group_collectives, is_stopped
from trainguard.localize.observed import PROCESS_STATE_FILE

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 200
REQUEST_TIMEOUT_SECONDS = 4.0
"""How long a rank's control thread gets to write its dump (a cold first dump costs ~2 s)."""


@dataclass
class GatheredEvidence:
    """What was gathered for one failure."""

    directory: Path
    """The attempt's diagnostics folder."""
    files: list[str] = field(default_factory=list)
    """Paths relative to the run directory."""
    replies: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Control-thread reply per rank (``ok``, ``files``, ``step``, ``steps_done``, ``phase``)."""
    unanswered: list[int] = field(default_factory=list)
    """Live ranks whose control thread took too long or failed to answer."""
    no_channel: list[int] = field(default_factory=list)
    """Ranks without a control thread (nothing listens on their socket)."""
    stopped: list[int] = field(default_factory=list)
    """Ranks whose process was stopped (state T/t) when the evidence was gathered; not asked."""


@dataclass(frozen=True)
class DumpSummary:
    """What the agent's blame rule needs from the dumps of one attempt."""

    enqueued: dict[int, int]
    """Collectives enqueued on the default group per rank."""
    unreadable: dict[int, str]
    """Ranks whose dump could not be read, with the reason."""
    backend: str | None
    """Backend named by the dumps' entries (``gloo``, ``nccl``), None when no entry says."""


def proc_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (``R``, ``S``, ``T``, ...); None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            data = fh.read()
    except OSError:
        return None
    rest = data[data.rfind(")") + 1:].split()  # the command name may hold spaces and parentheses
    return rest[0] if rest else None


TAIL_BYTES = 256 * 1024
"""At most this much of a log's end is read for its tail (a log can be gigabytes)."""


def log_tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of ``path`` (within its last `TAIL_BYTES`); "" when it cannot be read. A log
    rotated at ``--max-log-mb`` moments ago continues in its ``<file>.1`` (`trainguard.launch.output`)."""
    data = b""
    for part in (path, path.with_name(path.name + ".1")):
        try:
            with part.open("rb") as f:
                f.seek(0, 2)
                size = f.tell()
                want = TAIL_BYTES - len(data)
                f.seek(max(0, size - want))
                data = f.read(want) + data
        except OSError:
            if part == path:
                return ""
            break
        if len(data) >= TAIL_BYTES or data.count(b"\n") > lines:
            break
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def gather(
    run_root: Path,
    directory: Path,
    live: Mapping[int, int],
    logs: Mapping[int, list[Path]],
    *,
    timeout_seconds: float = REQUEST_TIMEOUT_SECONDS,
) -> GatheredEvidence:
    """``live``: rank -> pid of processes still running; ``logs``: rank -> its log files."""
    make_dirs(directory)
    ev = GatheredEvidence(directory)
    ask: dict[int, int] = {}
    for rank, pid in sorted(live.items()):
        if is_stopped(proc_state(pid)):
            ev.stopped.append(rank)
        else:
            ask[rank] = pid
    _ask_for_dumps(ev, ask, timeout_seconds)
    for rank, paths in sorted(logs.items()):
        text = "".join(f"==> {p.name} <==\n{log_tail(p, LOG_TAIL_LINES)}\n" for p in paths if p.exists())
        write_private(directory / f"log_tail_rank_{rank}.txt", text.encode())
    # What the supervisor saw of each live rank, for `trainguard diagnose` on this folder later: a rank
    # without a dump whose process was stopped or silent is a hang's culprit, not a dead process.
    seen = {"stopped": sorted(ev.stopped), "unanswered": sorted(ev.unanswered), "answered": sorted(ev.replies)}
    write_private(directory / PROCESS_STATE_FILE, json.dumps(seen).encode())
    for p in sorted(directory.iterdir()):
        if not p.name.startswith("."):
            ev.files.append(str(p.relative_to(run_root)))
    return ev


def _ask_for_dumps(ev: GatheredEvidence, ask: Mapping[int, int], timeout_seconds: float) -> None:
    """Ask the ranks of ``ask`` (rank -> pid) for their dumps at once; note in ``ev`` how each answered."""
    from trainguard.worker.control import request_all

    for rank, reply in request_all(ask, {"cmd": "dump"}, timeout_seconds).items():
        if isinstance(reply, dict):  # it answered, even if it could not dump: not frozen
            if not reply.get("ok", True):
                log.warning("rank %d wrote no evidence: %s", rank, reply.get("error", "no reason given"))
            ev.replies[rank] = reply
        elif isinstance(reply, (ConnectionRefusedError, FileNotFoundError)):
            ev.no_channel.append(rank)  # no control thread listens: the script runs without trainguard's worker side
        elif isinstance(reply, ValueError):  # a malformed answer says nothing about the rank: not even "frozen"
            log.warning("rank %d (pid %d) gave a malformed answer, ignored: %s", rank, ask[rank], reply)
        else:
            log.warning("rank %d (pid %d) gave no evidence: %s", rank, ask[rank], reply)
            ev.unanswered.append(rank)


def read_dumps(directory: Path) -> DumpSummary:
    """Summarise the ``fr_trace_rank_<r>.pkl`` dumps in ``directory`` (restricted unpickling, never code)."""
    from trainguard.localize import DumpError, read_dump

    enqueued: dict[int, int] = {}
    unreadable: dict[int, str] = {}
    backend: str | None = None
    for path in sorted(directory.glob("fr_trace_rank_*.pkl")):
        rank = rank_of(path.name, "fr_trace_rank_", ".pkl")
        if rank is None:
            continue
        try:
            dump = read_dump(path, rank)
        except DumpError as exc:
            unreadable[rank] = str(exc)
            continue
        enqueued[rank] = default_group_collectives(dump.entries, dump.pg_status)
        backend = backend or backend_of(dump.entries)
    return DumpSummary(enqueued, unreadable, backend)


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
