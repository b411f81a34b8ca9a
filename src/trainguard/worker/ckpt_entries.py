"""The public save and load calls that are observed (`trainguard.worker.ckpt_io`), and their wrapping.

The bootstrap calls `on_import` right after the script imports one of `MODULES` (``torch`` itself through
``torch.optim``); the calls of that module listed in `ENTRIES` are then replaced by wrappers that run the
original through `trainguard.worker.ckpt_io.call`. The frameworks' own checkpoint calls that wrap torch's
(``Fabric.save``, ``Accelerator.save_state``) are entries of their own: their whole duration (gathering the
state, writing, the barrier after) is the save, and the torch or safetensors calls inside count once, as part
of them. ``nn.Module.load_state_dict``, ``Optimizer.load_state_dict`` and DCP's ``set_state_dict`` family
are wrapped too (`APPLY`): applying what a restore loaded is part of the restore; so is DCP's ``get_state_dict``
family (`PREPARE`): building the state a save writes or a load fills is part of that save or restore.

A wrapper keeps the original's name and docstring (``functools.wraps``) and carries `MARK`, so nothing is
wrapped twice; a module whose attribute is missing (another version) is skipped with a debug line.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from trainguard.worker import ckpt_io
from trainguard.worker.ckpt_io import EntryPoint

log = logging.getLogger(__name__)

MARK = "_trainguard_ckpt_io"

_TORCH_SAVE = EntryPoint("torch.save", "save", "torch", path=((1, "f"),), content=((0, "obj"),))
_TORCH_LOAD = EntryPoint("torch.load", "load", "torch", path=((0, "f"),))
_DCP_PATH = ((-1, "checkpoint_id"), (-1, "storage_writer"), (-1, "storage_reader"))
_DCP_STATE = ((0, "state_dict"),)
_FABRIC_SAVE = EntryPoint("fabric.save", "save", "fabric", path=((1, "path"),), content=((2, "state"),), always=True)
_FABRIC_LOAD = EntryPoint("fabric.load", "load", "fabric", path=((1, "path"),), content=((2, "state"),), always=True)

ENTRIES: dict[str, tuple[tuple[str, EntryPoint], ...]] = {
    "torch.optim": (("torch.serialization.save", _TORCH_SAVE), ("torch.save", _TORCH_SAVE),
                    ("torch.serialization.load", _TORCH_LOAD), ("torch.load", _TORCH_LOAD)),
    # The package's names only: DCP's async_save calls its module's own `save` in a background thread, which must
    # stay unwrapped (that write is the async save's background part, not a second, blocking save).
    "torch.distributed.checkpoint": tuple(
        (f"torch.distributed.checkpoint.{name}",
         EntryPoint(f"dcp.{name}", kind, "torch", path=_DCP_PATH, content=_DCP_STATE, always=True))
        for name, kind in (("save", "save"), ("async_save", "save"), ("load", "load"))),
    "safetensors.torch": (
        ("safetensors.torch.save_file", EntryPoint("safetensors.save_file", "save", "safetensors",
                                                   path=((1, "filename"),), content=((0, "tensors"),))),
        ("safetensors.torch.load_file", EntryPoint("safetensors.load_file", "load", "safetensors",
                                                   path=((0, "filename"),))),
        ("safetensors.torch.save_model", EntryPoint("safetensors.save_model", "save", "safetensors",
                                                    path=((1, "filename"),))),
        ("safetensors.torch.load_model", EntryPoint("safetensors.load_model", "load", "safetensors",
                                                    path=((1, "filename"),)))),
    "accelerate.accelerator": (
        ("accelerate.accelerator.Accelerator.save_state",
         EntryPoint("accelerate.save_state", "save", "accelerate", path=((1, "output_dir"),), always=True,
                    result_is_path=True)),
        ("accelerate.accelerator.Accelerator.load_state",
         EntryPoint("accelerate.load_state", "load", "accelerate", path=((1, "input_dir"),), always=True))),
    "torch.distributed.checkpoint.state_dict": (),
    "lightning.fabric.fabric": (("lightning.fabric.fabric.Fabric.save", _FABRIC_SAVE),
                                ("lightning.fabric.fabric.Fabric.load", _FABRIC_LOAD)),
    "lightning_fabric.fabric": (("lightning_fabric.fabric.Fabric.save", _FABRIC_SAVE),
                                ("lightning_fabric.fabric.Fabric.load", _FABRIC_LOAD)),
}
"""Module whose import installs wrappers -> (dotted attribute to wrap, what the call is)."""
APPLY: dict[str, tuple[str, ...]] = {
    "torch.optim": ("torch.nn.modules.module.Module.load_state_dict",
                    "torch.optim.optimizer.Optimizer.load_state_dict"),
    "torch.distributed.checkpoint.state_dict": tuple(
        f"torch.distributed.checkpoint.state_dict.{name}"
        for name in ("set_state_dict", "set_model_state_dict", "set_optimizer_state_dict")),
}
"""Module -> the calls that apply a loaded state: part of a restore when handed what it loaded
(`trainguard.worker.ckpt_io.applied`)."""
PREPARE: dict[str, tuple[str, ...]] = {
    "torch.distributed.checkpoint.state_dict": tuple(
        f"torch.distributed.checkpoint.state_dict.{name}"
        for name in ("get_state_dict", "get_model_state_dict", "get_optimizer_state_dict")),
}
"""Module -> the calls that build the state a save writes or a load fills (`trainguard.worker.ckpt_io.prepared`)."""
MODULES = tuple(ENTRIES)
_wrapped: list[tuple[Any, str, Any]] = []
"""(owner, attribute, original) of everything wrapped, for `uninstall`."""


def _wrapper(original: Callable[..., Any], spec: EntryPoint) -> Callable[..., Any]:
    @functools.wraps(original)
    def observed(*args: Any, **kwargs: Any) -> Any:
        return ckpt_io.call(spec, original, args, kwargs)

    setattr(observed, MARK, True)
    return observed


def _apply_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def apply(*args: Any, **kwargs: Any) -> Any:
        return ckpt_io.applied((*args, *kwargs.values()), original, args, kwargs)

    setattr(apply, MARK, True)
    return apply


def _owner(dotted: str) -> tuple[Any, str] | None:
    """(the module or class holding the attribute, its name), from the modules already imported."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        owner: Any = module
        for name in parts[cut:-1]:
            owner = getattr(owner, name, None)
            if owner is None:
                return None
        return owner, parts[-1]
    return None


def wrap(dotted: str, spec: EntryPoint) -> bool:
    """Replace ``dotted`` (``torch.save``, ``accelerate.accelerator.Accelerator.save_state``) by its wrapper."""
    found = _owner(dotted)
    if found is None:
        log.debug("trainguard: %s not found; not observed", dotted)
        return False
    owner, name = found
    original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if not callable(original):
        log.debug("trainguard: %s not found; not observed", dotted)
        return False
    if not getattr(original, MARK, False):
        setattr(owner, name, _wrapper(original, spec))
        _wrapped.append((owner, name, original))
    return True


def _prepare_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def prepare(*args: Any, **kwargs: Any) -> Any:
        return ckpt_io.prepared(original, args, kwargs)

    setattr(prepare, MARK, True)
    return prepare


def _wrap_with(dotted: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    found = _owner(dotted)
    if found is None:
        return
    owner, name = found
    original = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if callable(original) and not getattr(original, MARK, False):
        setattr(owner, name, make(original))
        _wrapped.append((owner, name, original))


def on_import(name: str, module: ModuleType) -> bool:
    """Wrap the entries of the just-imported module ``name``; never raises."""
    entries = ENTRIES.get(name)
    if entries is None or not ckpt_io.enabled():
        return False
    try:
        for dotted, spec in entries:
            wrap(dotted, spec)
        for dotted in APPLY.get(name, ()):
            _wrap_with(dotted, _apply_wrapper)
        for dotted in PREPARE.get(name, ()):
            _wrap_with(dotted, _prepare_wrapper)
        if name == "torch.optim":
            # The process's exit ends a restore that no optimizer step ended (atexit runs last-registered first,
            # so this comes before the runtime closes its event file).
            import atexit

            atexit.unregister(ckpt_io.close_episode)
            atexit.register(ckpt_io.close_episode)
        return True
    except Exception as exc:  # observation must never break the script's import
        log.warning("trainguard: checkpoint calls of %s not observed (%s)", name, exc)
        return False


def uninstall() -> None:
    """Put every wrapped call back (tests, and anyone embedding trainguard in a long-lived process)."""
    while _wrapped:
        owner, name, original = _wrapped.pop()
        setattr(owner, name, original)
    ckpt_io.reset()
