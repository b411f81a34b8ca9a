"""Hang detection from heartbeat records (`trainguard.core.protocol.Heartbeat`): pure logic, monotonic time only.

The agent hands `Watchdog.check` each rank's latest heartbeat and ``time.monotonic()``; nothing here reads a
clock, so a step of the wall clock can neither fake a hang nor hide one. How a rank is judged depends on
where its progress signal comes from (``Heartbeat.source``):

The timeout is learned from the job's step intervals (`trainguard.launch.hang_timeout`): the longest recent
interval times ``multiplier``, never below ``floor_seconds``. A rank that is alive and outside any collective
(it computes, saves, evaluates: its background thread writes, nothing of it is pending) is *busy*: whatever
waits for it is given at least ``busy_allowance_seconds``, since a rank-0 checkpoint save or evaluation the
others wait for looks the same as a stuck loop. A rank stopped or frozen (its background thread stopped
writing for ``alive_stale_seconds``) or waiting in a collective gets only the timeout.

* ``script`` (``trainguard.attach()`` steps): a rank is hung when no step of its own ended for longer than
  the timeout (the busy allowance while some rank is busy); ``first_step_allowance_seconds`` from the attempt's
  start before its first step; at least ``checkpoint_allowance_seconds`` from the start of a ``checkpoint``
  phase (or ``save``: inside any other save call, an export; or ``done``: the rank finished and waits for the
  others).
* ``optimizer`` (automatic optimizer-step hooks in an unmodified script): a hang is a *wait*. The job is
  hung only when nothing progressed (no step ended and no collective completed on any such rank) for
  longer than the timeout AND some rank has waited in a collective for longer than it, or some rank's
  background thread stopped writing (the process is stopped or frozen); while a rank is busy, not before
  the busy allowance. A long validation or data phase without collectives is therefore never called a hang.
* a rank the kernel shows frozen (`trainguard.launch.frozen`: its heartbeat thread missed a write and, for a
  second, no thread of it could run, none waited on I/O and it used no CPU) cannot resume by itself: once the job
  has stepped it is hung at once, without the timeout or the busy allowance (the first-step and phase allowances
  still apply). A stopped or fully deadlocked rank is found in about 2.5 s instead of the floor's 4 s or more.
* once a rank of the attempt has finished (exit code 0), the others are tearing down: a rank that went silent
  or stopped stepping then (interpreter shutdown, a teardown that holds the GIL) is not called hung before
  ``checkpoint_allowance_seconds`` from that finish. A rank left *waiting* in a collective (alive, something
  pending) is still a hang at the timeout: the finished peer will never join it.
* ``none`` (no signal): watched for crashes only as long as no rank of the run ever sent a signal; once
  some attempt did, a rank of a later attempt that has not sent one yet gets the first-step allowance.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from trainguard.core.numeric import in_range, is_number
from trainguard.core.protocol import Heartbeat
from trainguard.launch.hang_timeout import StepIntervals, TimeoutModel
from trainguard.launch.settings import Flag, setting

log = logging.getLogger(__name__)

_ALLOWANCE_PHASES = ("checkpoint", "save", "done")
"""Phases given ``checkpoint_allowance_seconds``: a checkpoint, any other save in progress
(`trainguard.worker.ckpt_io.SAVE_PHASE`: the launcher does not import the worker), a finished rank."""


@dataclass(frozen=True)
class WatchdogConfig:
    """How the agent decides a job is hung."""

    floor_seconds: float = setting(4.0, section="detection", flag=Flag(
        ("--hang-floor",), "never call a hang sooner than this after the last step", metavar="SECONDS", shared=True))
    """Never call a hang sooner than this after the last progress. 1.5 s (1.7x the longest healthy step interval
    recorded under load) called false hangs in the suite beside a CPU burner (a finished rank's exit, a restart's
    first steps): the floor stays 4 s until those paths are told apart (docs/decisions.md)."""
    multiplier: float = setting(3.0, section="detection", flag=Flag(
        ("--hang-multiplier",), "hang timeout = this x the longest recent step interval, if above the floor",
        shared=True))
    """Hang timeout = multiplier x the longest of the recent step intervals (if above the floor)."""
    busy_allowance_seconds: float = setting(4.0, section="detection", flag=Flag(
        ("--busy-allowance",), "time given to a rank that works outside any collective while others wait",
        metavar="SECONDS", shared=True))
    """A rank alive and outside any collective (a save, an evaluation, a stuck loop: they look alike) is not
    called hung before this much time without progress; also the least timeout until ``warmup_samples`` step
    intervals are known."""
    first_step_allowance_seconds: float = setting(120.0, section="detection", flag=Flag(
        ("--first-step-allowance",), "time allowed from a (re)start to the first step", metavar="SECONDS",
        shared=True))
    """Time from an attempt's start to its first completed step (startup and restore)."""
    checkpoint_allowance_seconds: float = setting(120.0, section="detection", flag=Flag(
        ("--checkpoint-allowance",), "time allowed inside a checkpoint phase", metavar="SECONDS", shared=True))
    """Time allowed inside a checkpoint phase."""
    samples: int = 200
    """Step intervals remembered (kept across attempts); the longest of them sets the timeout."""
    warmup_samples: int = 5
    """Until this many step intervals are known, the timeout is at least ``busy_allowance_seconds``."""
    alive_stale_seconds: float = 5.0
    """A rank whose background thread has not written for this long is stopped or frozen (it writes every
    second: `trainguard.worker.runtime.TICK_SECONDS`)."""

    def __post_init__(self) -> None:
        for name in ("floor_seconds", "multiplier", "busy_allowance_seconds", "first_step_allowance_seconds",
                     "checkpoint_allowance_seconds", "alive_stale_seconds"):
            value = getattr(self, name)
            # `not (0 < x < 1e6)` also refuses NaN, which would make every comparison false (never a hang).
            if not (is_number(value) and 0 < value < 1e6):
                raise ValueError(f"{name} must be a positive number below 1e6, got {value!r}")
        if not in_range(self.samples, 1, 100_000, integer=True):
            raise ValueError(f"samples must be a whole number from 1 to 100000, got {self.samples!r}")
        if not in_range(self.warmup_samples, 0, 100_000, integer=True):
            raise ValueError(f"warmup_samples must be a whole number from 0 to 100000, got {self.warmup_samples!r}")

    def max_timeout_seconds(self) -> float:
        """The longest the watchdog can wait: the process-group timeout must exceed this."""
        return max(self.first_step_allowance_seconds, self.checkpoint_allowance_seconds, self.floor_seconds,
                   self.busy_allowance_seconds)

    def timeout_model(self) -> TimeoutModel:
        return TimeoutModel(floor_seconds=self.floor_seconds, multiplier=self.multiplier, samples=self.samples,
                            warmup_samples=self.warmup_samples, warmup_seconds=self.busy_allowance_seconds)


@dataclass(frozen=True)
class Verdict:
    """A hang the watchdog found."""

    ranks: tuple[int, ...]
    """Ranks past their deadline (for a wait: the stale ranks, else every rank watched)."""
    onset_mono: float
    """Monotonic time of the job's last progress over the ranks watched; latency is measured from it."""
    timeout_seconds: float
    """The learned timeout in force when the hang was declared (the busy allowance if that applied)."""
    last_steps: dict[int, int]
    """Last completed step per rank watched."""
    reason: str
    """One line: what stopped, for how long."""
    stale_ranks: tuple[int, ...] = ()
    """Ranks whose background thread stopped writing (process stopped or frozen)."""
    waiting_ranks: tuple[int, ...] = ()
    """Ranks waiting in a collective for longer than the timeout."""


@dataclass
class _RankTrack:
    """What the watchdog remembers of one rank within an attempt."""

    steps_done: int = 0
    progress_mono: float = 0.0
    """End of the rank's last step seen (0: none in this attempt)."""
    collectives_done: int = 0
    collective_progress_mono: float = 0.0
    """When a rise of ``collectives_done`` was first seen (0: never in this attempt)."""


class Watchdog:
    """Feeds on heartbeat snapshots; `check` says whether the job is hung now."""

    def __init__(self, config: WatchdogConfig) -> None:
        self.config = config
        self.intervals = StepIntervals(config.timeout_model())
        self._tracks: dict[int, _RankTrack] = {}
        self.attempt_start_mono = 0.0
        self.teardown_mono: float | None = None
        """When a rank of this attempt was first seen finished (None: none yet)."""
        self.signal_seen = False
        """Whether any rank of the run has sent a progress signal in any attempt so far."""
        self._frozen: frozenset[int] = frozenset()
        """Ranks the kernel shows frozen at this check (`trainguard.launch.frozen`)."""
        self._warned_no_signal = False

    def new_attempt(self, start_mono: float) -> None:
        self.attempt_start_mono = start_mono
        self.teardown_mono = None
        self._tracks = {}

    def longest_step_seconds(self) -> float | None:
        """The longest recent step interval (None before any)."""
        return self.intervals.longest()

    def timeout_seconds(self) -> float:
        return self.intervals.timeout()

    def _observe(self, rank: int, beat: Heartbeat, now: float) -> None:
        track = self._tracks.setdefault(rank, _RankTrack())
        if beat.steps_done > track.steps_done:
            done = beat.steps_done - track.steps_done
            if track.steps_done > 0:
                # Step end to step end, on the rank's own clock; steps ended between two reads share the gap,
                # the last one's own length being known.
                gap = (beat.progress_mono - track.progress_mono) / done
                self.intervals.add(max(gap, beat.duration_seconds))
            else:
                # The attempt's first step seen: the time before it is start-up (the first-step allowance's),
                # not a step interval; the step's own length is.
                self.intervals.add(beat.duration_seconds)
            track.steps_done = beat.steps_done
            track.progress_mono = beat.progress_mono
        if beat.collectives_done > track.collectives_done:
            # The record carries no completion time: the poll that first sees the rise dates it (<= 0.1 s late).
            track.collective_progress_mono = now
            track.collectives_done = beat.collectives_done
        if beat.has_progress_signal:
            self.signal_seen = True

    def check(self, beats: Mapping[int, Heartbeat | None], now: float, *, finished: int = 0,
              frozen: Collection[int] = ()) -> Verdict | None:
        """``beats``: latest heartbeat per watched rank (None = not written yet); ``now``: ``time.monotonic()``;
        ``finished``: how many ranks of the attempt already ended with exit code 0 (left out of ``beats``);
        ``frozen``: ranks whose process the kernel shows frozen (`trainguard.launch.frozen.FrozenWatch`): they
        cannot resume by themselves, so once the job has stepped they are hung without waiting out the timeout
        (the first-step and phase allowances still apply)."""
        self._frozen = frozenset(frozen)
        if finished and self.teardown_mono is None:
            self.teardown_mono = now
        if not beats:
            return None
        # Heartbeat folders are per attempt, so every record read belongs to this attempt.
        current = {r: b for r, b in beats.items() if b is not None}
        for rank, beat in current.items():
            self._observe(rank, beat, now)
        by_source: dict[str, list[int]] = {"none": [], "script": [], "optimizer": []}
        for rank in beats:
            by_source[current[rank].source if rank in current else "none"].append(rank)
        if not self.signal_seen:
            self._maybe_warn_no_signal(sorted(beats), now)
            return None
        last_steps = {r: (current[r].step if r in current else 0) for r in beats}
        timeout = self.timeout_seconds()
        late, progress = self._late_steps(by_source["none"], by_source["script"], current, now, timeout)
        wait: Verdict | None = None
        if by_source["optimizer"]:
            wait = self._check_wait({r: current[r] for r in by_source["optimizer"]}, now, timeout, last_steps)
            if wait is not None:
                progress.append(wait.onset_mono)
            else:
                progress.extend(self._wait_progress(r, current[r]) for r in by_source["optimizer"])
        if not late and wait is None:
            return None
        onset = max(progress) if progress else self.attempt_start_mono
        ranks = sorted(set(late) | set(wait.ranks if wait is not None else ()))
        reasons = []
        if late:
            reasons.append(f"rank(s) {sorted(late)} completed no step for {now - onset:.1f}s "
                           f"(timeout {timeout:.1f}s)")
        if wait is not None:
            reasons.append(wait.reason)
        if wait is not None:
            timeout = max(timeout, wait.timeout_seconds)  # the busy allowance, where it applied
        return Verdict(
            ranks=tuple(ranks), onset_mono=onset, timeout_seconds=timeout, last_steps=last_steps,
            reason="; ".join(reasons), stale_ranks=wait.stale_ranks if wait is not None else (),
            waiting_ranks=wait.waiting_ranks if wait is not None else (),
        )

    def _late_steps(self, silent: list[int], scripted: list[int], current: Mapping[int, Heartbeat], now: float,
                    timeout: float) -> tuple[list[int], list[float]]:
        """(late ranks, last progress per rank) of the ranks with no heartbeat yet (``silent``) and of those
        that count their steps through ``trainguard.attach()`` (``scripted``)."""
        late: list[int] = []
        progress: list[float] = []
        for rank in silent:
            progress.append(self.attempt_start_mono)
            if now > self._first_step_deadline(current.get(rank)):
                late.append(rank)
        # A rank at work (a save, an evaluation) keeps the ranks that wait for it from being late before the
        # busy allowance: the waiting ones are in a collective, the busy one is alive.
        if any(self._busy(r, current[r], now) for r in scripted):
            timeout = max(timeout, self.config.busy_allowance_seconds)
        for rank in scripted:
            last, deadline = self._script_deadline(current[rank], 0.0 if rank in self._frozen else timeout)
            if self._tearing_down(now) and not self._waits(rank, current[rank], now):
                deadline = max(deadline, (self.teardown_mono or now) + self.config.checkpoint_allowance_seconds)
            progress.append(last)
            if now > deadline:
                late.append(rank)
        return late, progress

    # --- the rules ------------------------------------------------------------------------------

    def _first_step_deadline(self, beat: Heartbeat | None) -> float:
        deadline = self.attempt_start_mono + self.config.first_step_allowance_seconds
        if beat is not None and beat.phase in _ALLOWANCE_PHASES:
            deadline = max(deadline, beat.phase_start_mono + self.config.checkpoint_allowance_seconds)
        return deadline

    def _tearing_down(self, now: float) -> bool:
        """A rank of the attempt finished less than the checkpoint allowance ago."""
        return self.teardown_mono is not None and now <= self.teardown_mono + self.config.checkpoint_allowance_seconds

    def _alive(self, rank: int, beat: Heartbeat, now: float) -> bool:
        """Its background thread writes (it wrote within ``alive_stale_seconds``) and the kernel does not show it
        frozen."""
        return (beat.alive_mono > 0 and now - beat.alive_mono <= self.config.alive_stale_seconds
                and rank not in self._frozen)

    def _waits(self, rank: int, beat: Heartbeat, now: float) -> bool:
        """Alive and inside a collective."""
        return self._alive(rank, beat, now) and beat.pending_since_mono > 0

    def _busy(self, rank: int, beat: Heartbeat, now: float) -> bool:
        """Alive and in no collective: the rank works on something."""
        return self._alive(rank, beat, now) and beat.pending_since_mono <= 0

    def _script_deadline(self, beat: Heartbeat, timeout: float) -> tuple[float, float]:
        """(last progress, deadline) of a rank that counts its steps through ``trainguard.attach()``."""
        if beat.steps_done == 0:
            return self.attempt_start_mono, self._first_step_deadline(beat)
        deadline = beat.progress_mono + timeout
        if beat.phase in _ALLOWANCE_PHASES:
            deadline = max(deadline, beat.phase_start_mono + self.config.checkpoint_allowance_seconds)
        return beat.progress_mono, deadline

    def _wait_progress(self, rank: int, beat: Heartbeat) -> float:
        """Last progress of an automatically watched rank: a step end or a completed collective."""
        track = self._tracks.get(rank, _RankTrack())
        last = self.attempt_start_mono
        if beat.steps_done > 0:
            last = max(last, beat.progress_mono)
        return max(last, track.collective_progress_mono)

    def _check_wait(self, beats: Mapping[int, Heartbeat], now: float, timeout: float,
                    last_steps: dict[int, int]) -> Verdict | None:
        """The job-level rule for ranks watched through optimizer hooks and the flight recorder."""
        onset = max(self._wait_progress(r, b) for r, b in beats.items())
        frozen = [] if self._tearing_down(now) else sorted(self._frozen.intersection(beats))
        deadline = onset + (0.0 if frozen else timeout)
        if not any(b.steps_done > 0 for b in beats.values()):
            deadline = max(deadline, self.attempt_start_mono + self.config.first_step_allowance_seconds)
        for beat in beats.values():
            if beat.phase in _ALLOWANCE_PHASES:
                deadline = max(deadline, beat.phase_start_mono + self.config.checkpoint_allowance_seconds)
        if now <= deadline:
            return None
        silent = sorted(r for r, b in beats.items() if b.alive_mono > 0 and not self._alive(r, b, now))
        # A peer finished: silence is the interpreter's shutdown (a rank that really waits still writes).
        stale = [] if self._tearing_down(now) else silent
        # A silent rank's last heartbeat tells what it did before it went quiet, not that it waits now.
        waiting = sorted(r for r, b in beats.items()
                         if r not in silent and b.pending_since_mono > 0 and now - b.pending_since_mono > timeout)
        if not waiting and not stale:
            return None  # nothing waits: a long phase without collectives (validation, data), not a hang
        # A frozen rank will never join: whoever else is at work cannot make the job progress without it.
        busy = [] if frozen else [r for r, b in beats.items() if r not in stale and self._busy(r, b, now)]
        if busy:
            if now <= onset + self.config.busy_allowance_seconds:
                return None  # the others wait for a rank at work (a rank-0 save, an evaluation): give it time
            timeout = max(timeout, self.config.busy_allowance_seconds)
        parts = [f"no step or collective completed for {now - onset:.1f}s (timeout {timeout:.1f}s)"]
        if waiting:
            longest = max(now - beats[r].pending_since_mono for r in waiting)
            parts.append(f"rank(s) {waiting} waiting in a collective (longest {longest:.1f}s)")
        if stale:
            parts.append(f"rank(s) {stale} stopped writing heartbeats (process stopped or frozen)")
        if frozen and stale:
            parts.append(f"the kernel shows rank(s) {frozen} frozen (no thread able to run, none waiting on I/O, "
                         "no CPU used)")
        if busy:
            parts.append(f"rank(s) {busy} at work outside any collective (given the busy allowance)")
        return Verdict(
            ranks=tuple(stale or sorted(beats)), onset_mono=onset, timeout_seconds=timeout,
            last_steps={r: last_steps.get(r, 0) for r in beats}, reason=", ".join(parts),
            stale_ranks=tuple(stale), waiting_ranks=tuple(waiting),
        )

    def _maybe_warn_no_signal(self, ranks: list[int], now: float) -> None:
        """One warning per run, once a hang could have been declared had the ranks sent a signal."""
        if self._warned_no_signal or now <= self.attempt_start_mono + self.config.first_step_allowance_seconds:
            return
        self._warned_no_signal = True
        log.warning(
            "rank(s) %s send no progress signal (no trainguard.attach() step and no optimizer step seen for "
            "%.0fs): they are watched for crashes only and hangs will not be detected",
            ranks, self.config.first_step_allowance_seconds,
        )
