"""One-read restore: every checkpoint byte is read once, verified as it loads, and damage never reaches the state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from trainguard.checkpoint import CheckpointConfig, Checkpointer, CheckpointError, read_manifest
from trainguard.checkpoint.reader import VerifyingReader
from trainguard.core.eventlog import EventWriter, read_events
from trainguard.core.events import CheckpointRejected

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

MB = 1 << 20


def _state(seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "big": torch.rand(2 * MB // 4, generator=gen),  # 2 MiB
        "layers": [torch.rand(64, 64, generator=gen) for _ in range(3)],
        "note": f"seed {seed}",
        "rank_local": {"position": seed},
    }


def _empty() -> dict[str, Any]:
    return {
        "big": torch.zeros(2 * MB // 4),
        "layers": [torch.zeros(64, 64) for _ in range(3)],
        "note": "",
        "rank_local": {"position": -1},
    }


def _save(directory: Path, *seeds: int) -> None:
    with Checkpointer(directory, CheckpointConfig(async_save=False, keep_last=10)) as ckpt:
        for seed in seeds:
            ckpt.save(seed, _state(seed))


def _equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        torch.equal(a["big"], b["big"])
        and all(torch.equal(x, y) for x, y in zip(a["layers"], b["layers"], strict=True))
        and a["note"] == b["note"]
        and a["rank_local"] == b["rank_local"]
    )


def _read_syscall_bytes() -> int:
    """Bytes this process passed through read syscalls so far (Linux ``rchar``: page cache or not)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_restore_reads_each_checkpoint_byte_once(tmp_path: Path) -> None:
    _save(tmp_path / "ckpt", 1)
    total = read_manifest(tmp_path / "ckpt" / "step-1").total_bytes
    state = _empty()
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        before = _read_syscall_bytes()
        assert ckpt.restore(state) == 1
        read = _read_syscall_bytes() - before
    assert _equal(state, _state(1))
    # Verify-then-load read everything twice (>= 2x); one read plus the manifest and a few small files.
    assert total <= read < 1.2 * total, (read, total)


def test_reader_verifies_what_dcp_loads_and_counts_it(tmp_path: Path) -> None:
    _save(tmp_path / "ckpt", 1)
    path = tmp_path / "ckpt" / "step-1"
    manifest = read_manifest(path)
    target = {"big": torch.zeros(2 * MB // 4)}  # a subset of the saved keys: DCP reads only their items
    reader = VerifyingReader(path, manifest)
    dcp.load(target, storage_reader=reader, no_dist=True)
    assert torch.equal(target["big"], _state(1)["big"])
    assert reader.bytes_read == manifest.total_bytes  # whole files, so every checksum could be checked


@pytest.mark.parametrize("where", ["start", "middle of the big tensor", "end"])
def test_flipped_byte_of_the_only_checkpoint_leaves_the_state_untouched(tmp_path: Path, where: str) -> None:
    _save(tmp_path / "ckpt", 1)
    shard = tmp_path / "ckpt" / "step-1" / "__0_0.distcp"
    size = shard.stat().st_size
    _flip(shard, {"start": 0, "middle of the big tensor": size // 2, "end": size - 1}[where])
    state = _empty()
    events = tmp_path / "events.jsonl"
    with Checkpointer(tmp_path / "ckpt", events=EventWriter(events)) as ckpt:
        assert ckpt.restore(state) is None
    assert _equal(state, _empty())  # the only one: loaded into staging, never trusted, so no damaged byte reached it
    (rejected,) = [e for e in read_events(events) if isinstance(e, CheckpointRejected)]
    assert "checksum" in rejected.reason and "__0_0.distcp" in rejected.reason


def test_damage_in_the_newest_falls_back_to_an_intact_older_state(tmp_path: Path) -> None:
    _save(tmp_path / "ckpt", 1, 2)
    shard = tmp_path / "ckpt" / "step-2" / "__0_0.distcp"
    _flip(shard, shard.stat().st_size // 2)
    state = _empty()
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.restore(state) == 1
    assert _equal(state, _state(1))


def test_with_an_older_checkpoint_to_fall_back_on_the_load_goes_straight_into_the_state(tmp_path: Path) -> None:
    _save(tmp_path / "ckpt", 1, 2)
    state = _empty()
    pointers = [state["big"].data_ptr(), *(t.data_ptr() for t in state["layers"])]
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.restore(state) == 2
        assert ckpt._arena.nbytes == 0  # no staging copy of the state was made
    assert _equal(state, _state(2))
    assert pointers == [state["big"].data_ptr(), *(t.data_ptr() for t in state["layers"])]


def test_the_only_checkpoint_is_still_staged(tmp_path: Path) -> None:
    _save(tmp_path / "ckpt", 1)
    state = _empty()
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.restore(state) == 1
        assert ckpt._arena.nbytes >= 2 * MB  # nothing older to fall back on: verified before the state changes
    assert _equal(state, _state(1))


def test_every_checkpoint_damaged_after_an_in_place_load_raises_instead_of_training_on_its_bytes(
    tmp_path: Path,
) -> None:
    _save(tmp_path / "ckpt", 1, 2)
    for step in (1, 2):
        shard = tmp_path / "ckpt" / f"step-{step}" / "__0_0.distcp"
        _flip(shard, shard.stat().st_size // 2)
    events = tmp_path / "events.jsonl"
    with (
        Checkpointer(tmp_path / "ckpt", events=EventWriter(events)) as ckpt,
        pytest.raises(CheckpointError, match="unverified bytes of rejected step 2"),
    ):
        ckpt.restore(_empty())
    assert [e.step for e in read_events(events) if isinstance(e, CheckpointRejected)] == [2, 1]
    assert len(list((tmp_path / "ckpt").glob(".rejected-step-*"))) == 2


def test_damaged_metadata_is_never_unpickled(tmp_path: Path) -> None:
    _save(tmp_path / "ckpt", 1)
    metadata = tmp_path / "ckpt" / "step-1" / ".metadata"
    _flip(metadata, 0)  # the pickle's first byte: unpickling it would fail with a pickle error instead
    reader = VerifyingReader(tmp_path / "ckpt" / "step-1", read_manifest(tmp_path / "ckpt" / "step-1"))
    with pytest.raises(CheckpointError, match=r"\.metadata checksum"):
        reader.read_metadata()


def test_file_missing_from_the_manifest_is_refused(tmp_path: Path) -> None:
    _save(tmp_path / "ckpt", 1)
    path = tmp_path / "ckpt" / "step-1"
    data = json.loads((path / "manifest.json").read_text())
    del data["files"]["__0_0.distcp"]
    (path / "manifest.json").write_text(json.dumps(data))
    state = _empty()
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.restore(state) is None
    assert _equal(state, _empty())
