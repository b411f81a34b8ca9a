"""Thermal and power telemetry: per-host samplers (NVML GPUs, /sys CPUs) that write `TelemetrySample` records.

The agent writes them to ``events/telemetry-<node>.jsonl`` every few seconds; what they explain is computed by
the pure `trainguard.telemetry.thermal` (throughput, throttling) and `trainguard.telemetry.power` (the job's
power curve). No torch; NVML through pynvml's interface (the real module or `trainguard.health.fake.FakeNvml`).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trainguard.core.events import (
    Event,
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
