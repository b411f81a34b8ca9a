"""Which observed saves and loads are checkpoints, and the step a loaded checkpoint holds: pure rules.

`trainguard.worker.ckpt_io` times every call of the public save/load entry points; these rules decide which of
those calls were checkpoints (a stall or a restore) and which were other files (an export, a small artefact,
a pretrained model read once). A call is a checkpoint when any of these holds:

1. the entry point only writes checkpoints (``torch.distributed.checkpoint``, ``Accelerator.save_state``,
   ``Fabric.save``, their loads): `EntryPoint.always`;
2. what is saved or loaded holds **optimizer state**: an optimizer's state dict (a mapping with ``state`` and
   ``param_groups``) or an optimizer object, at the top level or up to two levels down;
3. its **name** says so: the file's name has ``ckpt``/``checkpoint`` or a numbered ``step``/``iter``/``epoch``
   (``last.ckpt``, ``step-15.pt``, ``model_epoch3.pt``), or it lies in a folder numbered that way
   (``checkpoint-250/model.safetensors``);
4. it is **large**: at least `min_bytes` (``TRAINGUARD_CHECKPOINT_MIN_BYTES``, default 256 MiB).

Nothing here imports torch: objects are looked at by duck typing, and only their top levels (no tensor is
read or copied).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from trainguard.accounting.resume import step_in_name

MIN_BYTES_ENV = "TRAINGUARD_CHECKPOINT_MIN_BYTES"
DEFAULT_MIN_BYTES = 256 << 20
STEP_KEYS = ("global_step", "step", "iteration", "iter")
"""Top-level keys of a loaded checkpoint that give the step it holds, in this order."""
EPOCH_KEY = "epoch"
_NAME = re.compile(r"ckpt|checkpoint|epoch[-_=]?\d", re.IGNORECASE)
_ITEMS = 64
"""At most this many entries of each mapping level are looked at (a state dict has thousands)."""


def min_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The size from which any save or load counts as a checkpoint."""
    value = (os.environ if environ is None else environ).get(MIN_BYTES_ENV, "").strip()
    return int(value) if value.isdigit() and len(value) < 19 else DEFAULT_MIN_BYTES


def _parts(path: str) -> tuple[str, str]:
    """(file or folder name, the name of the folder it lies in)."""
    trimmed = path.rstrip("/\\")
    head, name = os.path.split(trimmed)
    return name, os.path.basename(head)


def checkpoint_name(path: str) -> bool:
    """Whether a path is named like a checkpoint (rule 3)."""
    if not path:
        return False
    name, parent = _parts(path)
    return bool(_NAME.search(name)) or step_in_name(name) is not None or step_in_name(parent) is not None


def step_in_path(path: str) -> int | None:
    """The step a checkpoint's name carries: its own name's, else its folder's (``step_15/optimizer.bin``)."""
    if not path:
        return None
    name, parent = _parts(path)
    step = step_in_name(name)
    return step if step is not None else step_in_name(parent)


def _is_optimizer_state(value: Any) -> bool:
    if isinstance(value, Mapping):
        return "param_groups" in value and "state" in value
    # an optimizer object (Fabric and Lightning save the objects and take their state dicts while saving)
    return hasattr(value, "param_groups") and callable(getattr(value, "state_dict", None)) and hasattr(value, "state")


def holds_optimizer_state(obj: Any, depth: int = 2) -> bool:
    """Whether ``obj`` is or holds (``depth`` levels of mappings down) an optimizer's state (rule 2)."""
    try:
        if _is_optimizer_state(obj):
            return True
        if depth <= 0 or not isinstance(obj, Mapping):
            return False
        for index, value in enumerate(obj.values()):
            if index >= _ITEMS:
                break
            if holds_optimizer_state(value, depth - 1):
                return True
    except Exception:  # an odd mapping must not cost the user's save
        return False
    return False


def _number(value: Any) -> int | float | None:
    """A Python number or a one-element CPU tensor's value; None otherwise (a GPU tensor would synchronize)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    device = getattr(value, "device", None)
    if getattr(device, "type", None) == "cpu" and callable(getattr(value, "numel", None)) and value.numel() == 1:
        out = value.item()
        return out if isinstance(out, (int, float)) and not isinstance(out, bool) else None
    return None


def step_in_content(*objs: Any) -> tuple[int | None, float | None]:
    """(step, epoch) from the top-level keys of the first of ``objs`` (mappings) that holds them."""
    step: int | None = None
    epoch: float | None = None
    for obj in objs:
        if not isinstance(obj, Mapping):
            continue
        try:
            if step is None:
                for key in STEP_KEYS:
                    value = _number(obj.get(key))
                    if value is not None and value >= 0 and float(value).is_integer():
                        step = int(value)
                        break
            if epoch is None:
                value = _number(obj.get(EPOCH_KEY))
                epoch = float(value) if value is not None and value >= 0 else None
        except Exception:
            continue
    return step, epoch


def is_checkpoint(*, always: bool, content: tuple[Any, ...], path: str, nbytes: int,
                  environ: Mapping[str, str] | None = None) -> str:
    """Why a save or load is a checkpoint (``entry``, ``optimizer state``, ``name``, ``size``); ``""``: it is not."""
    if always:
        return "entry"
    if any(holds_optimizer_state(obj) for obj in content):
        return "optimizer state"
    if checkpoint_name(path):
        return "name"
    if nbytes >= min_bytes(environ):
        return "size"
    return ""
