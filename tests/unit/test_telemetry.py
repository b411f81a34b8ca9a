"""Telemetry sources (NVML fake, a fake /sys), the sampler, and the throttling judgement on their samples."""

from __future__ import annotations

from pathlib import Path

from trainguard.core.events import Event, TelemetrySample
from trainguard.health.fake import FakeGpu, FakeNvml
from trainguard.telemetry.samplers import CpuSource, GpuSource, Sampler
from trainguard.telemetry.thermal import throttling


def test_gpu_source_reads_every_gpu_and_tolerates_unsupported_values() -> None:
    nvml = FakeNvml([FakeGpu(temperature_c=81, sm_clock_mhz=1410, clocks_event_reasons=0x40),
                     FakeGpu(power_mw=None, sm_clock_mhz=None)])
    src = GpuSource(nvml)
    a, b = src.sample(100.0, "n1")
    assert (a.device, a.temperature_c, a.clock_mhz, a.max_clock_mhz, a.power_watts, a.throttle_reasons) == (
        "gpu0", 81.0, 1410.0, 1980.0, 650.0, 0x40)
    assert b.power_watts is None and b.clock_mhz is None and b.temperature_c == 45.0
    assert nvml.initialized == 1  # one session, kept open across samples
    src.sample(101.0, "n1")
    assert nvml.initialized == 1
    src.close()
    assert nvml.initialized == 0


def test_gpu_source_without_a_driver_samples_nothing() -> None:
    assert GpuSource(FakeNvml(available=False)).sample(1.0, "n") == []


def _sysfs(root: Path, freqs_khz: list[int], temps_mc: list[int]) -> Path:
    for i, f in enumerate(freqs_khz):
        d = root / f"sys/devices/system/cpu/cpu{i}/cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_cur_freq").write_text(f"{f}\n")
        (d / "cpuinfo_max_freq").write_text("3000000\n")
    for i, t in enumerate(temps_mc):
        d = root / f"sys/class/thermal/thermal_zone{i}"
        d.mkdir(parents=True)
        (d / "temp").write_text(f"{t}\n")
    return root


def test_cpu_source_reads_sysfs(tmp_path: Path) -> None:
    src = CpuSource(_sysfs(tmp_path, [2_000_000, 1_000_000], [45_000, 71_500]))
    assert src.available()
    (s,) = src.sample(5.0, "n1")
    assert (s.source, s.clock_mhz, s.max_clock_mhz, s.temperature_c) == ("cpu", 1500.0, 3000.0, 71.5)


def test_cpu_source_without_sysfs_is_unavailable(tmp_path: Path) -> None:
    src = CpuSource(tmp_path)
    assert not src.available() and src.sample(1.0, "n") == []


def test_sampler_respects_its_interval_and_turns_off_a_failing_source() -> None:
    written: list[Event] = []
    now = [0.0]

    class Broken:
        def sample(self, now: float, host: str) -> list[TelemetrySample]:
            raise RuntimeError("sensor gone")

    sampler = Sampler([GpuSource(FakeNvml([FakeGpu()])), Broken()], "n1", written.append, 10.0, clock=lambda: now[0])
    assert sampler.poll() == 1 and len(sampler.sources) == 1
    now[0] = 5.0
    assert sampler.poll() == 0
    now[0] = 10.0
    assert sampler.poll() == 1
    assert all(isinstance(r, TelemetrySample) and r.host == "n1" for r in written)


def _samples(host: str, clock: float, reasons: int = 0, t0: float = 0.0) -> list[TelemetrySample]:
    return [TelemetrySample(time=t0 + t, host=host, source="gpu", device="gpu0", temperature_c=85.0 if reasons else 60,
                            clock_mhz=clock, max_clock_mhz=1980.0, power_watts=600.0, throttle_reasons=reasons)
            for t in range(0, 100, 10)]


def test_throttling_is_named_from_reasons_or_clocks_and_not_from_power_cap_at_full_clock() -> None:
    samples = _samples("hot", 1400.0, 0x40) + _samples("ok", 1980.0, 0x4) + _samples("slowclk", 1500.0)
    hot = throttling(samples, "hot", 0, 100)
    assert hot is not None and hot.throttled and "HW thermal slowdown" in hot.reasons and hot.temperature_c == 85
    ok = throttling(samples, "ok", 0, 100)
    assert ok is not None and not ok.throttled  # power cap bit set, clock at the others' median: a busy GPU
    slowclk = throttling(samples, "slowclk", 0, 100)
    assert slowclk is not None and slowclk.throttled and slowclk.reasons == ("clock below other hosts",)
    assert throttling(samples, "absent", 0, 100) is None
