"""Pure thermal and power analysis on synthetic telemetry streams, and the report's sections built from them."""

from __future__ import annotations

import calendar
import dataclasses
import time

import pytest

from trainguard.core.events import (
    AttemptStarted,
    CheckpointSaveFinished,
    Event,
    FailureDetected,
    RunStarted,
    StepCompleted,
    TelemetrySample,
)
from trainguard.health.fake import FakeGpu, FakeNvml
from trainguard.report.thermal_power import render_html, render_text, sections
from trainguard.telemetry.power import power_report
from trainguard.telemetry.samplers import GpuSource, Sampler
from trainguard.telemetry.thermal import SlowSpan, thermal_report

T0 = float(calendar.timegm((2026, 7, 1, 11, 0, 0)))
"""11:00 UTC: a stream of two hours crosses into noon."""


def _steps(times: list[float], ranks: int = 2, attempt: int = 0) -> list[Event]:
    out: list[Event] = []
    for i, t in enumerate(times):
        out += [StepCompleted(time=t, host=f"h{r}", attempt=attempt, rank=r, step=i + 1, duration_seconds=0.5)
                for r in range(ranks)]
    return out


def test_hot_bins_are_slow_bins_and_the_hours_show_the_diurnal_swing() -> None:
    # Two hours of training; each 5-minute block is hotter than the last and runs fewer steps.
    recs: list[Event] = []
    times: list[float] = []
    for block in range(24):
        start = T0 + 300 * block
        temp = 55.0 + block
        recs += [TelemetrySample(time=start + s, host="h0", source="gpu", device="gpu0", temperature_c=temp,
                                 clock_mhz=1980.0 - 10 * block, max_clock_mhz=1980.0) for s in range(0, 300, 30)]
        rate = 2.0 - 0.03 * block  # steps per second
        times += [start + k / rate for k in range(int(300 * rate))]
    recs += _steps(times)
    rep = thermal_report(recs)
    assert rep.throughput_vs_temperature is not None and rep.throughput_vs_temperature < -0.9
    assert rep.throughput_vs_clock is not None and rep.throughput_vs_clock > 0.9
    assert sorted(rep.by_hour_utc) == [11, 12]
    morning, noon = rep.by_hour_utc[11], rep.by_hour_utc[12]
    assert morning[0] > noon[0] and noon[1] is not None and morning[1] is not None and noon[1] > morning[1]
    expected = (morning[0] - noon[0]) / morning[0]
    assert rep.diurnal_swing == pytest.approx(expected)
    assert 0.1 < expected < 0.3
    assert time.gmtime(rep.bins[0].start).tm_hour == 11


def test_a_slow_host_is_blamed_on_throttling_only_when_its_clocks_show_it() -> None:
    recs: list[Event] = []
    for t in range(0, 600, 10):
        recs.append(TelemetrySample(time=T0 + t, host="hot", source="gpu", device="gpu0", temperature_c=88,
                                    clock_mhz=1980.0 if t < 300 else 1350.0, max_clock_mhz=1980.0,
                                    throttle_reasons=0x4 | (0x40 if t >= 300 else 0)))
        for host in ("cool", "busy"):
            recs.append(TelemetrySample(time=T0 + t, host=host, source="gpu", device="gpu0", temperature_c=60,
                                        clock_mhz=1980.0, max_clock_mhz=1980.0, throttle_reasons=0x4))
    recs += _steps([T0 + 0.5 * k for k in range(1200)])
    slow = [SlowSpan("hot", (3,), T0 + 320, T0 + 590), SlowSpan("busy", (5,), T0 + 320, T0 + 590)]
    rep = thermal_report(recs, slow)
    (hot, hot_f), (busy, busy_f) = rep.slow_hosts
    assert busy.host == "busy"
    assert hot.host == "hot" and hot_f is not None and hot_f.throttled
    assert hot_f.cause == "clock throttling: HW thermal slowdown, clock below other hosts, power cap"
    # Busy at full clock with only the power-cap bit: slow for another reason, and the report says so.
    assert busy_f is not None and not busy_f.throttled and busy_f.cause == "no clock throttling seen"
    doc = rep.to_json()
    assert [h["host"] for h in doc["throttled_hosts"]] == ["hot"]
    assert doc["slow_hosts"][1]["cause"] == "no clock throttling seen"


def test_cpu_frequency_drop_convicts_a_cpu_host_and_no_telemetry_says_unknown() -> None:
    recs: list[Event] = []
    for t in range(0, 120, 5):
        recs.append(TelemetrySample(time=T0 + t, host="a", source="cpu", device="cpu", clock_mhz=2400.0,
                                    max_clock_mhz=3000.0, temperature_c=50))
        recs.append(TelemetrySample(time=T0 + t, host="b", source="cpu", device="cpu", clock_mhz=1200.0,
                                    max_clock_mhz=3000.0, temperature_c=97))
    recs += _steps([T0 + k for k in range(120)])
    rep = thermal_report(recs, [SlowSpan("b", (1,), T0 + 10, T0 + 110), SlowSpan("c", (2,), T0 + 10, T0 + 110)])
    (_, b), (_, c) = rep.slow_hosts
    assert b is not None and b.throttled and b.reasons == ("clock below other hosts",) and b.temperature_c == 97
    assert c is None
    assert rep.to_json()["slow_hosts"][1]["cause"].startswith("unknown (no telemetry")


def _power_run() -> list[Event]:
    """4 GPUs at 600 W; a crash at t=300 (detected 20 s later) drops them to 90 W until the restart at t=420;
    a checkpoint stall at t=600 shows as a small dip. One device misses a sample now and then."""
    recs: list[Event] = [RunStarted(time=T0, run_id="p", world_size=4)]
    for t in range(0, 900, 10):
        for g in range(4):
            if g == 3 and t % 70 == 0 and 0 < t < 280:
                continue  # a missed sample is no swing
            idle = 300 <= t < 420
            watts = 90.0 if idle else (200.0 if 600 <= t < 610 else 600.0)
            recs.append(TelemetrySample(time=T0 + t + 1, host=f"n{g // 2}", source="gpu", device=f"gpu{g % 2}",
                                        power_watts=watts))
    recs.append(FailureDetected(time=T0 + 320, attempt=0, kind="crash", detection_latency_seconds=20.0))
    recs.append(AttemptStarted(time=T0 + 420, attempt=1))
    recs.append(CheckpointSaveFinished(time=T0 + 608, attempt=1, rank=0, step=9, blocking_seconds=8,
                                       total_seconds=8))
    return recs


def test_power_swings_are_matched_to_failure_restart_and_checkpoint() -> None:
    rep = power_report(_power_run(), bin_seconds=10.0)
    assert rep.devices == 4
    assert max(w for _, w in rep.series) == pytest.approx(2400.0)
    assert min(w for _, w in rep.series) == pytest.approx(360.0)
    swings = [(s.cause, round(s.delta_watts)) for s in rep.swings]
    assert swings[:2] == [("failure", -2040), ("restart", 2040)] or swings[:2] == [("restart", 2040),
                                                                                   ("failure", -2040)]
    assert ("checkpoint", -1600) in swings
    model = rep.model
    assert model is not None and model["gpus"] == 4 and model["basis"] == "GPUs sampled"
    assert model["swings_watts"]["failure_or_stop"] == pytest.approx(4 * (700 - 90))
    assert model["computing_watts"] == pytest.approx(4 * (0.9 * 700 + 0.1 * 300))


def test_without_power_readings_the_model_uses_the_world_size() -> None:
    rep = power_report([RunStarted(time=T0, run_id="c", world_size=8), *_steps([T0 + 1, T0 + 2])])
    assert rep.series == () and rep.swings == ()
    assert rep.model is not None and (rep.model["gpus"], rep.model["basis"]) == (8, "world size (one GPU per rank)")
    assert power_report([]).model is None


def test_report_sections_as_json_text_and_escaped_html() -> None:
    recs = _power_run()
    recs.append(TelemetrySample(time=T0 + 5, host="<b>n9</b>", source="gpu", device="gpu0", temperature_c=70,
                                clock_mhz=900.0, max_clock_mhz=1980.0))  # throttled: named in the text
    recs += _steps([T0 + 430 + k for k in range(200)], ranks=1, attempt=1)
    doc = sections(recs)
    assert set(doc) == {"thermal", "power"}
    assert doc["power"]["largest_swings"][0]["cause"] in ("failure", "restart")
    text = "\n".join(render_text(doc))
    assert "power (4 device(s) with readings)" in text and "failure (crash in attempt 0)" in text
    assert "simulator model for 4 GPUs" in text and "thermal (" in text
    page = render_html(doc)
    assert page.startswith('<section id="thermal-power-section">') and "&lt;b&gt;n9&lt;/b&gt;" in page
    assert "<b>n9" not in page and "host <b>n9</b>: clock throttling (clock below max)" in text
    assert render_text(sections([])) == [] and render_html(sections([])) == ""


def test_gpu_telemetry_through_the_nvml_fake_names_the_throttled_host_and_sizes_the_power_model() -> None:
    # The GPU code path end to end: NVML (the fake) -> Sampler -> records -> the report's judgement.
    gpus = {"cool": FakeGpu(temperature_c=62), "hot": FakeGpu(temperature_c=62)}
    recs: list[Event] = []
    samplers = {h: Sampler([GpuSource(FakeNvml([g]))], h, recs.append, 0.0) for h, g in gpus.items()}
    for k in range(30):
        if k == 10:  # the hot host's GPU heats up and its clock is held down from here on
            gpus["hot"].temperature_c, gpus["hot"].sm_clock_mhz = 91, 1290
            gpus["hot"].clocks_event_reasons, gpus["hot"].power_mw = 0x40, 420_000
        for sampler in samplers.values():
            sampler.sample_now()
    # The samplers stamp wall time; spread the readings 10 s apart as a run would have them.
    recs = [dataclasses.replace(e, time=T0 + 10 * (i // 2)) for i, e in enumerate(recs)]
    recs += _steps([T0 + 0.5 * k for k in range(600)])
    rep = thermal_report(recs, [SlowSpan("hot", (1,), T0 + 110, T0 + 290)])
    ((_, finding),) = rep.slow_hosts
    assert finding is not None and finding.cause == "clock throttling: HW thermal slowdown, clock below other hosts"
    assert finding.temperature_c == 91 and finding.clock_mhz == 1290
    pw = power_report(recs, bin_seconds=10.0)
    assert pw.devices == 2 and pw.model is not None and (pw.model["gpus"], pw.model["basis"]) == (2, "GPUs sampled")
    assert pw.swings[0].delta_watts == pytest.approx(-230.0) and pw.swings[0].cause == "unknown"
