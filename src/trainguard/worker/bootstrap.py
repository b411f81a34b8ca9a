"""Automatic instrumentation's entry point: the folder the agent puts on ``PYTHONPATH``, and a post-import hook.

The folder (`site_dir`) holds a ``sitecustomize.py`` that Python's ``site`` module runs at start-up. When
``TRAINGUARD_AUTO=1`` and ``TRAINGUARD_AGENT_PID`` are set it loads this file and calls `install`, which
puts a finder at the front of ``sys.meta_path``. The finder does nothing until the script imports
``torch.optim`` or ``torch.distributed``; then it lets the normal loader run that module and calls
`trainguard.worker.autohooks.on_import` right after. Modules with checkpoint calls (`CHECKPOINT_MODULES`:
DCP, safetensors, Accelerate, Fabric) get their calls observed on import (`trainguard.worker.ckpt_entries`).
So a script that never imports torch pays only for reading two small files, and torch is never imported by
trainguard. The finder also watches the framework trainer modules (`FRAMEWORK_MODULES`, unless
``TRAINGUARD_FRAMEWORKS=0``): their import installs that framework's adapter (`trainguard.worker.frameworks`).

This module must stay cheap and self-contained: at start-up it is loaded by path (not as
``trainguard.worker.bootstrap``, which would import the ``trainguard`` package, ~50 ms) and it may
import nothing beyond what the interpreter has already loaded (``sys``, ``os``).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing alone costs more than all of start-up here
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any

WATCHED = ("torch.optim", "torch.distributed")
"""Modules after whose import the automatic hooks are installed."""
FRAMEWORK_MODULES = ("transformers.trainer", "lightning.pytorch.trainer.trainer", "pytorch_lightning.trainer.trainer")
"""Modules after whose import a framework adapter is installed (`trainguard.worker.frameworks.MODULES`)."""
CHECKPOINT_MODULES = ("torch.distributed.checkpoint", "safetensors.torch", "accelerate.accelerator",
                      "torch.distributed.checkpoint.state_dict", "lightning.fabric.fabric", "lightning_fabric.fabric")
"""Modules after whose import their checkpoint calls are observed (`trainguard.worker.ckpt_entries.MODULES`;
torch's own are wrapped with the hooks, after ``torch.optim``)."""
CHECKPOINT_ENV = "TRAINGUARD_CHECKPOINT_IO"
"""``0``: no checkpoint observation (`trainguard.worker.ckpt_io.ENV`)."""
FRAMEWORKS_ENV = "TRAINGUARD_FRAMEWORKS"
"""``0``: no framework adapters (`trainguard.worker.frameworks.ENV`)."""
OWNER_ENV = "TRAINGUARD_AUTO_OWNER_PID"
"""Set by the first instrumented process to its pid: processes it starts (data loader workers,
compile workers, checkpoint writers) inherit the environment but are not ranks, and stay untouched."""
MARKER = "_trainguard_post_import"


def site_dir() -> Path:
    """The folder to prefix to a worker's ``PYTHONPATH`` for automatic instrumentation."""
    from pathlib import Path

    return Path(__file__).resolve().parent / "_site"


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process should be instrumented: the agent asked for it and this is the rank itself."""
    env = os.environ if environ is None else environ
    if env.get("TRAINGUARD_AUTO") != "1" or not env.get("TRAINGUARD_AGENT_PID", "").isdigit():
        return False
    owner = env.get(OWNER_ENV, "")
    return owner in ("", str(os.getpid()))


class _PostImportLoader:
    """Runs the real loader, puts it back in the module's spec, then calls the hook."""

    def __init__(self, loader: Any, hook: Callable[[str, Any], None]) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: Any) -> Any:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        # After the import nothing shows the wrapper: inspect, linecache and reload see the real loader.
        module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader
        # The script's import must succeed whatever the hook does (contextlib is not loaded at start-up).
        try:  # noqa: SIM105
            self._hook(module.__name__, module)
        except Exception:
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class PostImportFinder:
    """A ``sys.meta_path`` finder that calls ``hook(name, module)`` after each watched module executes."""

    _trainguard_post_import = True

    def __init__(self, names: tuple[str, ...], hook: Callable[[str, Any], None]) -> None:
        self._names = frozenset(names)
        self._hook = hook
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self._names or fullname in self._busy:
            return None
        self._busy.add(fullname)  # the other finders may recurse into the import system
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is not None:
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PostImportLoader(spec.loader, self._hook)
        return spec

    def invalidate_caches(self) -> None:
        pass


def watched(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The modules the finder watches: torch's, the frameworks' unless ``TRAINGUARD_FRAMEWORKS=0``, and those
    with checkpoint calls unless ``TRAINGUARD_CHECKPOINT_IO=0``."""
    env = os.environ if environ is None else environ
    names = WATCHED if env.get(FRAMEWORKS_ENV, "1").strip() == "0" else WATCHED + FRAMEWORK_MODULES
    return names if env.get(CHECKPOINT_ENV, "1").strip() == "0" else names + CHECKPOINT_MODULES


def run_hooks(name: str, module: Any) -> None:
    """What the finder calls after a watched module executed: a framework adapter or the automatic hooks."""
    if name in FRAMEWORK_MODULES:
        from trainguard.worker import frameworks

        frameworks.on_import(name, module)
        return
    if name in CHECKPOINT_MODULES:
        from trainguard.worker import ckpt_entries

        ckpt_entries.on_import(name, module)
        return
    from trainguard.worker import autohooks

    autohooks.on_import(name, module)


def install(environ: Mapping[str, str] | None = None,
            hook: Callable[[str, Any], None] | None = None) -> bool:
    """Install the post-import finder if this process should be instrumented (idempotent)."""
    if not enabled(environ):
        return False
    if any(getattr(f, MARKER, False) for f in sys.meta_path):
        return True
    if environ is None:
        os.environ.setdefault(OWNER_ENV, str(os.getpid()))
        die_with_agent()
    sys.meta_path.insert(0, PostImportFinder(watched(environ), hook or run_hooks))
    return True


def die_with_agent() -> bool:
    """Have the kernel SIGKILL this rank when its agent dies, even by SIGKILL (``PR_SET_PDEATHSIG``).

    Only a direct child of the agent asks (a rank torch started; not a process the rank started itself). Costs
    ~3 ms (ctypes). True when it is set."""
    agent = os.environ.get("TRAINGUARD_AGENT_PID", "")
    if not sys.platform.startswith("linux") or not agent.isdigit() or os.getppid() != int(agent):
        return False
    return die_with_parent(int(agent))


def die_with_parent(parent: int) -> bool:
    """``PR_SET_PDEATHSIG`` SIGKILL for this process; True when it is set. The parent is checked again after the
    call: one that died just before it would otherwise leave this process running under init, so this process
    ends at once then."""
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG, SIGKILL
            return False
    except Exception:
        return False
    if os.getppid() != parent:  # the parent died between the fork (or the check) and the call
        os.kill(os.getpid(), 9)
    return True
