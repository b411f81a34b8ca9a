"""How a training state maps onto DCP keys and onto the manifest's ``structure`` (keys, shapes, dtypes).

DCP flattens nested dicts and lists into dotted keys (dict keys become strings). The manifest records,
for every flattened key, whether it is a tensor (with shape and dtype) or a pickled Python object;
restore compares that with the state it is asked to fill and writes non-tensor values back into the
caller's containers (tensors are loaded in place).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

RANK_LOCAL_KEY = "rank_local"
"""Entry of ``state`` that differs per rank (RNG, data position): saved and restored per rank."""
RANK_LOCAL_STORED = "__rank_local__"
"""Top-level DCP key under which ``state["rank_local"]`` is stored, as ``{str(rank): value}``."""


def describe(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Structure of a flattened state (what the caller wants filled)."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        if isinstance(value, torch.Tensor):
            out[key] = {"kind": "tensor", "shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
        else:
            out[key] = {"kind": "object"}
    return out


def saved_structure(metadata: Any) -> dict[str, dict[str, Any]]:
    """Structure of a saved checkpoint, from DCP's global ``Metadata``."""
    out: dict[str, dict[str, Any]] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        if hasattr(md, "size") and hasattr(md, "properties"):
            dtype = str(md.properties.dtype).removeprefix("torch.")
            out[fqn] = {"kind": "tensor", "shape": list(md.size), "dtype": dtype}
        else:
            out[fqn] = {"kind": "object"}
    return out


def assign(root: Any, path: tuple[Any, ...], value: Any) -> None:
    """Set ``value`` at ``path`` (keys as DCP flattened them: str for dict keys) inside ``root``."""
    cur = root
    for i, key in enumerate(path):
        if isinstance(cur, dict):
            real = key if key in cur else next((k for k in cur if str(k) == str(key)), key)
        else:
            real = int(key)
        if i == len(path) - 1:
            if isinstance(cur, tuple):
                log.warning("cannot restore %s inside a tuple", ".".join(map(str, path)))
                return
            cur[real] = value
        else:
            cur = cur[real]


def tensor_bytes(flat: dict[str, Any]) -> int:
    """Bytes of the tensors in a flattened state."""
    return sum(v.numel() * v.element_size() for v in flat.values() if isinstance(v, torch.Tensor))
