"""The job's power curve from per-device power samples, its largest swings with their cause, and the
simulator's power model for a job of the same size.

Pure: works on `TelemetrySample` records and the run's lifecycle records. Llama 3's job swung tens of
megawatts when thousands of GPUs stopped and started together; this names which event did it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.core.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaveFinished,
    Event,
    FailureDetected,
    PlannedInterruption,
    RunEnded,
    RunStarted,
    TelemetrySample,
)
from trainguard.telemetry.power_model import PowerModel

CARRY_BINS = 2
"""A device without a sample in a bin keeps its last reading this many bins (sampling jitter is no swing)."""
MIN_BIN_SECONDS = 1.0
MAX_BIN_SECONDS = 60.0
BINS_WANTED = 60
"""Power bins: the sampled span / 60, within 1-60 s."""


@dataclass(frozen=True)
class PowerSwing:
    """A change of the job's draw between two consecutive bins."""

    time: float
    """Unix seconds of the later bin's start (the change happened in the bin before it or in it)."""
    delta_watts: float
    """Later bin's draw minus the earlier's."""
    before_watts: float
    after_watts: float
    cause: str
    """``failure``, ``checkpoint``, ``restart``, ``start``, ``stop``, ``planned`` or ``unknown``."""
    detail: str
    """The matched event in words (kind, attempt), or why none matched."""


@dataclass(frozen=True)
class PowerReport:
    """The job power curve and what moved it."""

    devices: int
    """Devices with power readings (GPUs through NVML)."""
    bin_seconds: float
    series: tuple[tuple[float, float], ...]
    """(bin start, job watts): the sum over devices of each one's mean draw in the bin."""
    swings: tuple[PowerSwing, ...]
    """Largest changes first."""
    model: dict[str, Any] | None
    """The simulator's `PowerModel` for the same job size (see `model_for`), or None without a size."""

    def to_json(self) -> dict[str, Any]:
        watts = [w for _, w in self.series]
        return {
            "devices": self.devices, "bin_seconds": self.bin_seconds,
            "series": [{"t": t, "watts": w} for t, w in self.series],
            "mean_watts": statistics.fmean(watts) if watts else None,
            "peak_watts": max(watts) if watts else None,
            "largest_swings": [{"t": s.time, "delta_watts": s.delta_watts, "before_watts": s.before_watts,
                                "after_watts": s.after_watts, "cause": s.cause, "detail": s.detail}
                               for s in self.swings],
            "model": self.model,
        }


def model_for(gpus: int, basis: str, model: PowerModel | None = None) -> dict[str, Any]:
    """The simulator's draw levels and swings for ``gpus`` GPUs, in watts (``basis`` says what was counted)."""
    m = model or PowerModel()
    swings = {k: v * 1e6 for k, v in m.swings_mw(gpus).items()}
    return {"gpus": gpus, "basis": basis, "computing_watts": gpus * m.step_average_watts,
            "checkpointing_watts": gpus * m.checkpointing_watts, "idle_watts": gpus * m.restarting_watts,
            "swings_watts": swings}


def _causes(records: Sequence[Event]) -> list[tuple[float, str, str]]:
    """(time the draw should change, cause, detail) of every lifecycle event that moves power."""
    out: list[tuple[float, str, str]] = []
    for e in records:
        if isinstance(e, FailureDetected):  # the GPUs go idle at the failure's onset, not at its detection
            out.append((e.time - e.detection_latency_seconds, "failure", f"{e.kind} in attempt {e.attempt}"))
        elif isinstance(e, CheckpointSaveFinished) and e.ok and e.blocking_seconds > 0:
            out.append((e.time - e.total_seconds, "checkpoint", f"save of step {e.step}"))
        elif isinstance(e, AttemptStarted):
            out.append((e.time, "restart" if e.attempt > 0 else "start", f"attempt {e.attempt} started"))
        elif isinstance(e, RunStarted):
            out.append((e.time, "start", "run started"))
        elif isinstance(e, PlannedInterruption):
            out.append((e.time, "planned", e.reason or f"attempt {e.attempt}"))
        elif isinstance(e, AttemptEnded) and e.reason != "failure":  # a failure is matched by its detection
            out.append((e.time, "stop", f"attempt {e.attempt} ended ({e.reason})"))
        elif isinstance(e, RunEnded):
            out.append((e.time, "stop", f"run ended ({e.status})"))
    return out


def _series(samples: Sequence[TelemetrySample], width: float) -> list[tuple[float, float]]:
    lo = min(s.time for s in samples)
    per: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        per[(s.host, s.device)][int((s.time - lo) // width)].append(float(s.power_watts or 0.0))
    last = max(k for bins in per.values() for k in bins)
    totals = [0.0] * (last + 1)
    seen = [False] * (last + 1)
    for bins in per.values():
        carried: tuple[int, float] | None = None
        for k in range(last + 1):
            if k in bins:
                carried = (k, statistics.fmean(bins[k]))
            if carried is not None and k - carried[0] <= CARRY_BINS:
                totals[k] += carried[1]
                seen[k] = seen[k] or k in bins
    return [(lo + k * width, totals[k]) for k in range(last + 1) if seen[k]]


def power_report(records: Sequence[Event], *, bin_seconds: float | None = None, swings: int = 3,
                 model: PowerModel | None = None) -> PowerReport:
    """The job power curve of ``records``, its ``swings`` largest changes with their likely cause, and the
    simulator's model for the same size (GPUs sampled, else the world size as if each rank had one GPU)."""
    samples = [e for e in records if isinstance(e, TelemetrySample) and e.power_watts is not None]
    gpus = len({(s.host, s.device) for s in samples if s.source == "gpu"})
    world = max((e.world_size for e in records if isinstance(e, RunStarted)), default=0)
    sized = model_for(gpus, "GPUs sampled", model) if gpus else (
        model_for(world, "world size (one GPU per rank)", model) if world else None)
    if not samples:
        return PowerReport(0, bin_seconds or MAX_BIN_SECONDS, (), (), sized)
    span = max(s.time for s in samples) - min(s.time for s in samples)
    width = bin_seconds or min(MAX_BIN_SECONDS, max(MIN_BIN_SECONDS, span / BINS_WANTED))
    series = _series(samples, width)
    causes = _causes(records)
    deltas = [(series[i][0], series[i - 1][1], series[i][1]) for i in range(1, len(series))]
    deltas.sort(key=lambda d: -abs(d[2] - d[1]))
    top = []
    for t, before, after in deltas[:swings]:
        if after == before:
            break
        # The change happened between the earlier bin's start and the later bin's end.
        near = [c for c in causes if t - width <= c[0] <= t + width]
        cause, detail = (min(near, key=lambda c: abs(c[0] - t))[1:] if near
                         else ("unknown", "no failure, checkpoint, restart or stop within a bin"))
        top.append(PowerSwing(t, after - before, before, after, cause, detail))
    return PowerReport(len({(s.host, s.device) for s in samples}), width, tuple(series), tuple(top), sized)
