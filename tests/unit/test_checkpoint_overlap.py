"""Hashing beside the writes gives the whole-file digest; restores read tensors straight into staging, damage caught."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from trainguard.checkpoint import CheckpointConfig, Checkpointer, overlap, read_manifest
from trainguard.checkpoint.checksum import file_checksum, new_hasher
from trainguard.checkpoint.hashedfile import HashedFile
from trainguard.checkpoint.manifest import FileEntry
from trainguard.checkpoint.reader import VerifyingReader

pytestmark = [pytest.mark.filterwarnings("ignore:torch.distributed is disabled"), pytest.mark.timeout(120)]

# Odd sizes: a partial last chunk, and a buffer just under / over the inline threshold.
SIZES = [0, 1, overlap.OVERLAP_MIN - 1, overlap.OVERLAP_MIN, 3 * overlap.CHUNK + 17]


def _payload(size: int) -> bytes:
    gen = torch.Generator().manual_seed(size)
    return torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen).numpy().tobytes()


@pytest.mark.parametrize("algorithm", ["xxh3_64", "crc32"])
@pytest.mark.parametrize("size", SIZES)
def test_hashed_writes_match_a_plain_hash_and_read_back(tmp_path: Path, algorithm: str, size: int) -> None:
    data = _payload(size)
    expected = new_hasher(algorithm)
    expected.update(b"head" + data)
    written = new_hasher(algorithm)
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        overlap.write_hashed(written, fd, memoryview(b"head"), 0, str(path))
        overlap.write_hashed(written, fd, memoryview(data), 4, str(path))
    finally:
        os.close(fd)
    assert path.read_bytes() == b"head" + data
    assert written.hexdigest() == expected.hexdigest()

    entry = FileEntry(size=size + 4, checksum=expected.hexdigest())
    fd = os.open(path, os.O_RDONLY)
    try:
        reader = HashedFile(fd, "f", entry, algorithm)
        reader.skip_to(4)
        out = bytearray(size)
        reader.read_into(memoryview(out))
        reader.finish()
    finally:
        os.close(fd)
    assert bytes(out) == data


def test_writeback_hint_on_a_file_that_refuses_it_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(overlap, "_sync_file_range", overlap._lookup_sync_file_range())
    monkeypatch.setattr(overlap, "_sync_file_range_looked_up", True)
    read_end, write_end = os.pipe()  # sync_file_range on a pipe: ESPIPE
    try:
        overlap.start_writeback(write_end, 0, overlap.CHUNK)
    finally:
        os.close(read_end)
        os.close(write_end)


MB = 1 << 20


def _state(seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    return {"big": torch.rand(9 * MB // 4, generator=gen), "small": torch.rand(16, generator=gen)}


def _empty() -> dict[str, Any]:
    return {"big": torch.zeros(9 * MB // 4), "small": torch.zeros(16)}


def test_a_save_of_large_tensors_records_the_files_true_checksums(tmp_path: Path) -> None:
    with Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=False)) as ckpt:
        ckpt.save(1, _state(1))
    path = tmp_path / "ckpt" / "step-1"
    manifest = read_manifest(path)
    for name, entry in manifest.files.items():
        assert file_checksum(path / name, manifest.checksum_algorithm) == (entry.size, entry.checksum), name


@pytest.mark.parametrize("fraction", [0.3, 0.7, 0.999])
def test_damage_inside_a_large_tensor_is_caught_before_the_state_changes(tmp_path: Path, fraction: float) -> None:
    with Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=False, keep_last=5)) as ckpt:
        ckpt.save(1, _state(1))
        ckpt.save(2, _state(2))
    shard = tmp_path / "ckpt" / "step-2" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[int(len(data) * fraction)] ^= 0x01
    shard.write_bytes(bytes(data))
    state = _empty()
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.restore(state) == 1  # step 2 rejected, step 1 loaded whole
    assert all(torch.equal(state[k], v) for k, v in _state(1).items())


def test_whole_tensors_are_read_straight_into_staging(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=False)) as ckpt:
        ckpt.save(1, _state(1))

    def no_full_load(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a whole tensor went through torch.load's own buffer")

    monkeypatch.setattr(VerifyingReader, "_load_tensor", no_full_load)
    state = _empty()
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.restore(state) == 1
    assert all(torch.equal(state[k], v) for k, v in _state(1).items())


def test_a_target_of_another_layout_is_loaded_through_torch_load(tmp_path: Path) -> None:
    saved = {"t": torch.rand(64, 32, generator=torch.Generator().manual_seed(3)).t()}  # non-contiguous
    with Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=False)) as ckpt:
        ckpt.save(1, saved)
    state = {"t": torch.zeros(64, 32).t()}
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.restore(state) == 1
    assert torch.equal(state["t"], saved["t"])
