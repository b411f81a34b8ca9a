"""Throughput against temperature, clocks and time of day, and clock throttling as the cause of a slow host.

Pure: works on `TelemetrySample` and `StepCompleted` records (any source: a real run, a test's synthetic
stream). The samplers that write the records are in `trainguard.telemetry.samplers`; docs/stragglers.md.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.core.events import Event, StepCompleted, TelemetrySample
from trainguard.stragglers.analysis import Straggler

THROTTLE_BITS: dict[int, str] = {0x4: "power cap", 0x8: "HW slowdown", 0x20: "SW thermal slowdown",
                                 0x40: "HW thermal slowdown", 0x80: "power brake"}
"""NVML clocks-event reasons that mean the clock was held down (not idle or application settings)."""
THROTTLED_CLOCK_RATIO = 0.9
"""A clock below this share of its maximum (or of the other hosts' median) counts as held down."""
MIN_BIN_SECONDS = 5.0
MAX_BIN_SECONDS = 60.0
BINS_WANTED = 12
"""Throughput bins: the run's span / 12, within 5-60 s, so a short run still has bins to correlate."""


def throttle_names(mask: int | None) -> list[str]:
    """The throttling reasons set in an NVML clocks-event mask."""
    return [name for bit, name in THROTTLE_BITS.items() if mask and mask & bit]


@dataclass(frozen=True)
class ThrottleFinding:
    """Whether a host's clocks were held down while it was slow, and why."""

    host: str
    """The host judged."""
    throttled: bool
    """Clock throttling explains (part of) the slowness."""
    reasons: tuple[str, ...]
    """NVML reasons seen, or ``clock below max`` / ``clock below other hosts`` from clocks alone."""
    clock_mhz: float | None
    """Median clock of the host over the window."""
    reference_clock_mhz: float | None
    """Its max clock, or the other hosts' median clock."""
    temperature_c: float | None
    """Median temperature of the host over the window."""

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "throttled": self.throttled, "reasons": list(self.reasons),
                "clock_mhz": self.clock_mhz, "reference_clock_mhz": self.reference_clock_mhz,
                "temperature_c": self.temperature_c}

    @property
    def cause(self) -> str:
        """One line for a report: the cause when throttled, else what was seen."""
        if self.throttled:
            return "clock throttling: " + ", ".join(self.reasons)
        return "no clock throttling seen"


def _med(xs: Iterable[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return statistics.median(v) if v else None


def throttling(samples: Sequence[TelemetrySample], host: str, start: float, end: float) -> ThrottleFinding | None:
    """Judge ``host`` over ``[start, end]``; None when it has no sample then."""
    mine = [s for s in samples if s.host == host and start <= s.time <= end]
    if not mine:
        return None
    reasons: set[str] = set()
    for s in mine:
        reasons.update(throttle_names(s.throttle_reasons))
    clock, top = _med(s.clock_mhz for s in mine), _med(s.max_clock_mhz for s in mine)
    others = _med(s.clock_mhz for s in samples if s.host != host and start <= s.time <= end
                  and s.source == mine[0].source)
    ref = others if others is not None else top
    held = clock is not None and ref is not None and clock < THROTTLED_CLOCK_RATIO * ref
    if held:
        reasons.add("clock below other hosts" if others is not None else "clock below max")
    # NVML reasons alone do not convict: power-cap bits are set on busy healthy GPUs at full clock.
    thermal = any("thermal" in r or "HW slowdown" in r or "brake" in r for r in reasons)
    return ThrottleFinding(host, held or thermal, tuple(sorted(reasons)), clock, ref,
                           _med(s.temperature_c for s in mine))


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation; None with fewer than 3 points or no variation."""
    if len(xs) < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / (sx * sy)


@dataclass(frozen=True)
class SlowSpan:
    """A host the straggler analysis found slow, and when (input of `thermal_report`)."""

    host: str
    ranks: tuple[int, ...]
    """Its slow ranks."""
    start: float
    """Wall time of the first slowed step's end."""
    end: float
    """Wall time of the last slowed step's end."""


def slow_spans(stragglers: Sequence[Straggler]) -> list[SlowSpan]:
    """One span per host from straggler findings (their slowed steps' end times); hosts unknown are skipped."""
    by_host: dict[str, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    for s in stragglers:
        times = [x[2] for x in s.saved_by_step]
        if s.host and times:
            by_host[s.host][0].append(s.rank)
            by_host[s.host][1].extend(times)
    return [SlowSpan(h, tuple(sorted(r)), min(t), max(t)) for h, (r, t) in sorted(by_host.items())]


@dataclass(frozen=True)
class ThroughputBin:
    """One time bin of the run with training steps in it."""

    start: float
    """Unix seconds of the bin's start."""
    steps_per_second: float
    """Distinct steps that ended in the bin / bin length."""
    temperature_c: float | None
    """Mean of the bin's temperature readings (all hosts and devices)."""
    clock_mhz: float | None
    """Mean of the bin's clock readings."""


@dataclass(frozen=True)
class ThermalReport:
    """What the telemetry says about throughput and slow hosts."""

    samples: int
    """Telemetry records read."""
    hosts: tuple[str, ...]
    """Hosts that sent telemetry."""
    bin_seconds: float
    """Length of the throughput bins."""
    bins: tuple[ThroughputBin, ...]
    throughput_vs_temperature: float | None
    """Pearson r of steps/s against temperature over the bins (negative: hotter is slower)."""
    throughput_vs_clock: float | None
    """Pearson r of steps/s against clock (positive: lower clocks are slower)."""
    by_hour_utc: dict[int, tuple[float, float | None]]
    """Hour of day (UTC) -> (mean steps/s of the hour's bins, mean temperature)."""
    diurnal_swing: float | None
    """(best - worst) / best hourly steps/s, with two hours or more; Llama 3 saw 1-2%."""
    slow_hosts: tuple[tuple[SlowSpan, ThrottleFinding | None], ...]
    """Each slow host with the throttling judgement over its slow stretch (+-1 bin)."""
    throttled_hosts: tuple[ThrottleFinding, ...]
    """Hosts whose clocks were held down over the whole run, slow or not."""

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": self.samples, "hosts": list(self.hosts), "bin_seconds": self.bin_seconds,
            "bins": [{"t": b.start, "steps_per_second": b.steps_per_second, "temperature_c": b.temperature_c,
                      "clock_mhz": b.clock_mhz} for b in self.bins],
            "throughput_vs_temperature": self.throughput_vs_temperature,
            "throughput_vs_clock": self.throughput_vs_clock,
            "by_hour_utc": {str(h): {"steps_per_second": r, "temperature_c": t}
                            for h, (r, t) in sorted(self.by_hour_utc.items())},
            "diurnal_swing": self.diurnal_swing,
            "slow_hosts": [{"host": s.host, "ranks": list(s.ranks), "start": s.start, "end": s.end,
                            "throttling": f.to_json() if f else None,
                            "cause": f.cause if f else "unknown (no telemetry from the host then)"}
                           for s, f in self.slow_hosts],
            "throttled_hosts": [f.to_json() for f in self.throttled_hosts],
        }


def _bin_seconds(lo: float, hi: float) -> float:
    return min(MAX_BIN_SECONDS, max(MIN_BIN_SECONDS, (hi - lo) / BINS_WANTED))


def throughput_bins(samples: Sequence[TelemetrySample], steps: Sequence[StepCompleted],
                    bin_seconds: float | None = None) -> tuple[float, list[ThroughputBin]]:
    """(bin length, bins with steps) over the time the run trained; readings averaged per bin."""
    if not steps:
        return bin_seconds or MAX_BIN_SECONDS, []
    lo, hi = min(e.time for e in steps), max(e.time for e in steps)
    width = bin_seconds or _bin_seconds(lo, hi)
    done: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for e in steps:
        done[int((e.time - lo) // width)].add((e.attempt, e.step))
    temps: dict[int, list[float]] = defaultdict(list)
    clocks: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        k = math.floor((s.time - lo) / width)
        if s.temperature_c is not None:
            temps[k].append(s.temperature_c)
        if s.clock_mhz is not None:
            clocks[k].append(s.clock_mhz)
    last = int((hi - lo) // width)
    out = []
    for k in sorted(done):
        # The last bin is cut short by the run's end: its rate would read as a slowdown.
        length = width if k < last else max(hi - (lo + k * width), 1e-9)
        if k == last and length < width / 2 and len(done) > 1:
            continue
        out.append(ThroughputBin(lo + k * width, len(done[k]) / length,
                                 statistics.fmean(temps[k]) if temps[k] else None,
                                 statistics.fmean(clocks[k]) if clocks[k] else None))
    return width, out


def _by_hour(bins: Sequence[ThroughputBin]) -> dict[int, tuple[float, float | None]]:
    rates: dict[int, list[float]] = defaultdict(list)
    temps: dict[int, list[float]] = defaultdict(list)
    for b in bins:
        hour = time.gmtime(b.start).tm_hour
        rates[hour].append(b.steps_per_second)
        if b.temperature_c is not None:
            temps[hour].append(b.temperature_c)
    return {h: (statistics.fmean(v), statistics.fmean(temps[h]) if temps[h] else None) for h, v in rates.items()}


def thermal_report(records: Sequence[Event], slow: Sequence[SlowSpan] = (),
                   bin_seconds: float | None = None) -> ThermalReport:
    """Correlate throughput with temperature, clock and hour of day; judge throttling on each slow host."""
    samples = [e for e in records if isinstance(e, TelemetrySample)]
    steps = [e for e in records if isinstance(e, StepCompleted)]
    width, bins = throughput_bins(samples, steps, bin_seconds)

    def r(attr: str) -> float | None:
        pairs = [(getattr(b, attr), b.steps_per_second) for b in bins if getattr(b, attr) is not None]
        return pearson([p[0] for p in pairs], [p[1] for p in pairs])

    hours = _by_hour(bins)
    hourly = [v[0] for v in hours.values()]
    swing = (max(hourly) - min(hourly)) / max(hourly) if len(hourly) >= 2 and max(hourly) > 0 else None
    judged = tuple((s, throttling(samples, s.host, s.start - width, s.end + width)) for s in slow)
    lo = min((e.time for e in records), default=0.0)
    hi = max((e.time for e in records), default=0.0)
    hosts = tuple(sorted({s.host for s in samples}))
    whole = [throttling(samples, h, lo, hi) for h in hosts]
    return ThermalReport(len(samples), hosts, width, tuple(bins), r("temperature_c"), r("clock_mhz"), hours, swing,
                         judged, tuple(f for f in whole if f is not None and f.throttled))
