"""Straggler detection (pure): which rank holds a synchronous job back, since when, and what it costs.

In a synchronous step every rank waits for the slowest one, so step times alone look the same on all
ranks. What differs is each rank's *own* time before it joins the step's collective: from the phases of
`trainguard.attach()` (step time minus ``comm_wait``) or, for unmodified scripts, from flight-recorder
enqueue times (the rank that enters the collective last). See docs/stragglers.md.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.core.clocks import estimate_offsets, reference_host
from trainguard.core.events import Event, StepCompleted

log = logging.getLogger(__name__)

PHASES = "phases"
FLIGHT_RECORDER = "flight-recorder"
DURATIONS = "durations-only"
_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


@dataclass(frozen=True)
class StragglerConfig:
    """Detection thresholds (defaults tuned so 1.3x is named within about 40 steps and clean runs flag nothing,
    on a quiet host and on a 2-core host with a CPU burner beside the job)."""

    window_steps: int = 8
    """Steps per detection window."""
    windows: int = 5
    """Consecutive windows judged together (the span); the rank must be late in each of them (persistence).
    Five, not two: on a contended host the scheduler deschedules one rank, then another, in bursts of up to
    ~30 steps, and two windows named both ranks of a healthy 2-rank job in turn (docs/stragglers.md)."""
    late_fraction: float = 0.75
    """A rank is named when it was late in at least this share of the span's steps ..."""
    window_fraction: float = 0.5
    """... and in at least this share of every window of the span (one burst of noise never names a rank) ..."""
    noise_sigmas: float = 1.5
    """... and its median lead over the span exceeds this many standard errors of the step-to-step noise."""
    min_slowdown: float = 1.08
    """A step is late for a rank that held it back by at least this slowdown (1.08: 8% of the step time)."""
    min_lead_seconds: float = 0.0005
    """Whatever its share of the step, a rank is named only when its median lead over the others exceeds this.
    On tiny steps one rank's own bookkeeping is a large share: a clean 2-rank CPU demo at load 8.5 (3 ms steps)
    had rank 0 named at 1.13x for 0.35 ms of its extra work a step. No fault worth acting on costs a GPU job
    under half a millisecond a step; a 1.3x rank of the same demo leads by ~0.9 ms and is still named."""
    steady_min_slowdown: float = 1.15
    """A rank slow from the attempt's start (no onset: `trainguard.stragglers.steady`) is named when its median lead
    over its peers makes it at least this much slower than them. Above ``min_slowdown``: a healthy 2-rank job on a
    contended host showed one rank 1.07x behind the other over 600 steps."""
    steady_noise_sigmas: float = 3.0
    """... and its median lead over all the steps so far exceeds this many standard errors of the noise (stricter
    than ``noise_sigmas``: the rule is tried at every step of every rank from the start) ..."""
    steady_settled_sigmas: float = 2.0
    """... or this many, over a prefix of more than ``steady_windows`` windows: the noise itself is then estimated
    from enough steps that its own error no longer needs the stricter bar (at load 6-9 the 3-sigma bar held a
    1.3x rank back until step 74-102 of a 3-rank demo; this one named it by step 48, and no healthy run more)."""
    steady_windows: int = 3
    """Windows a rank slow from the start must be seen for before it is named (3 x 8: named by step 25)."""

    def __post_init__(self) -> None:
        if self.window_steps < 2 or self.windows < 1 or self.steady_windows < 1:
            raise ValueError("window_steps must be >= 2, windows and steady_windows >= 1")
        if self.steady_min_slowdown < 1:
            raise ValueError("steady_min_slowdown must be >= 1")
        if not (0 <= self.steady_settled_sigmas <= self.steady_noise_sigmas):
            raise ValueError("steady_settled_sigmas must be from 0 to steady_noise_sigmas")
        if not (0 < self.late_fraction <= 1 and 0 <= self.window_fraction <= 1) or self.noise_sigmas < 0 \
                or self.min_slowdown < 1:
            raise ValueError("late_fraction in (0, 1], window_fraction in [0, 1], noise_sigmas >= 0, min_slowdown >= 1")


@dataclass(frozen=True)
class StepSample:
    """One step of one attempt as all its ranks saw it."""

    attempt: int
    step: int
    end_time: float
    """Step end on the reference clock (latest rank)."""
    step_seconds: float
    """Job step time: median of the ranks' step durations."""
    own: dict[int, float]
    """Rank -> when it was ready for the step's gating collective, in seconds on a per-step scale shared by the
    ranks: minus ``comm_wait`` (phases) or the collective's enqueue time (flight recorder)."""


@dataclass(frozen=True)
class Straggler:
    """One rank found holding the job back."""

    rank: int
    """The slow rank."""
    host: str
    """Its host (node id)."""
    attempt: int
    """Attempt in which it was found (the first, if several)."""
    onset_step: int
    """First step of its slow stretch."""
    detected_step: int
    """Step at which the persistence rule named it."""
    last_step: int
    """Last step of its slow stretch."""
    steps: int
    """Steps in the slow stretch."""
    slowdown: float
    """Median over the stretch of job step time with the rank / without it."""
    lead_seconds: float
    """Median over the stretch of how much later than the others the rank was ready."""
    cost_seconds: float
    """What-if: job time the stretch would have taken less without this rank (sum of per-step savings)."""
    step_seconds: float
    """Median job step time over the stretch."""
    step_seconds_without: float
    """Median job step time over the stretch without this rank."""
    signal: str
    """``phases`` or ``flight-recorder``."""
    saved_by_step: tuple[tuple[int, int, float, float], ...] = ()
    """(attempt, step, step end time, seconds saved) of every step of the stretch (for goodput's bucket)."""

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "slowdown": self.slowdown, "cost_seconds": self.cost_seconds,
                "attempt": self.attempt, "onset_step": self.onset_step, "detected_step": self.detected_step,
                "last_step": self.last_step, "steps": self.steps, "lead_seconds": self.lead_seconds,
                "step_seconds": self.step_seconds, "step_seconds_without": self.step_seconds_without,
                "signal": self.signal}


@dataclass(frozen=True)
class HostSummary:
    """Straggler findings of one host: all its ranks slow points at the host (power, cooling, clocks)."""

    host: str
    """Host (node id)."""
    ranks: tuple[int, ...]
    """Ranks seen on it."""
    slow_ranks: tuple[int, ...]
    """Those named stragglers."""
    cost_seconds: float
    """Sum of its stragglers' costs."""

    @property
    def whole_host(self) -> bool:
        """Every rank of the host is slow: a host problem rather than one GPU or process."""
        return bool(self.slow_ranks) and set(self.slow_ranks) == set(self.ranks)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "ranks": list(self.ranks), "slow_ranks": list(self.slow_ranks),
                "whole_host": self.whole_host, "cost_seconds": self.cost_seconds}


@dataclass(frozen=True)
class StragglerReport:
    """Everything `trainguard stragglers` says about a run."""

    stragglers: list[Straggler]
    """Named ranks, largest cost first."""
    hosts: list[HostSummary]
    """Per host, hosts with stragglers first."""
    signals: dict[int, str]
    """Attempt -> the evidence available: ``phases``, ``flight-recorder`` or ``durations-only``."""
    steps_analysed: int
    """Steps with every rank's record (first step of each attempt excluded)."""
    ranks: int
    """Distinct ranks seen."""
    step_seconds: float
    """Median job step time over the analysed steps."""
    job_step_seconds: float
    """Sum of the job step times of the analysed steps."""
    notes: list[str] = field(default_factory=list)
    """What could not be judged and why, one line each."""

    def to_json(self) -> dict[str, Any]:
        return {
            "stragglers": [s.to_json() for s in self.stragglers],
            "step_time_seconds": self.step_seconds,
            "step_time_without": {str(s.rank): s.step_seconds_without for s in self.stragglers},
            "job_step_seconds": self.job_step_seconds,
            "job_step_seconds_without": {str(s.rank): self.job_step_seconds - s.cost_seconds
                                         for s in self.stragglers},
            "hosts": [h.to_json() for h in self.hosts],
            "signals": {str(a): s for a, s in sorted(self.signals.items())},
            "steps_analysed": self.steps_analysed,
            "ranks": self.ranks,
            "notes": list(self.notes),
        }


# --- building the per-step table ------------------------------------------------------------------


def _own_work(e: StepCompleted) -> float | None:
    """How late the rank was ready for the step's collective, up to a constant shared by all ranks: minus its
    ``comm_wait``. In a synchronous step everyone leaves the collective together, so the rank that arrived last
    waited least, whether its delay was inside the timed step (slow compute) or before it (a slow data loader
    outside ``tg.step``, a pause between steps). None without a ``comm_wait`` phase."""
    if "comm_wait" not in e.phases:
        return None
    return -e.phases["comm_wait"]


def step_table(records: Sequence[Event], arrivals: Mapping[int, Mapping[int, Sequence[float]]] | None = None,
               tails: dict[int, list[StepSample]] | None = None,
               ) -> tuple[list[StepSample], dict[int, str], dict[int, str]]:
    """Per-step samples, the signal of each attempt and the host of each rank.

    ``tails`` (filled when given): attempt -> steps after the last one the flight-recorder timings cover
    (their ``own`` is empty); the probes sample the recorder now and then, so a run's last steps often have
    step durations only.

    ``arrivals``: attempt -> rank -> wall-clock enqueue times (seconds) of that rank's collectives on the
    default group, in sequence order (`trainguard.stragglers.flight`); used where phases are missing.
    """
    steps: dict[int, list[StepCompleted]] = defaultdict(list)
    hosts: dict[int, str] = {}
    for e in records:
        if isinstance(e, StepCompleted):
            steps[e.attempt].append(e)
            hosts[e.rank] = e.host
    offsets = estimate_offsets(list(records), reference_host(list(records))) if records else {}
    samples: list[StepSample] = []
    signals: dict[int, str] = {}
    for attempt, rows in sorted(steps.items()):
        ranks, complete = _complete_steps(rows)
        with_phases = sum(all(_own_work(e) is not None for e in by.values()) for by in complete.values())
        if len(ranks) < 2:
            signals[attempt] = DURATIONS
            continue
        if complete and with_phases >= len(complete) / 2:
            signals[attempt] = PHASES
            for s, by in sorted(complete.items()):
                own = {r: _own_work(e) for r, e in by.items()}
                if any(v is None for v in own.values()):
                    continue
                samples.append(StepSample(attempt, s, max(e.time - offsets.get(e.host, 0.0) for e in by.values()),
                                          statistics.median(e.duration_seconds for e in by.values()),
                                          {r: float(v) for r, v in own.items() if v is not None}))
            continue
        arr = (arrivals or {}).get(attempt, {})
        if len(arr) >= 2 and set(arr) >= ranks:
            signals[attempt] = FLIGHT_RECORDER
            got = _flight_samples(attempt, complete, arr, hosts, offsets)
            samples.extend(got)
            if tails is not None and got:
                tails[attempt] = [
                    StepSample(attempt, s, max(e.time - offsets.get(e.host, 0.0) for e in by.values()),
                               statistics.median(e.duration_seconds for e in by.values()), {})
                    for s, by in sorted(complete.items()) if s > got[-1].step]
            continue
        signals[attempt] = DURATIONS
    return samples, signals, hosts


def _complete_steps(rows: list[StepCompleted]) -> tuple[set[int], dict[int, dict[int, StepCompleted]]]:
    """The ranks of one attempt and its steps every rank completed, each rank's first step left out (start-up,
    not pace)."""
    ranks = {e.rank for e in rows}
    by_step: dict[int, dict[int, StepCompleted]] = defaultdict(dict)
    for e in rows:
        by_step[e.step][e.rank] = e
    first: dict[int, int] = {}  # one pass: a scan per rank made reports quadratic in the rank count
    for e in rows:
        if e.step < first.get(e.rank, e.step + 1):
            first[e.rank] = e.step
    return ranks, {s: by for s, by in by_step.items() if set(by) == ranks and all(s > first[r] for r in ranks)}


def _flight_samples(attempt: int, complete: Mapping[int, Mapping[int, StepCompleted]],
                    arrivals: Mapping[int, Sequence[float]], hosts: Mapping[int, str],
                    offsets: Mapping[str, float]) -> list[StepSample]:
    """Per step: each rank's arrival at the step's last collective (the one that gates the step's end)."""
    ranks = sorted(arrivals)
    n = min(len(arrivals[r]) for r in ranks)
    lead = ranks[0]
    corrected = {r: [t - offsets.get(hosts.get(r, ""), 0.0) for t in arrivals[r][:n]] for r in ranks}
    out: list[StepSample] = []
    order = sorted(complete)
    # Collectives carry sequence numbers, not steps: place each in the lead rank's step interval.
    j = 0
    for s in order:
        by = complete[s]
        e = by.get(lead)
        if e is None:
            continue
        end = e.time - offsets.get(e.host, 0.0)
        start = end - e.duration_seconds
        last: int | None = None
        while j < n and corrected[lead][j] <= end:
            if corrected[lead][j] >= start:
                last = j
            j += 1
        if last is None:
            continue
        out.append(StepSample(attempt, s, end, statistics.median(x.duration_seconds for x in by.values()),
                              {r: corrected[r][last] for r in ranks}))
    return out


# --- detection ------------------------------------------------------------------------------------


def _lead(own: Mapping[int, float], rank: int) -> tuple[float, float]:
    """(rank's lead over the median of the others, seconds the step would save without the rank)."""
    others = [v for r, v in own.items() if r != rank]
    x = own[rank]
    return x - statistics.median(others), max(0.0, x - max(others))


def _leads(own: Mapping[int, float]) -> dict[int, tuple[float, float]]:
    """`_lead` of every rank of one step in O(n log n): the others' median and maximum come from one sorted list."""
    vals = sorted(own.values())
    n = len(vals)
    out = {}
    for r, x in own.items():
        i = bisect.bisect_left(vals, x)  # drop one occurrence of x: the others are vals without index i

        def at(k: int, i: int = i) -> float:
            return vals[k + 1] if k >= i else vals[k]

        m = n - 1
        med = at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2
        top = vals[-1] if i != n - 1 else vals[-2]
        out[r] = (x - med, max(0.0, x - top))
    return out


def _median(values: Iterable[float]) -> float:
    v = list(values)
    return statistics.median(v) if v else 0.0


def analyze(records: Sequence[Event], arrivals: Mapping[int, Mapping[int, Sequence[float]]] | None = None,
            config: StragglerConfig | None = None, from_start: bool = True) -> StragglerReport:
    """Find the ranks that hold the job back (docs/stragglers.md has the rules).

    ``from_start``: the records hold each attempt from its first step (a whole run, or a live buffer that has not
    dropped any step yet), so a rank slow since the start can be judged against its peers over all of them."""
    cfg = config or StragglerConfig()
    tails: dict[int, list[StepSample]] = {}
    samples, signals, hosts = step_table(records, arrivals, tails)
    notes: list[str] = []
    for a, sig in sorted(signals.items()):
        if sig == DURATIONS:
            notes.append(f"attempt {a}: only step durations (no comm_wait phase, no flight-recorder timings): "
                         "every rank of a synchronous step shows the same time, so a slow rank cannot be named")
    by_attempt: dict[int, list[StepSample]] = defaultdict(list)
    for s in samples:
        by_attempt[s.attempt].append(s)
    found: list[Straggler] = []
    for attempt, rows in sorted(by_attempt.items()):
        found.extend(_detect(attempt, rows, hosts, signals[attempt], cfg, tails.get(attempt, []), from_start))
    found = merge_ranks(found)
    host_ranks: dict[str, set[int]] = defaultdict(set)
    for r, h in hosts.items():
        host_ranks[h].add(r)
    host_list = []
    for h, rs in host_ranks.items():
        slow = sorted({s.rank for s in found if s.host == h})
        host_list.append(HostSummary(h, tuple(sorted(rs)), tuple(slow),
                                     sum(s.cost_seconds for s in found if s.host == h)))
    host_list.sort(key=lambda x: (-x.cost_seconds, x.host))
    if not samples and not notes:
        notes.append("no step with every rank's record: nothing to compare")
    return StragglerReport(found, host_list, signals, len(samples), len(hosts),
                           _median(s.step_seconds for s in samples), sum(s.step_seconds for s in samples), notes)


def _host_peer_late(rank: int, stretch: range, late: Sequence[Mapping[int, bool]], hosts: Mapping[int, str],
                    cfg: StragglerConfig) -> bool:
    """Whether another rank of ``rank``'s host was late in most steps of the stretch too (a slow host)."""
    host = hosts.get(rank)
    if not host:
        return False
    peers = [p for p, h in hosts.items() if h == host and p != rank]
    return any(sum(late[k].get(p, False) for k in stretch) >= cfg.late_fraction * len(stretch) for p in peers)


def _slow_rows(n: int, ranks: list[int], lead: list[dict[int, tuple[float, float]]], late: list[dict[int, bool]],
               cfg: StragglerConfig) -> list[dict[int, bool]]:
    """slow[i][r]: over the span of steps ending at row i, rank r was late often enough, in every window, and its
    median lead stands out of the noise (standard error of a median: 1.25 sigma / sqrt(n)) and exceeds
    ``min_lead_seconds``."""
    w, span = cfg.window_steps, cfg.window_steps * cfg.windows
    slow: list[dict[int, bool]] = []
    for i in range(n):
        if i + 1 < span:
            slow.append(dict.fromkeys(ranks, False))
            continue
        steps = range(i - span + 1, i + 1)
        bar = max(cfg.noise_sigmas * 1.2533 * _pooled_sigma(ranks, lead, steps) / math.sqrt(span),
                  cfg.min_lead_seconds)
        row: dict[int, bool] = {}
        for r in ranks:
            flags = [late[k].get(r, False) for k in steps]
            row[r] = (sum(flags) >= cfg.late_fraction * span
                      and all(sum(flags[j:j + w]) >= cfg.window_fraction * w for j in range(0, span, w))
                      and _median(lead[k][r][0] for k in steps if r in lead[k]) > bar)
        slow.append(row)
    return slow


def _pooled_sigma(ranks: list[int], lead: list[dict[int, tuple[float, float]]], steps: range) -> float:
    """The lead's noise over ``steps``, pooled over ranks (median of the ranks' sigmas)."""
    sigmas = []
    for r in ranks:
        xs = [lead[k][r][0] for k in steps if r in lead[k]]
        if len(xs) >= 3:
            # Noise from successive differences: a span that straddles the onset of a slowdown holds two
            # levels, whose spread would otherwise read as noise and hide the very change sought.
            diffs = [b - a for a, b in itertools.pairwise(xs)]
            sigmas.append(_MAD_TO_SIGMA * statistics.median(abs(d) for d in diffs) / math.sqrt(2))
    return _median(sigmas)


def _detect(attempt: int, rows: list[StepSample], hosts: Mapping[int, str], signal: str,
            cfg: StragglerConfig, tail: Sequence[StepSample] = (), from_start: bool = True) -> list[Straggler]:
    from trainguard.stragglers.steady import detect_steady  # it builds on this module's rows and findings

    rows = sorted(rows, key=lambda s: s.step)
    ranks = sorted(set().union(*(s.own for s in rows))) if rows else []
    lead = [_leads(s.own) for s in rows]
    # Slow since the start: no onset to find, judged against the peers over the whole attempt. Those ranks' findings
    # start at the first row; the onset rule below looks at the others.
    out = detect_steady(attempt, rows, lead, hosts, signal, cfg, tail) if from_start else []
    steady = {s.rank for s in out}
    span = cfg.window_steps * cfg.windows
    rel = 1.0 - 1.0 / cfg.min_slowdown
    # late[i][r]: at row i, rank r held the step back by a share of it worth naming. Counting late steps (a
    # sign test) is robust to the heavy-tailed noise of shared machines, where one descheduled rank waits 10x.
    late = [{r: lead[i][r][0] > rel * rows[i].step_seconds for r in lead[i]} for i in range(len(rows))]
    slow = _slow_rows(len(rows), ranks, lead, late, cfg)
    for r in ranks:
        if r in steady:
            continue
        named = next((i for i in range(len(rows)) if slow[i][r]), None)
        if named is None:
            continue
        first_window = named - span + 1
        onset = next(k for k in range(max(0, first_window), named + 1) if late[k][r])
        while onset > 0 and late[onset - 1].get(r, False):  # the stretch began before the first full window
            onset -= 1
        # The stretch lasts while windows keep showing the rank slow.
        end = named
        while end + 1 < len(rows) and (slow[end + 1][r] or late[end + 1].get(r, False)):
            end += 1
        while end > onset and not late[end].get(r, False):
            end -= 1
        stretch = range(onset, end + 1)
        saved = [(attempt, rows[k].step, rows[k].end_time, lead[k][r][1]) for k in stretch if r in lead[k]]
        ratios = [rows[k].step_seconds / max(rows[k].step_seconds - lead[k][r][1], 1e-9) for k in stretch]
        if _median(ratios) < cfg.min_slowdown and not _host_peer_late(r, stretch, late, hosts, cfg):
            # Late against the others' median but hardly behind the next-slowest rank: without it the job would
            # be no faster worth naming (a clean demo's ~7 ms steps once named a rank at 1.06 this way). Ranks of
            # one slow host hold each other's place, so for them the what-if is the host's, not the rank's.
            continue
        without = _median(rows[k].step_seconds - lead[k][r][1] for k in stretch)
        last_step = rows[end].step
        if end == len(rows) - 1 and tail:
            # Still slow when the timings end: the steps after them are assumed slowed alike (what-if: each
            # would have taken the median step time without the rank).
            saved += [(attempt, t.step, t.end_time, max(0.0, t.step_seconds - without)) for t in tail]
            last_step = tail[-1].step
        out.append(Straggler(
            rank=r, host=hosts.get(r, ""), attempt=attempt, onset_step=rows[onset].step,
            detected_step=rows[named].step, last_step=last_step, steps=len(saved),
            slowdown=_median(ratios), lead_seconds=_median(lead[k][r][0] for k in stretch),
            cost_seconds=sum(x[3] for x in saved), step_seconds=_median(rows[k].step_seconds for k in stretch),
            step_seconds_without=without, signal=signal, saved_by_step=tuple(saved)))
    return out


def merge_ranks(found: Sequence[Straggler]) -> list[Straggler]:
    """One entry per (rank, host) across attempts: costs and steps add up, the first finding leads."""
    groups: dict[tuple[int, str], list[Straggler]] = defaultdict(list)
    for s in found:
        groups[(s.rank, s.host)].append(s)
    out = []
    for items in groups.values():
        items.sort(key=lambda s: (s.attempt, s.onset_step))
        head = items[0]
        if len(items) == 1:
            out.append(head)
            continue
        saved = tuple(x for s in items for x in s.saved_by_step)
        out.append(Straggler(
            rank=head.rank, host=head.host, attempt=head.attempt, onset_step=head.onset_step,
            detected_step=head.detected_step, last_step=items[-1].last_step, steps=sum(s.steps for s in items),
            slowdown=_median(s.slowdown for s in items), lead_seconds=_median(s.lead_seconds for s in items),
            cost_seconds=sum(s.cost_seconds for s in items), step_seconds=_median(s.step_seconds for s in items),
            step_seconds_without=_median(s.step_seconds_without for s in items), signal=head.signal,
            saved_by_step=saved))
    out.sort(key=lambda s: (-s.cost_seconds, s.rank))
    return out
