"""Hand-built event streams with hand-computed goodput answers (the test corpus).

Each builder returns the records (all times relative to T0) and the expected buckets. Times are
chosen so every answer can be checked with pencil and paper; the comments show the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.core.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointLoaded,
    CheckpointSaveFinished,
    CheckpointSaveStarted,
    Diagnosis,
    Event,
    FailureDetected,
    RunEnded,
    RunStarted,
    StepCompleted,
)

T0 = 1_700_000_000.0


@dataclass(frozen=True)
class Case:
    name: str
    writers: dict[str, list[Event]]
    """Records per event file (writer name)."""
    expected: dict[str, float]
    """productive and every badput bucket, seconds (missing buckets are 0)."""
    wall: float


def _steps(attempt: int, first: int, start: float, n: int, ranks: range, host: str = "h0",
           skew: float = 0.0, length: float = 1.0) -> list[Event]:
    out: list[Event] = []
    for i in range(n):
        for r in ranks:
            out.append(StepCompleted(time=T0 + start + (i + 1) * length + skew, host=host, attempt=attempt, rank=r,
                                     step=first + i, duration_seconds=length, loss=1.0 / (first + i)))
    return out


def _save(attempt: int, step: int, start: float, blocking: float, total: float, ranks: range,
          host: str = "h0", skew: float = 0.0, tier: str = "") -> list[Event]:
    out: list[Event] = []
    for r in ranks:
        out.append(CheckpointSaveStarted(time=T0 + start + skew, host=host, attempt=attempt, rank=r, step=step,
                                         tier=tier))
        out.append(CheckpointSaveFinished(time=T0 + start + total + skew, host=host, attempt=attempt, rank=r,
                                          step=step, blocking_seconds=blocking, total_seconds=total, bytes=1000,
                                          tier=tier))
    return out


def clean_run() -> Case:
    # startup [0,2]; steps 1-5 [2,7]; save blocks [7,7.5]; steps 6-10 [7.5,12.5]; other [12.5,13]
    ranks = range(2)
    agent: list[Event] = [
        RunStarted(time=T0, host="h0", run_id="clean", world_size=2, target_steps=10),
        AttemptStarted(time=T0, host="h0", attempt=0, world_size=2, hosts=("h0",)),
        AttemptEnded(time=T0 + 12.8, host="h0", attempt=0, reason="completed", exit_code=0),
        RunEnded(time=T0 + 13, host="h0", run_id="clean", status="completed"),
    ]
    ranks_ev = _steps(0, 1, 2, 5, ranks) + _save(0, 5, 7, 0.5, 0.5, ranks) + _steps(0, 6, 7.5, 5, ranks)
    return Case("clean", {"agent-h0": agent, "ranks": ranks_ev},
                {"productive": 10, "startup": 2, "checkpoint_save": 0.5, "other": 0.5}, 13)


def crash_mid_step() -> Case:
    # attempt 0: startup [0,1]; steps 1-4 [1,5]; save of step 4 blocks [5,5.5] (async, total 2 s);
    # steps 5-6 [5.5,7.5]; crash during step 7 at 8.0, detected 8.1 (latency 0.1).
    # lost = [5.5, 8.0] = 2.5; detection 0.1; restart [8.1, 9.0] = 0.9.
    # attempt 1 starts 9.0; restore [10,11]; startup [9,10] = 1; steps 5-10 [11,17]; other [17,17.5].
    ranks = range(2)
    agent: list[Event] = [
        RunStarted(time=T0, host="h0", run_id="crash", world_size=2, target_steps=10),
        AttemptStarted(time=T0, host="h0", attempt=0, world_size=2, hosts=("h0",)),
        FailureDetected(time=T0 + 8.1, host="h0", attempt=0, kind="crash", ranks=(1,), hosts=("h0",),
                        detection_latency_seconds=0.1, step=6),
        Diagnosis(time=T0 + 8.5, host="h0", attempt=0, category="Faulty GPU", group="GPU", culprit_ranks=(1,),
                  culprit_hosts=("h0",), confidence=0.9,
                  evidence=("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",)),
        AttemptEnded(time=T0 + 8.6, host="h0", attempt=0, reason="failure", exit_code=-9),
        AttemptStarted(time=T0 + 9, host="h0", attempt=1, world_size=2, hosts=("h0",), resume_step=4),
        AttemptEnded(time=T0 + 17.2, host="h0", attempt=1, reason="completed", exit_code=0),
        RunEnded(time=T0 + 17.5, host="h0", run_id="crash", status="completed"),
    ]
    ranks_ev = (
        _steps(0, 1, 1, 4, ranks) + _save(0, 4, 5, 0.5, 2.0, ranks) + _steps(0, 5, 5.5, 2, ranks)
        + [CheckpointLoaded(time=T0 + 11, host="h0", attempt=1, rank=r, step=4, seconds=1.0) for r in ranks]
        + _steps(1, 5, 11, 6, ranks)
    )
    return Case("crash_mid_step", {"agent-h0": agent, "ranks": ranks_ev},
                {"productive": 10, "startup": 2, "checkpoint_save": 0.5, "lost_progress": 2.5, "detection": 0.1,
                 "restart": 0.9, "checkpoint_restore": 1.0, "other": 0.5}, 17.5)


def restart_before_first_checkpoint() -> Case:
    # attempt 0: startup [0,1]; steps 1-3 [1,4]; hang onset 4.0 (last progress), detected 9.0 (latency 5).
    # all 3 steps are redone: lost [1,4] = 3; detection [4,9] = 5; restart [9,10] = 1.
    # attempt 1: startup [10,11]; steps 1-5 [11,16]; run end 16.
    ranks = range(2)
    agent: list[Event] = [
        RunStarted(time=T0, host="h0", run_id="nockpt", world_size=2, target_steps=5),
        AttemptStarted(time=T0, host="h0", attempt=0, world_size=2, hosts=("h0",)),
        FailureDetected(time=T0 + 9, host="h0", attempt=0, kind="hang", ranks=(0,), detection_latency_seconds=5.0),
        AttemptEnded(time=T0 + 9.5, host="h0", attempt=0, reason="failure"),
        AttemptStarted(time=T0 + 10, host="h0", attempt=1, world_size=2, hosts=("h0",)),
        RunEnded(time=T0 + 16, host="h0", run_id="nockpt", status="completed"),
    ]
    ranks_ev = _steps(0, 1, 1, 3, ranks) + _steps(1, 1, 11, 5, ranks)
    return Case("restart_before_first_checkpoint", {"agent-h0": agent, "ranks": ranks_ev},
                {"productive": 5, "startup": 2, "lost_progress": 3, "detection": 5, "restart": 1}, 16)


def async_checkpoint_overlap() -> Case:
    # steps of 1 s from 1; step 3's save runs inside step 4 (the user saves in the step): it blocks
    # [4, 4.2] and finishes in the background at 7.0, overlapping steps 4-6. Only the 0.2 s block is
    # badput: productive = 6 - 0.2 = 5.8; startup [0,1]; other [7,7.5].
    ranks = range(2)
    agent: list[Event] = [
        RunStarted(time=T0, host="h0", run_id="async", world_size=2),
        AttemptStarted(time=T0, host="h0", attempt=0, world_size=2, hosts=("h0",)),
        RunEnded(time=T0 + 7.5, host="h0", run_id="async", status="completed"),
    ]
    ranks_ev = _steps(0, 1, 1, 6, ranks) + _save(0, 3, 4, 0.2, 3.0, ranks)
    return Case("async_checkpoint_overlap", {"agent-h0": agent, "ranks": ranks_ev},
                {"productive": 5.8, "startup": 1, "checkpoint_save": 0.2, "other": 0.5}, 7.5)


def skewed_hosts() -> Case:
    # crash_mid_step on two hosts: ranks 0-1 on h0 (reference), ranks 2-3 on h1 whose clock runs
    # 120 s ahead, and h1's agent too. Same answers as crash_mid_step once the skew is corrected.
    base = crash_mid_step()
    skew = 120.0
    h1: list[Event] = (
        _steps(0, 1, 1, 4, range(2, 4), "h1", skew) + _save(0, 4, 5, 0.5, 2.0, range(2, 4), "h1", skew)
        + _steps(0, 5, 5.5, 2, range(2, 4), "h1", skew)
        + [CheckpointLoaded(time=T0 + 11 + skew, host="h1", attempt=1, rank=r, step=4, seconds=1.0) for r in (2, 3)]
        + _steps(1, 5, 11, 6, range(2, 4), "h1", skew)
    )
    writers = dict(base.writers)
    writers["ranks-h1"] = h1
    return Case("skewed_hosts", writers, base.expected, base.wall)


def memory_tier_restore() -> Case:
    # attempt 0: startup [0,1]; steps 1-4 [1,5]; step 4 saved to storage (async: blocks [5,5.5], durable at
    # 8.0) and then copied to memory (blocks [5.5,6.0], replicated at 6.5); steps 5-6 [6,8]; step 6 copied
    # to memory only (blocks [8,8.5]); step 7 [8.5,9.5]; crash during step 8 at 10.0, detected 10.1.
    # The agent names storage's step 4 as the resume point, but the restart restores step 6 from memory
    # [12,12.5] and trains steps 7-10 [12.5,16.5]: only step 7 and the part of step 8 are lost, [8.5,10].
    # saves 3 x 0.5 (the storage save's start is its own, not the memory copy's of the same step);
    # detection 0.1; restart [10.1,11] = 0.9; startup [0,1] + [11,12]; restore 0.5; other [16.5,17].
    ranks = range(2)
    agent: list[Event] = [
        RunStarted(time=T0, host="h0", run_id="memory", world_size=2, target_steps=10),
        AttemptStarted(time=T0, host="h0", attempt=0, world_size=2, hosts=("h0",)),
        FailureDetected(time=T0 + 10.1, host="h0", attempt=0, kind="crash", ranks=(1,), hosts=("h0",),
                        detection_latency_seconds=0.1, step=7),
        AttemptEnded(time=T0 + 10.5, host="h0", attempt=0, reason="failure", exit_code=1),
        AttemptStarted(time=T0 + 11, host="h0", attempt=1, world_size=2, hosts=("h0",), resume_step=4),
        RunEnded(time=T0 + 17, host="h0", run_id="memory", status="completed"),
    ]
    ranks_ev = (
        _steps(0, 1, 1, 4, ranks) + _save(0, 4, 5, 0.5, 3.0, ranks) + _save(0, 4, 5.5, 0.5, 1.0, ranks, tier="memory")
        + _steps(0, 5, 6, 2, ranks) + _save(0, 6, 8, 0.5, 1.0, ranks, tier="memory") + _steps(0, 7, 8.5, 1, ranks)
        + [CheckpointLoaded(time=T0 + 12.5, host="h0", attempt=1, rank=r, step=6, seconds=0.5, path="memory:own",
                            tier="memory") for r in ranks]
        + _steps(1, 7, 12.5, 4, ranks)
    )
    return Case("memory_tier_restore", {"agent-h0": agent, "ranks": ranks_ev},
                {"productive": 10, "startup": 2, "checkpoint_save": 1.5, "lost_progress": 1.5, "detection": 0.1,
                 "restart": 0.9, "checkpoint_restore": 0.5, "other": 0.5}, 17)


CASES = [clean_run, crash_mid_step, restart_before_first_checkpoint, async_checkpoint_overlap, skewed_hosts,
         memory_tier_restore]
