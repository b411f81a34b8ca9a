"""Thermal and power telemetry: per-host samplers (NVML GPUs, /sys CPUs) and what their samples explain.

Sources read devices into `TelemetrySample` records (the agent writes them to ``events/telemetry-<node>.jsonl``
every few seconds); the pure functions below correlate them with throughput, flag clock throttling on a
slow host, and build the job's power curve. No torch; NVML through pynvml's interface (the real module or
`trainguard.health.fake.FakeNvml`).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trainguard.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaveFinished,
    Event,
    FailureDetected,
    RunEnded,
    RunStarted,
    StepCompleted,
    TelemetrySample,
)

log = logging.getLogger(__name__)

THROTTLE_BITS: dict[int, str] = {0x4: "power cap", 0x8: "HW slowdown", 0x20: "SW thermal slowdown",
                                 0x40: "HW thermal slowdown", 0x80: "power brake"}
"""NVML clocks-event reasons that mean the clock was held down (not idle or application settings)."""
THROTTLED_CLOCK_RATIO = 0.9
"""A clock below this share of its maximum (or of the other hosts' median) counts as held down."""


class Source(Protocol):
    """A device family on this host that can be read into samples."""

    def sample(self, now: float, host: str) -> list[TelemetrySample]: ...


# --- CPU: /sys ------------------------------------------------------------------------------------


def _read_number(path: Path) -> float | None:
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class CpuSource:
    """CPU frequency (cpufreq) and temperature (thermal zones) from sysfs; ``root`` is ``/`` except in tests."""

    root: Path = Path("/")
    """File-system root under which ``sys/`` is read."""

    def available(self) -> bool:
        """Whether this host exposes any of the files (containers and VMs often do not)."""
        return any(self._freq_files()) or any(self._zones())

    def _freq_files(self) -> Iterable[Path]:
        return sorted((self.root / "sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq"))

    def _zones(self) -> Iterable[Path]:
        return sorted((self.root / "sys/class/thermal").glob("thermal_zone*/temp"))

    def sample(self, now: float, host: str) -> list[TelemetrySample]:
        cur, top = [], []
        for f in self._freq_files():
            khz = _read_number(f)
            if khz is not None and khz > 0:
                cur.append(khz / 1000.0)
            mx = _read_number(f.parent / "cpuinfo_max_freq")
            if mx is not None and mx > 0:
                top.append(mx / 1000.0)
        temps = [t / 1000.0 for t in (_read_number(z) for z in self._zones()) if t is not None and -50e3 < t < 200e3]
        if not cur and not temps:
            return []
        return [TelemetrySample(time=now, host=host, source="cpu", device="cpu",
                                temperature_c=max(temps) if temps else None,
                                clock_mhz=statistics.fmean(cur) if cur else None,
                                max_clock_mhz=max(top) if top else None)]


# --- GPU: NVML ------------------------------------------------------------------------------------


class GpuSource:
    """Temperature, SM clock, power and throttle reasons of every GPU, in one NVML session kept open."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._handles: list[tuple[int, Any]] | None = None

    @classmethod
    def load(cls) -> GpuSource | None:
        """The source for this host, or None when pynvml or a driver is missing."""
        try:
            import pynvml
        except ImportError:
            return None
        return cls(pynvml)

    def _open(self) -> list[tuple[int, Any]]:
        if self._handles is None:
            self.nvml.nvmlInit()
            handles = []
            for i in range(self.nvml.nvmlDeviceGetCount()):
                try:
                    handles.append((i, self.nvml.nvmlDeviceGetHandleByIndex(i)))
                except self.nvml.NVMLError as exc:  # a lost GPU: the health checks report it
                    log.debug("GPU %d has no handle: %s", i, exc)
            self._handles = handles
        return self._handles

    def _ask(self, fn_name: str, *args: Any) -> Any:
        fn = getattr(self.nvml, fn_name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    def sample(self, now: float, host: str) -> list[TelemetrySample]:
        try:
            handles = self._open()
        except Exception as exc:  # no driver: nothing to sample, ever
            log.info("GPU telemetry off: %s", exc)
            self._handles = []
            return []
        sm = getattr(self.nvml, "NVML_CLOCK_SM", 1)
        sensor = getattr(self.nvml, "NVML_TEMPERATURE_GPU", 0)
        reasons_fn = ("nvmlDeviceGetCurrentClocksEventReasons"
                      if hasattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons")
                      else "nvmlDeviceGetCurrentClocksThrottleReasons")  # older nvidia-ml-py
        out = []
        for i, h in handles:
            power_mw = self._ask("nvmlDeviceGetPowerUsage", h)
            temp = self._ask("nvmlDeviceGetTemperature", h, sensor)
            clock = self._ask("nvmlDeviceGetClockInfo", h, sm)
            top = self._ask("nvmlDeviceGetMaxClockInfo", h, sm)
            reasons = self._ask(reasons_fn, h)
            out.append(TelemetrySample(
                time=now, host=host, source="gpu", device=f"gpu{i}",
                temperature_c=float(temp) if temp is not None else None,
                clock_mhz=float(clock) if clock is not None else None,
                max_clock_mhz=float(top) if top is not None else None,
                power_watts=power_mw / 1000.0 if power_mw is not None else None,
                throttle_reasons=int(reasons) if reasons is not None else None))
        return out

    def close(self) -> None:
        if self._handles is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception as exc:
                log.debug("nvmlShutdown: %s", exc)
            self._handles = None


class Sampler:
    """Samples its sources every ``interval_seconds`` when polled; a failing source is turned off, never raised."""

    def __init__(self, sources: Sequence[Source], host: str, write: Callable[[Event], None],
                 interval_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.sources = list(sources)
        self.host = host
        self.write = write
        self.interval_seconds = interval_seconds
        self.clock = clock
        self._next: float | None = None

    def poll(self) -> int:
        """Take a sample if one is due; returns the records written."""
        now = self.clock()
        if self.interval_seconds <= 0 or (self._next is not None and now < self._next):
            return 0
        self._next = now + self.interval_seconds
        return self.sample_now()

    def sample_now(self) -> int:
        wall = time.time()
        n = 0
        for src in list(self.sources):
            try:
                records = src.sample(wall, self.host)
                for r in records:
                    self.write(r)
                n += len(records)
            except Exception as exc:  # telemetry must never stand in the way of training
                log.warning("telemetry source %s failed (%s); turned off", type(src).__name__, exc)
                self.sources.remove(src)
        return n

    def close(self) -> None:
        for src in self.sources:
            close = getattr(src, "close", None)
            if close is not None:
                close()


def default_sources(nvml: Any = None) -> list[Source]:
    """This host's sources: NVML GPUs (``nvml`` or pynvml) where present, and the CPU where /sys tells."""
    out: list[Source] = []
    gpu = GpuSource(nvml) if nvml is not None else GpuSource.load()
    if gpu is not None:
        out.append(gpu)
    cpu = CpuSource()
    if cpu.available():
        out.append(cpu)
    return out


# --- analysis (pure) --------------------------------------------------------------------------------


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
    if clock is not None and ref is not None and clock < THROTTLED_CLOCK_RATIO * ref:
        reasons.add("clock below other hosts" if others is not None else "clock below max")
    # NVML reasons alone do not convict: power-cap bits are set on busy healthy GPUs at full clock.
    held = clock is not None and ref is not None and clock < THROTTLED_CLOCK_RATIO * ref
    thermal = any("thermal" in r or "HW slowdown" in r or "brake" in r for r in reasons)
    return ThrottleFinding(host, held or thermal, tuple(sorted(reasons)), clock, ref,
                           _med(s.temperature_c for s in mine))


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    if len(xs) < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / (sx * sy)


def summarize(records: Sequence[Event], bin_seconds: float = 60.0) -> dict[str, Any]:
    """Telemetry section of `trainguard stragglers --json`: throughput vs temperature and clock, throughput by
    hour of day (UTC), and the job power curve with its largest swings and their likely cause."""
    samples = [e for e in records if isinstance(e, TelemetrySample)]
    steps = [e for e in records if isinstance(e, StepCompleted)]
    out: dict[str, Any] = {"samples": len(samples), "hosts": sorted({s.host for s in samples})}
    if not samples:
        return out
    lo = min(min(s.time for s in samples), min((e.time for e in steps), default=math.inf))
    bins: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        b = bins[int((s.time - lo) // bin_seconds)]
        if s.temperature_c is not None:
            b["temp"].append(s.temperature_c)
        if s.clock_mhz is not None:
            b["clock"].append(s.clock_mhz)
    step_counts: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for e in steps:
        step_counts[int((e.time - lo) // bin_seconds)].add((e.attempt, e.step))
    keys = sorted(k for k in bins if k in step_counts)
    rate = [len(step_counts[k]) / bin_seconds for k in keys]
    for name, key in (("temperature", "temp"), ("clock", "clock")):
        pairs = [(statistics.fmean(bins[k][key]), r) for k, r in zip(keys, rate, strict=True) if bins[k][key]]
        out[f"throughput_vs_{name}"] = _pearson([p[0] for p in pairs], [p[1] for p in pairs])
    by_hour: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for e in steps:
        by_hour[time.gmtime(e.time).tm_hour].add((e.attempt, e.step))
    out["steps_by_hour_utc"] = {str(h): len(v) for h, v in sorted(by_hour.items())}
    out["power"] = power_curve(records, bin_seconds=bin_seconds)
    return out


def power_curve(records: Sequence[Event], bin_seconds: float = 60.0, swings: int = 3) -> dict[str, Any]:
    """Job power per time bin (sum over devices of each device's mean draw in the bin) and its largest
    changes, each with the nearest lifecycle event as the likely cause."""
    samples = [e for e in records if isinstance(e, TelemetrySample) and e.power_watts is not None]
    if not samples:
        return {"series": [], "largest_swings": [], "devices": 0}
    lo = min(s.time for s in samples)
    per: dict[int, dict[tuple[str, str], list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        per[int((s.time - lo) // bin_seconds)][(s.host, s.device)].append(float(s.power_watts or 0.0))
    series = [(lo + k * bin_seconds, sum(statistics.fmean(v) for v in per[k].values())) for k in sorted(per)]
    causes: list[tuple[float, str]] = []
    for e in records:
        if isinstance(e, FailureDetected):
            causes.append((e.time, f"failure ({e.kind})"))
        elif isinstance(e, CheckpointSaveFinished):
            causes.append((e.time, "checkpoint"))
        elif isinstance(e, (AttemptStarted, RunStarted)):
            causes.append((e.time, "start or restart"))
        elif isinstance(e, (AttemptEnded, RunEnded)):
            causes.append((e.time, "stop"))
    deltas = [(series[i][0], series[i][1] - series[i - 1][1]) for i in range(1, len(series))]
    deltas.sort(key=lambda d: -abs(d[1]))
    top = []
    for t, d in deltas[:swings]:
        near = [c for c in causes if t - 2 * bin_seconds <= c[0] <= t + bin_seconds]
        cause = min(near, key=lambda c: abs(c[0] - t))[1] if near else "unknown"
        top.append({"t": t, "delta_watts": d, "cause": cause})
    return {"series": [{"t": t, "watts": w} for t, w in series], "largest_swings": top,
            "devices": len({(s.host, s.device) for s in samples})}
