"""A rank whose training is over but whose process does not end: found, written down, ended, counted as finished.

torch's own teardown can deadlock: a gloo process group freed from Python (the last reference held by DDP's
reducer, say) joins its worker threads while holding the GIL, and a worker thread freeing the last collective's
tensors waits for the GIL (pytorch/pytorch#56297). The rank had printed its last line and destroyed its group;
under torchrun the job never ends. The watchdog gives a rank in phase ``done`` the checkpoint allowance; a
hang verdict on such ranks, once every other rank of this node has ended with exit code 0, is not a training
hang: nothing is left to do in those processes, so the agent writes what the kernel shows of them, ends them
and counts them as finished (the attempt completes; no restart is spent).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from trainguard.core.protocol import Heartbeat
from trainguard.core.safefs import write_private

log = logging.getLogger(__name__)

EVIDENCE_NAME = "teardown_rank_{rank}.txt"


def stuck_in_teardown(ranks: Sequence[int], beats: Mapping[int, Heartbeat | None], local: Iterable[int],
                      finished: set[int]) -> tuple[int, ...]:
    """``ranks`` (a hang verdict's) when each of them said its training is over (heartbeat phase ``done``) and
    every other rank of this node already ended with exit code 0; else ``()``."""
    if not ranks:
        return ()
    for rank in ranks:
        beat = beats.get(rank)
        if beat is None or beat.phase != "done":
            return ()
    if not set(local) - set(ranks) <= finished:
        return ()
    return tuple(sorted(ranks))


def _threads(pid: int) -> str:
    """One line per thread: id, name, kernel state and wait channel (a frozen process cannot answer for itself)."""
    lines = []
    with contextlib.suppress(OSError):
        for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            base = f"/proc/{pid}/task/{tid}"
            fields = []
            for name in ("comm", "wchan"):
                try:
                    fields.append(Path(base, name).read_text().strip() or "-")
                except OSError:
                    fields.append("?")
            try:
                state = Path(base, "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                state = "?"
            lines.append(f"thread {tid} {fields[0]!r} state {state} wchan {fields[1]}")
    return "\n".join(lines)


def end(rank: int, pid: int, beat: Heartbeat | None, now_mono: float, folder: Path) -> str:
    """Write what is known of ``rank`` (process ``pid``) to ``folder``, then SIGKILL it. Returns the evidence
    file's name (empty when it could not be written)."""
    done_for = now_mono - beat.phase_start_mono if beat is not None else 0.0
    silent_for = now_mono - beat.alive_mono if beat is not None and beat.alive_mono > 0 else 0.0
    text = (f"rank {rank} (pid {pid}) finished its training {done_for:.1f}s ago (heartbeat phase done) and its "
            f"process did not end; its background thread last wrote {silent_for:.1f}s ago (a frozen interpreter: "
            "no Python stacks from it). Ended with SIGKILL and counted as finished.\n"
            f"{_threads(pid)}\n")
    name = EVIDENCE_NAME.format(rank=rank)
    try:
        write_private(folder / name, text.encode())
    except OSError as exc:
        log.warning("no teardown evidence for rank %d (%s)", rank, exc)
        name = ""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return name


def end_frozen(ranks: Sequence[int], pids: Mapping[int, int], beats: Mapping[int, Heartbeat | None],
               now_mono: float, folder: Path) -> set[int]:
    """`end` each of ``ranks`` that has a process (``pids``: global rank -> pid), saying so on the console;
    returns the ranks ended."""
    ended = set()
    for rank in ranks:
        pid = pids.get(rank)
        if pid is None:
            continue
        name = end(rank, pid, beats.get(rank), now_mono, folder)
        ended.add(rank)
        log.warning("rank %d finished its training but its process did not end (frozen in teardown: torch's own "
                    "shutdown can deadlock); ended it and counted it as finished%s", rank,
                    f"; see {folder / name}" if name else "")
    return ended
