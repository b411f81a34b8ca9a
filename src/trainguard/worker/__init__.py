"""In-rank side of trainguard: `attach()` for scripts, automatic hooks for scripts that never import it.

Public as ``trainguard.attach()``. See docs/run.md and docs/worker.md. The submodules load lazily so that
``trainguard.worker.bootstrap`` (imported by the agent for `site_dir`) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time `__getattr__` imports the library on first use
    from trainguard.worker.library import StepContext, Worker, attach, pg_timeout

__all__ = ["StepContext", "Worker", "attach", "pg_timeout"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("trainguard.worker.library"), name)
    raise AttributeError(f"module 'trainguard.worker' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
