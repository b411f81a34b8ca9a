"""A rank whose training is over but whose process does not end, or dies in its teardown: found, written down,
counted as finished.

torch's own teardown can deadlock: a gloo process group freed from Python (the last reference held by DDP's
reducer, say) joins its worker threads while holding the GIL, and a worker thread freeing the last collective's
tensors waits for the GIL (pytorch/pytorch#56297). The rank had printed its last line and destroyed its group;
under torchrun the job never ends. The watchdog gives a rank in phase ``done`` the checkpoint allowance; a
hang verdict on such ranks, once every other rank of this node has ended with exit code 0, is not a training
hang: nothing is left to do in those processes, so the agent writes what the kernel shows of them, ends them
and counts them as finished (the attempt completes; no restart is spent). The allowance exists for a rank that
writes its last files after training; a deadlocked rank is told apart sooner by what the kernel counts
(`IdleWatch`): its heartbeat thread silent, its main thread using no CPU and no thread in an I/O wait for
``QUIET_SECONDS``.

The same teardown can also crash: a script that never destroyed its group leaves torch's C++ objects to the
interpreter's exit, where a CI run's Hugging Face rank printed its last line, then died with "terminate called
without an active exception" (SIGABRT). torchrun restarts the whole job for it. A rank that dies by a crash signal
after its heartbeat said ``done`` (its script returned, or it destroyed its group) is counted as finished too.
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
from trainguard.launch.frozen import ProcessSample, QuietWatch

log = logging.getLogger(__name__)

EVIDENCE_NAME = "teardown_rank_{rank}.txt"
CRASH_SIGNALS = (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE)
"""How a process's own code dies. Not SIGKILL or SIGTERM: those come from outside (an operator, the OOM killer,
this agent), and say nothing about where the process was."""
QUIET_SECONDS = 10.0
"""A process whose main thread used not one clock tick (10 ms) of CPU in this long, with no thread in an I/O wait,
and whose heartbeat thread is silent, is not finishing anything: the deadlock leaves the main thread asleep holding
the GIL. (Its other threads still use CPU: Python threads waiting for the GIL wake every 5 ms, gloo's loop polls.)
An interpreter's own shutdown uses the main thread's CPU; twice the heartbeat's silence limit leaves room for a
short wait at exit."""


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


class IdleWatch(QuietWatch):
    """Ranks whose process's main thread used no CPU for ``quiet_seconds``, with no thread in an I/O wait."""

    def __init__(self, quiet_seconds: float = QUIET_SECONDS) -> None:
        super().__init__(quiet_seconds)

    def ticks(self, seen: ProcessSample) -> int | None:
        return None if "D" in seen.states else seen.main_ticks


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


def _write_evidence(folder: Path, rank: int, text: str) -> str:
    """``teardown_rank_<rank>.txt`` in ``folder``; its name, or empty when it could not be written."""
    name = EVIDENCE_NAME.format(rank=rank)
    try:
        write_private(folder / name, text.encode())
    except OSError as exc:
        log.warning("no teardown evidence for rank %d (%s)", rank, exc)
        return ""
    return name


def end(rank: int, pid: int, beat: Heartbeat | None, now_mono: float, folder: Path, idle_seconds: float = 0.0) -> str:
    """Write what is known of ``rank`` (process ``pid``) to ``folder``, then SIGKILL it. Returns the evidence
    file's name (empty when it could not be written)."""
    done_for = now_mono - beat.phase_start_mono if beat is not None else 0.0
    silent_for = now_mono - beat.alive_mono if beat is not None and beat.alive_mono > 0 else 0.0
    idle = (f"; its main thread used no CPU for {idle_seconds:.1f}s with no thread waiting on I/O"
            if idle_seconds else "")
    text = (f"rank {rank} (pid {pid}) finished its training {done_for:.1f}s ago (heartbeat phase done) and its "
            f"process did not end; its background thread last wrote {silent_for:.1f}s ago (a frozen interpreter: "
            f"no Python stacks from it){idle}. Ended with SIGKILL and counted as finished.\n"
            f"{_threads(pid)}\n")
    name = _write_evidence(folder, rank, text)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return name


def end_frozen(ranks: Sequence[int], pids: Mapping[int, int], beats: Mapping[int, Heartbeat | None],
               now_mono: float, folder: Path, idle: Mapping[int, float] | None = None) -> set[int]:
    """`end` each of ``ranks`` that has a process (``pids``: global rank -> pid), saying so on the console;
    returns the ranks ended. ``idle``: rank -> seconds without CPU, where that is what gave it away."""
    ended = set()
    for rank in ranks:
        pid = pids.get(rank)
        if pid is None:
            continue
        name = end(rank, pid, beats.get(rank), now_mono, folder, (idle or {}).get(rank, 0.0))
        ended.add(rank)
        log.warning("rank %d finished its training but its process did not end (frozen in teardown: torch's own "
                    "shutdown can deadlock); ended it and counted it as finished%s", rank,
                    f"; see {folder / name}" if name else "")
    return ended


def crashed_after_done(codes: Mapping[int, int], beats: Mapping[int, Heartbeat | None]) -> dict[int, int]:
    """Of the ranks that exited (``codes``: global rank -> exit code), those killed by a crash signal after their
    heartbeat said ``done``: their training was over, the crash is in the interpreter's or torch's teardown."""
    crash_codes = {-int(sig) for sig in CRASH_SIGNALS}
    return {rank: code for rank, code in codes.items()
            if code in crash_codes and (beat := beats.get(rank)) is not None and beat.phase == "done"}


def note_crashed(crashed: Mapping[int, int], beats: Mapping[int, Heartbeat | None], now_mono: float,
                 folder: Path) -> set[int]:
    """Write down each rank of ``crashed`` (`crashed_after_done`) and say so on the console; returns the ranks."""
    for rank, code in sorted(crashed.items()):
        beat = beats.get(rank)
        done_for = now_mono - beat.phase_start_mono if beat is not None else 0.0
        sig = signal.Signals(-code).name
        text = (f"rank {rank} finished its training {done_for:.1f}s before its process died by {sig} in its "
                "teardown (heartbeat phase done: its script had returned or destroyed its process group). Counted "
                "as finished; a script that ends with torch.distributed.destroy_process_group() leaves less to "
                "the interpreter's exit.\n")
        name = _write_evidence(folder, rank, text)
        log.warning("rank %d finished its training, then its process died by %s in its teardown; counted it as "
                    "finished%s", rank, sig, f"; see {folder / name}" if name else "")
    return set(crashed)
