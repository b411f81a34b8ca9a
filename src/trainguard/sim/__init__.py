"""Cluster failure simulation and checkpoint/spares planning (pure analysis: numpy, no torch).

`load_model` reads a failure model (built-in ``llama3``, ``rsc1``, ``rsc2`` or a TOML file),
`simulate` runs Monte Carlo trials, `write_trial` writes one trial as a run directory.
"""

from trainguard.sim.engine import BUCKETS, SimResult, simulate
from trainguard.sim.events_out import write_trial
from trainguard.sim.models import FailureCategory, FailureModel, builtin_models, load_model, parse_model
from trainguard.sim.policy import JobConfig, PolicyConfig

__all__ = [
    "BUCKETS",
    "FailureCategory",
    "FailureModel",
    "JobConfig",
    "PolicyConfig",
    "SimResult",
    "builtin_models",
    "load_model",
    "parse_model",
    "simulate",
    "write_trial",
]
