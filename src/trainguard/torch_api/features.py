"""Which torch features trainguard builds on the installed torch offers, found by looking, not by version.

`probe` returns one `Feature` per capability; a missing one carries the single line the launcher prints at
start and records in ``RunStarted.config["torch_features"]``. Everything here is cheap (attribute and import
checks, no process group) and never raises.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from dataclasses import dataclass
from functools import cache

from trainguard.torch_api import SUPPORTED

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Feature:
    """One capability and whether this torch has it."""

    name: str
    """Short identifier (``launch``, ``flight_recorder``, ...), as in docs/compatibility.md."""
    available: bool
    """Whether it works on the installed torch."""
    without: str
    """What trainguard does without it (said once at start when ``available`` is False)."""


@dataclass(frozen=True)
class TorchSupport:
    """The installed torch as trainguard sees it."""

    version: str
    """``torch.__version__``."""
    in_range: bool
    """Whether the version is in the supported range (`trainguard.torch_api.SUPPORTED`)."""
    features: tuple[Feature, ...]
    """Every capability checked."""

    def missing(self) -> list[Feature]:
        """The capabilities this torch lacks."""
        return [f for f in self.features if not f.available]

    def summary_lines(self) -> list[str]:
        """One line per problem, for the console at start (empty when all is well)."""
        lines = [f"torch {self.version} lacks {f.name}: {f.without}" for f in self.missing()]
        if not self.in_range:
            lines.insert(0, f"torch {self.version} is outside the supported range {SUPPORTED}; "
                            "features are checked one by one below")
        return lines

    def to_json(self) -> dict[str, object]:
        """For ``RunStarted.config``: the version and each feature's availability."""
        return {"version": self.version, "in_range": self.in_range,
                "features": {f.name: f.available for f in self.features}}


def _has(module: str, *names: str) -> bool:
    try:
        mod = importlib.import_module(module)
    except Exception:  # a broken or absent module is a missing feature, never a crash
        return False
    obj: object = mod
    for name in names:
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def _defines(module: str, name: str) -> bool:
    """Whether ``module``'s source defines function ``name``, read from its file without importing it (importing
    ``torch.distributed.checkpoint`` costs the launcher 0.5-1 s at start, for a module only the workers use)."""
    try:
        # find_spec of a submodule imports its packages: find the file from torch's folder instead
        root = importlib.import_module(module.split(".")[0])
        path = os.path.join(os.path.dirname(str(root.__file__)), *module.split(".")[1:]) + ".py"
        if not os.path.isfile(path):
            return _has(module, name)
        with open(path, encoding="utf-8") as f:
            return f"\ndef {name}(" in f.read()
    except Exception:  # unreadable: a missing feature, never a crash
        return False


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _in_range(version: str) -> bool:
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        return Version(version.split("+")[0]) in SpecifierSet(SUPPORTED)
    except ImportError:  # a source checkout without packaging: compare major.minor by hand
        low, high = (tuple(int(x) for x in part.strip(">=<").split(".")) for part in SUPPORTED.split(","))
        try:
            have = tuple(int(x) for x in version.split("+")[0].split(".")[:2])
        except ValueError:
            return False
        return low <= have < high
    except Exception:  # an odd version string: say out of range, keep going
        return False


def _launch_hooks() -> bool:
    try:
        from trainguard.torch_api.elastic import missing_hooks

        return not missing_hooks()
    except Exception:
        return False


def _dynamic(*names: str) -> bool:
    return _has("torch.distributed.elastic.rendezvous.dynamic_rendezvous", *names)


def _handler_keeps(*attributes: str) -> bool:
    """Whether the dynamic rendezvous handler sets these instance attributes (read from torch's source)."""
    try:
        import inspect

        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

        source = inspect.getsource(DynamicRendezvousHandler)
    except Exception:
        return False
    return all(f"self.{a}" in source for a in attributes)


def _leave() -> bool:
    return (_has("torch.distributed.elastic.rendezvous.dynamic_rendezvous", "_RendezvousExitOp")
            and _dynamic("DynamicRendezvousHandler", "_stop_heartbeats"))


@cache
def probe() -> TorchSupport:
    """Check every capability once per process."""
    import torch

    c10d = "torch._C._distributed_c10d"
    features = (
        Feature("launch", _launch_hooks(),
                "trainguard run cannot supervise workers (the elastic agent's hooks moved); use torchrun"),
        Feature("auto_instrumentation", _has("torch.optim.optimizer", "register_optimizer_step_post_hook"),
                "unmodified scripts send no step progress; only scripts that call trainguard.attach() do"),
        Feature("flight_recorder", _has(c10d, "_dump_fr_trace"),
                "hang evidence has stacks but no flight-recorder dumps; localization falls back to heartbeats"),
        Feature("flight_recorder_json", _has(c10d, "_dump_fr_trace_json"),
                "no collective counters from unmodified scripts; hangs are found from step progress only"),
        Feature("dcp_async", _defines("torch.distributed.checkpoint.state_dict_saver", "async_save"),
                "checkpoints are saved synchronously"),
        Feature("process_group_abort", _has("torch.distributed.distributed_c10d", "_abort_process_group"),
                "in-process restart on NCCL destroys the group instead of aborting it (may wait for timeouts)"),
        Feature("rendezvous_leave", _leave(),
                "an excluded node leaves the rendezvous at its keep-alive timeout (~15 s), not at once"),
        Feature("spare_count", _handler_keeps("_state_holder", "_heartbeat_lock"),
                "straggler policy restart-now falls back to exclude-next-restart"),
        Feature("warm_restart", _has("torch.distributed.elastic.multiprocessing.api", "get_subprocess_handler"),
                "whole-process restarts start cold interpreters (warm spares serve in-process restarts only)"),
    )
    support = TorchSupport(version=str(torch.__version__), in_range=_in_range(str(torch.__version__)),
                           features=features)
    for line in support.summary_lines():
        log.debug("%s", line)
    return support


def nccl_flight_recorder() -> bool:
    """Whether this build has NCCL's own recorder (CUDA builds); informational, not a missing feature."""
    return _has("torch._C._distributed_c10d", "_dump_nccl_trace")


def prewarm_available(name: str) -> bool:
    """Whether module ``name`` (one of `trainguard.torch_api.c10d.PREWARM_MODULES`) can be imported."""
    return _module_exists(name)
