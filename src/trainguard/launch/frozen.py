"""Ranks the kernel shows frozen: their heartbeat thread missed a write, and for a while none of their threads
could run, none waited on I/O and the process used no CPU at all.

The watchdog alone must wait out its floor before it calls a silent rank hung, because a heartbeat thread can be
late for harmless reasons: starved of CPU on a busy machine, or waiting for the GIL while the main thread computes.
The kernel tells those apart from a frozen process. A starved thread is runnable (state ``R``); a computing one
uses CPU; a thread waiting on storage is in ``D``. A process stopped by a signal (``T``), or one all of whose
threads sleep on a lock nobody will release, shows none of that, and cannot resume by itself: waiting for the
floor only adds latency. What is read is `/proc/<pid>/stat` (the whole process's CPU clock ticks) and each
thread's state letter, a few small reads per silent rank per poll.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SILENT_SECONDS = 1.5
"""A rank's heartbeat older than this missed a write (its background thread writes every second:
`trainguard.worker.runtime.TICK_SECONDS`); only such ranks are looked at."""
CONFIRM_SECONDS = 1.0
"""How long a silent rank must show no runnable thread, no I/O wait and no CPU used to be called frozen: ten
polls at the agent's 0.1 s interval, and a hundred chances for one of a live process's threads to be seen
running or to add a clock tick (10 ms)."""


@dataclass(frozen=True)
class ProcessSample:
    """What the kernel shows of one process at one instant."""

    ticks: int
    """CPU clock ticks used by all its threads (user + system)."""
    main_ticks: int
    """Those of its main thread alone."""
    states: str
    """Each thread's state letter (proc(5): ``R`` running, ``S`` asleep, ``D`` I/O wait, ``T`` stopped...)."""

    @property
    def still(self) -> bool:
        """No thread runnable or in an I/O wait, and the process is not exiting (a zombie, ``Z``, waits only for
        its parent to collect its exit: an exit, not a freeze)."""
        return not any(s in "RDZX" for s in self.states)


def sample(pid: int) -> ProcessSample | None:
    """The process ``pid`` now; None when it is gone or cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5), all threads
        tids = os.listdir(f"/proc/{pid}/task")
    except (OSError, IndexError, ValueError):
        return None
    states = []
    main_ticks = -1
    for tid in tids:
        with contextlib.suppress(OSError, IndexError, ValueError):  # a thread that ended between the two reads
            thread = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            states.append(thread[0])
            if tid == str(pid):
                main_ticks = int(thread[11]) + int(thread[12])
    return ProcessSample(ticks, main_ticks, "".join(states)) if main_ticks >= 0 else None


class QuietWatch:
    """Per rank, since when a CPU-tick count of its process has not moved while the process qualified (one instance
    per attempt). `FrozenWatch` and `trainguard.launch.teardown.IdleWatch` differ only in the count they read and
    in what disqualifies a process."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._marks: dict[int, tuple[int, int, float]] = {}  # rank -> (pid, ticks, quiet since)

    def ticks(self, seen: ProcessSample) -> int | None:
        """The count that must not move; None when ``seen`` does not qualify (it starts over)."""
        raise NotImplementedError

    def since(self, pids: Mapping[int, int], now_mono: float) -> dict[int, float]:
        """Of ``pids`` (rank -> pid, the ranks to look at now), rank -> seconds quiet, for those quiet at least
        ``seconds``. A rank left out, not qualifying, or whose count moved starts over."""
        marks: dict[int, tuple[int, int, float]] = {}
        out: dict[int, float] = {}
        for rank, pid in pids.items():
            seen = sample(pid)
            ticks = None if seen is None else self.ticks(seen)
            if ticks is None:
                continue
            mark = self._marks.get(rank)
            if mark is None or mark[:2] != (pid, ticks):
                mark = (pid, ticks, now_mono)
            marks[rank] = mark
            if now_mono - mark[2] >= self.seconds:
                out[rank] = now_mono - mark[2]
        self._marks = marks
        return out


class FrozenWatch(QuietWatch):
    """Silent ranks still for ``confirm_seconds``: no thread runnable or in an I/O wait, not exiting, and no CPU
    used by any thread."""

    def __init__(self, confirm_seconds: float = CONFIRM_SECONDS) -> None:
        super().__init__(confirm_seconds)

    def ticks(self, seen: ProcessSample) -> int | None:
        return seen.ticks if seen.still else None
