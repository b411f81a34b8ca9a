"""Seeded fuzzing of a real checkpoint's manifest: restore never raises, never hangs, never loads bad data.

A real two-step checkpoint directory (DCP shards written by `Checkpointer`) is copied for every example
and the newest step's manifest is mutated: types, bounds, paths, truncation, bit flips, symlinks,
FIFOs. Restore must return the newest step with its exact values (the mutation was harmless) or the
older one with its exact values. Hypothesis runs derandomized, so every run tries the same cases.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from trainguard.checkpoint import CheckpointConfig, Checkpointer, latest_step

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

PLACEHOLDER = "@@fuzz@@"


def _value(step: int) -> torch.Tensor:
    return torch.arange(8.0) * (step + 1) + step


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ckpt/`` with steps 1 and 2, and ``outside/step-2``: a valid checkpoint with other values."""
    root = tmp_path_factory.mktemp("fuzz")
    with Checkpointer(root / "ckpt", CheckpointConfig(async_save=False, keep_last=10)) as ckpt:
        ckpt.save(1, {"x": _value(1), "meta": {"step": 1}})
        ckpt.save(2, {"x": _value(2), "meta": {"step": 2}})
    with Checkpointer(root / "outside", CheckpointConfig(async_save=False)) as other:
        other.save(2, {"x": _value(99), "meta": {"step": 99}})
    return root


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every location in a JSON tree (keys and list indexes), parents before children."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


RAW_VALUES = [
    '"yesterday"',
    '""',
    '"../../etc/hostname"',
    '"../../../../dev/zero"',
    '"/dev/zero"',
    '"' + "a" * 100_000 + '"',
    "-1",
    "0",
    "1.5",
    "1e400",
    "-1e400",
    "NaN",
    "Infinity",
    "9" * 5000,
    str(2**64),
    str(2**63),
    "null",
    "true",
    "false",
    "[]",
    "{}",
    "[" * 100_000 + "]" * 100_000,
    '{"size": 1, "checksum": "00"}',
    '{"kind": "tensor", "shape": [8], "dtype": "float64"}',
    '{"kind": "object"}',
    '"crc32"',
    '"blake9"',
    "[-8]",
]

NAMES = ["../../etc/hostname", "../../../../dev/zero", "/etc/passwd", "../outside/step-2/.metadata", "", ".", "a/b"]


@st.composite
def mutations(draw: st.DrawFn, manifest: dict[str, Any]) -> tuple[str, Any]:
    kind = draw(st.sampled_from(["replace", "replace", "delete", "rename", "bytes", "path", "path"]))
    locations = [p for p in _paths(manifest) if p]
    if kind == "replace":
        where = draw(st.sampled_from(locations))
        raw = draw(st.one_of(st.sampled_from(RAW_VALUES), st.integers(-(2**70), 2**70).map(str)))
        return kind, (where, raw)
    if kind == "delete":
        return kind, draw(st.sampled_from(locations))
    if kind == "rename":
        name = draw(st.sampled_from(sorted(manifest["files"])))
        return kind, (name, draw(st.sampled_from(NAMES)))
    if kind == "bytes":
        op = draw(st.sampled_from(["truncate", "flip", "insert"]))
        return kind, (op, draw(st.integers(0, 10**6)), draw(st.integers(0, 7)), draw(st.binary(min_size=1, max_size=8)))
    return kind, draw(st.sampled_from(["manifest->/dev/zero", "manifest fifo", "step->outside", "shard->outside"]))


def _set(tree: Any, where: tuple[Any, ...], value: Any) -> None:
    for key in where[:-1]:
        tree = tree[key]
    tree[where[-1]] = value


def _delete(tree: Any, where: tuple[Any, ...]) -> None:
    for key in where[:-1]:
        tree = tree[key]
    del tree[where[-1]]


def _mutate(ckpt: Path, outside: Path, mutation: tuple[str, Any]) -> None:
    step_dir = ckpt / "step-2"
    path = step_dir / "manifest.json"
    text = path.read_text()
    data = json.loads(text)
    kind, arg = mutation
    if kind == "replace":
        where, raw = arg
        _set(data, where, PLACEHOLDER)
        path.write_text(json.dumps(data).replace(json.dumps(PLACEHOLDER), raw))
    elif kind == "delete":
        _delete(data, arg)
        path.write_text(json.dumps(data))
    elif kind == "rename":
        old, new = arg
        data["files"][new] = data["files"].pop(old)
        path.write_text(json.dumps(data))
    elif kind == "bytes":
        op, offset, bit, extra = arg
        raw = bytearray(path.read_bytes())
        offset %= len(raw)
        if op == "truncate":
            raw = raw[:offset]
        elif op == "flip":
            raw[offset] ^= 1 << bit
        else:
            raw[offset:offset] = extra
        path.write_bytes(bytes(raw))
    elif arg == "manifest->/dev/zero":
        path.unlink()
        path.symlink_to("/dev/zero")
    elif arg == "manifest fifo":
        path.unlink()
        os.mkfifo(path)
    elif arg == "step->outside":
        shutil.rmtree(step_dir)
        step_dir.symlink_to(outside / "step-2", target_is_directory=True)
    else:  # one shard replaced by a symlink to the outside checkpoint's shard
        (step_dir / "__0_0.distcp").unlink()
        (step_dir / "__0_0.distcp").symlink_to(outside / "step-2" / "__0_0.distcp")


def _pristine_manifest(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / "ckpt" / "step-2" / "manifest.json").read_text())
    return data


@pytest.fixture(scope="module")
def manifest(pristine: Path) -> dict[str, Any]:
    return _pristine_manifest(pristine)


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_mutated_manifests_never_break_restore(pristine: Path, manifest: dict[str, Any], data: st.DataObject) -> None:
    mutation = data.draw(mutations(manifest), label="mutation")
    with tempfile.TemporaryDirectory(dir=pristine) as tmp:
        ckpt = Path(tmp) / "ckpt"
        shutil.copytree(pristine / "ckpt", ckpt, symlinks=True, ignore=shutil.ignore_patterns(".trainguard.lock"))
        _mutate(ckpt, pristine / "outside", mutation)
        assert latest_step(ckpt) in (1, 2)  # the no-process-group check must not raise either
        state: dict[str, Any] = {"x": torch.full((8,), -1.0), "meta": {"step": -1}}
        with Checkpointer(ckpt) as restorer:
            step = restorer.restore(state)
        assert step in (1, 2), mutation
        event(f"{mutation[0]}: restored step {step}")  # shown by --hypothesis-show-statistics
        assert torch.equal(state["x"], _value(step)) and state["meta"] == {"step": step}, mutation
        assert (pristine / "outside" / "step-2" / "manifest.json").exists()  # never moved or touched
