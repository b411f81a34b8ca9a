"""Power model: per-GPU draw by job state -> the cluster's draw over time and its largest swing.

GPU board power only (H100 SXM, 700 W TDP); hosts, network and cooling add a roughly constant load
that does not change the swings much. Figures are assumptions documented in docs/simulation.md.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # reports use this module without loading numpy
    import numpy as np


@dataclass(frozen=True)
class PowerModel:
    """Per-GPU draw in watts for each state of a synchronous job."""

    computing_watts: float = 700.0
    """Dense compute phases of a step (H100 SXM at its 700 W TDP)."""
    collective_wait_watts: float = 300.0
    """Waiting in a collective inside a step (exposed communication, pipeline bubbles)."""
    collective_wait_fraction: float = 0.1
    """Share of each step spent waiting in collectives."""
    checkpointing_watts: float = 150.0
    """Training stopped for a checkpoint stall (copying state to host memory)."""
    restarting_watts: float = 90.0
    """Idle: failure detection, relaunch, startup, restore, waiting for a node."""

    @property
    def step_average_watts(self) -> float:
        f = self.collective_wait_fraction
        return (1 - f) * self.computing_watts + f * self.collective_wait_watts

    def swings_mw(self, gpus: int) -> dict[str, float]:
        """Largest step change of cluster draw, MW, for each kind of transition."""
        mw = gpus / 1e6
        return {
            "failure_or_stop": mw * (self.computing_watts - self.restarting_watts),
            "checkpoint_stall": mw * (self.computing_watts - self.checkpointing_watts),
            "collective_wait": mw * (self.computing_watts - self.collective_wait_watts),
        }


def summarize(power: PowerModel, gpus: int, computing_fraction: np.ndarray, checkpoint_fraction: np.ndarray,
              had_failures: bool, had_checkpoints: bool) -> dict[str, Any]:
    """The ``power`` section of the simulate JSON: mean draw, state draws and the largest swing."""
    mw = gpus / 1e6
    idle = 1.0 - computing_fraction - checkpoint_fraction
    mean = mw * (computing_fraction * power.step_average_watts + checkpoint_fraction * power.checkpointing_watts
                 + idle * power.restarting_watts)
    swings = power.swings_mw(gpus)
    occurring = {"collective_wait": swings["collective_wait"] if power.collective_wait_fraction > 0 else 0.0}
    if had_failures:
        occurring["failure_or_stop"] = swings["failure_or_stop"]
    if had_checkpoints:
        occurring["checkpoint_stall"] = swings["checkpoint_stall"]
    cause = max(occurring, key=lambda k: occurring[k])
    return {
        "computing_mw": mw * power.computing_watts,
        "collective_wait_mw": mw * power.collective_wait_watts,
        "checkpointing_mw": mw * power.checkpointing_watts,
        "restarting_mw": mw * power.restarting_watts,
        "mean_mw": float(mean.mean()),
        "swings_mw": occurring,
        "largest_swing_mw": occurring[cause],
        "largest_swing_cause": cause,
    }


def draw_series(states: list[tuple[float, str]], power: PowerModel, gpus: int) -> list[tuple[float, float]]:
    """Cluster draw as a step function [(time, MW)] from time-ordered (start, state) marks of one trial.

    States: ``computing`` (steps, at the step-average draw), ``waiting`` (hung in a collective),
    ``checkpointing`` and ``restarting`` (idle). Marks at the same time keep only the last one.
    """
    watts = {"computing": power.step_average_watts, "waiting": power.collective_wait_watts,
             "checkpointing": power.checkpointing_watts, "restarting": power.restarting_watts}
    out: list[tuple[float, float]] = []
    for start, state in states:
        value = gpus * watts[state] / 1e6
        while out and out[-1][0] >= start:
            out.pop()
        if not out or out[-1][1] != value:
            out.append((start, value))
    return out


def largest_swing(series: list[tuple[float, float]]) -> float:
    """Largest step change (MW) between consecutive levels of a draw series."""
    return max((abs(b[1] - a[1]) for a, b in itertools.pairwise(series)), default=0.0)
