"""Cluster failure simulation and checkpoint/spares planning (pure analysis: numpy, no torch).

`load_model` reads a failure model (built-in ``llama3``, ``rsc1``, ``rsc2`` or a TOML file),
`simulate` runs Monte Carlo trials, `write_trial` writes one trial as a run directory, `find_frontier`
finds the (stall, restart time, recovery scheme) combinations that reach a target ETTR. Errors are
the domain errors of `trainguard.sim.errors`.
"""

from trainguard.accounting.goodput import BUCKETS  # the badput buckets of trainguard.accounting.goodput, one definition
from trainguard.sim.engine import SimResult, simulate
from trainguard.sim.errors import CalibrationError, ModelError, ModelFileError, SimConfigError, SimError
from trainguard.sim.events_out import write_trial
from trainguard.sim.frontier import Frontier, FrontierConfig, FrontierPoint, find_frontier
from trainguard.sim.models import FailureCategory, FailureModel, builtin_models, load_model, parse_model
from trainguard.sim.policy import JobConfig, PolicyConfig

__all__ = [
    "BUCKETS",
    "CalibrationError",
    "FailureCategory",
    "FailureModel",
    "Frontier",
    "FrontierConfig",
    "FrontierPoint",
    "JobConfig",
    "ModelError",
    "ModelFileError",
    "PolicyConfig",
    "SimConfigError",
    "SimError",
    "SimResult",
    "builtin_models",
    "find_frontier",
    "load_model",
    "parse_model",
    "simulate",
    "write_trial",
]
