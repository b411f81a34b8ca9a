"""trainguard keeps large synchronous PyTorch training jobs training through failures.

The public API is what this module exports; a training script needs only ``trainguard.attach``,
``trainguard.Checkpointer``, ``trainguard.CheckpointConfig``, ``trainguard.IntervalPolicy`` and
``trainguard.pg_timeout`` (docs/worker.md), and ``trainguard.restartable`` for in-process restart, with
``trainguard.Replica`` to heal new ranks from a live peer (docs/run.md). Every name is imported on first use:
the automatic instrumentation imports parts of this package into every worker when torch loads, so
``import trainguard`` itself must cost next to nothing (and nothing here may import torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time `__getattr__` resolves these lazily
    from trainguard.accounting.goodput import GoodputReport, compute_goodput
    from trainguard.checkpoint import CheckpointConfig, Checkpointer, IntervalPolicy
    from trainguard.classify import classify_paths, classify_text
    from trainguard.core.eventlog import EventWriter, iter_events, read_events
    from trainguard.core.events import SCHEMA_VERSION, Event
    from trainguard.core.rundir import RunDir
    from trainguard.errors import (
        CheckpointError,
        EventFormatError,
        InputError,
        SchemaVersionError,
        StorageError,
        TrainguardError,
        UsageError,
    )
    from trainguard.health import HealthConfig, run_checks
    from trainguard.health.fleetdb import FleetDB
    from trainguard.localize import LocalizationReport, diagnose_path
    from trainguard.worker import StepContext, Worker, attach, pg_timeout
    from trainguard.worker.inprocess import restartable
    from trainguard.worker.replica import Replica

__version__ = "0.1.0"

# name -> module that defines it; resolved on first attribute access.
_LAZY: dict[str, str] = {
    "SCHEMA_VERSION": "trainguard.core.events",
    "Event": "trainguard.core.events",
    "EventFormatError": "trainguard.errors",
    "InputError": "trainguard.errors",
    "SchemaVersionError": "trainguard.errors",
    "StorageError": "trainguard.errors",
    "TrainguardError": "trainguard.errors",
    "UsageError": "trainguard.errors",
    "EventWriter": "trainguard.core.eventlog",
    "iter_events": "trainguard.core.eventlog",
    "read_events": "trainguard.core.eventlog",
    "RunDir": "trainguard.core.rundir",
    "GoodputReport": "trainguard.accounting.goodput",
    "compute_goodput": "trainguard.accounting.goodput",
    "FleetDB": "trainguard.health.fleetdb",
    "attach": "trainguard.worker",
    "pg_timeout": "trainguard.worker",
    "Worker": "trainguard.worker",
    "StepContext": "trainguard.worker",
    "restartable": "trainguard.worker.inprocess",
    "Replica": "trainguard.worker.replica",
    "Checkpointer": "trainguard.checkpoint",
    "CheckpointConfig": "trainguard.checkpoint",
    "CheckpointError": "trainguard.errors",
    "IntervalPolicy": "trainguard.checkpoint",
    "classify_paths": "trainguard.classify",
    "classify_text": "trainguard.classify",
    "HealthConfig": "trainguard.health",
    "run_checks": "trainguard.health",
    "diagnose_path": "trainguard.localize",
    "LocalizationReport": "trainguard.localize",
}

__all__ = [
    "SCHEMA_VERSION",
    "CheckpointConfig",
    "CheckpointError",
    "Checkpointer",
    "Event",
    "EventFormatError",
    "EventWriter",
    "FleetDB",
    "GoodputReport",
    "HealthConfig",
    "InputError",
    "IntervalPolicy",
    "LocalizationReport",
    "Replica",
    "RunDir",
    "SchemaVersionError",
    "StepContext",
    "StorageError",
    "TrainguardError",
    "UsageError",
    "Worker",
    "__version__",
    "attach",
    "classify_paths",
    "classify_text",
    "compute_goodput",
    "diagnose_path",
    "iter_events",
    "pg_timeout",
    "read_events",
    "restartable",
    "run_checks",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
