"""trainguard keeps large synchronous PyTorch training jobs training through failures.

The public API is what this module exports. Names that need torch are imported lazily on first use,
so ``import trainguard`` stays light for the pure analysis.
"""

from __future__ import annotations

import importlib
from typing import Any

from trainguard.errors import (
    EventFormatError,
    InputError,
    SchemaVersionError,
    StorageError,
    TrainguardError,
    UsageError,
)
from trainguard.eventlog import EventWriter, iter_events, read_events
from trainguard.events import SCHEMA_VERSION, Event
from trainguard.rundir import RunDir

__version__ = "0.1.0"

# name -> module that defines it; resolved on first attribute access (torch-dependent parts).
_LAZY: dict[str, str] = {
    "GoodputReport": "trainguard.goodput",
    "compute_goodput": "trainguard.goodput",
    "FleetDB": "trainguard.fleetdb",
    "attach": "trainguard.worker",
    "Checkpointer": "trainguard.checkpoint",
    "classify_paths": "trainguard.classify",
    "classify_text": "trainguard.classify",
    "HealthConfig": "trainguard.health",
    "run_checks": "trainguard.health",
    "diagnose_path": "trainguard.localize",
    "LocalizationReport": "trainguard.localize",
}

__all__ = [
    "SCHEMA_VERSION",
    "Event",
    "EventFormatError",
    "EventWriter",
    "InputError",
    "RunDir",
    "SchemaVersionError",
    "StorageError",
    "TrainguardError",
    "UsageError",
    "__version__",
    "iter_events",
    "read_events",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainguard' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
