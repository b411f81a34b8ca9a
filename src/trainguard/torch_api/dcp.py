"""DCP's private flattening of a nested state dict, with trainguard's own fallback.

DCP stores a nested state dict under flat names (``model.layer.weight``); a restore that checks the stored
entries before loading needs the same names. torch does this in ``torch.distributed.checkpoint._nested_dict``
(no public equivalent in 2.11-2.14); when that module is gone, the fallback below follows the same rules:
mappings are walked, a list is walked when it holds a tensor or a container worth walking, every other value
is a leaf, and names are the path's parts joined by dots.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _private_flatten() -> Any:
    try:
        from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    except ImportError:
        return None
    return flatten_state_dict


def flatten_state_dict(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(flat, mapping)`` as DCP's ``flatten_state_dict`` returns them."""
    fn = _private_flatten()
    if fn is not None:
        return fn(state)
    return own_flatten(state)


def _is_leaf(value: Any) -> bool:
    import torch

    if isinstance(value, Mapping):
        return False
    if not isinstance(value, list):
        return True
    return not any(isinstance(v, torch.Tensor) or (isinstance(v, Mapping | list) and not _is_leaf(v))
                   for v in value)


def own_flatten(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """DCP's flattening without DCP: ``(flat name -> value, flat name -> path of keys and indices)``."""
    flat: dict[str, Any] = {}
    mapping: dict[str, Any] = {}

    def walk(value: Any, path: tuple[str | int, ...]) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, (*path, str(k)))
        elif _is_leaf(value):
            name = ".".join(map(str, path))
            if name in flat:
                raise ValueError(f"duplicated flatten key {name}")
            flat[name] = value
            mapping[name] = path
        else:
            for i, v in enumerate(value):
                walk(v, (*path, i))

    for key, value in state.items():
        walk(value, (str(key),))
    return flat, mapping


def has_private_flatten() -> bool:
    """Whether torch's own flattening is there (else `own_flatten` is used)."""
    return _private_flatten() is not None
