"""Manifest parsing, verification and commit: every malformed or partial input is a CheckpointError."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

from trainguard.checkpoint import CheckpointError, Manifest, read_manifest
from trainguard.checkpoint.checksum import file_checksum, new_hasher
from trainguard.checkpoint.manifest import (
    FileEntry,
    commit,
    committed_steps,
    structure_mismatch,
    verify_files,
    write_manifest,
)


def _make(tmp_path: Path, step: int = 3) -> tuple[Path, Manifest]:
    d = tmp_path / f"step-{step}"
    d.mkdir()
    payload = b"shard-bytes" * 1000
    (d / "__0_0.distcp").write_bytes(payload)
    m = Manifest(
        step=step,
        world_size=1,
        structure={"x": {"kind": "object"}},
        files={"__0_0.distcp": FileEntry(len(payload), f"{zlib.crc32(payload):08x}")},
    )
    write_manifest(d, m)
    return d, m


def test_round_trip_and_verify(tmp_path: Path) -> None:
    d, m = _make(tmp_path)
    back = read_manifest(d)
    assert back.files == m.files and back.step == 3 and back.total_bytes == 11000
    verify_files(d, back, back.files)
    assert file_checksum(d / "__0_0.distcp", "crc32") == (11000, m.files["__0_0.distcp"].checksum)
    assert committed_steps(tmp_path) == [3]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not valid JSON"),
        (b'{"format": "trainguard-checkpoint", "format_version": 1, "step"', "not valid JSON"),
        (b"[1, 2]", "not a trainguard"),
        (b'{"format": "trainguard-checkpoint", "format_version": 99}', "format_version"),
        (b'{"format": "trainguard-checkpoint", "format_version": 1, "step": 3}', "malformed"),
        (
            b'{"format": "trainguard-checkpoint", "format_version": 1, "step": 3, "world_size": 1, '
            b'"files": {}, "structure": {}, "checksum": "crc32"}',
            "no files",
        ),
        (b"\xff\xfe garbage", "not valid JSON"),
    ],
)
def test_bad_manifests(tmp_path: Path, content: bytes, message: str) -> None:
    d, _ = _make(tmp_path)
    (d / "manifest.json").write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        read_manifest(d)


def test_missing_manifest_and_step_disagreement(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="never committed"):
        read_manifest(tmp_path)
    d, _ = _make(tmp_path)
    data = json.loads((d / "manifest.json").read_text())
    data["step"] = 4
    (d / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="directory says otherwise"):
        read_manifest(d)


def test_verify_catches_missing_truncated_and_flipped(tmp_path: Path) -> None:
    d, m = _make(tmp_path)
    shard = d / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[5] ^= 1
    shard.write_bytes(bytes(data))
    verify_files(d, m, m.files, checksums=False)  # same size: only the checksum can tell
    with pytest.raises(CheckpointError, match="checksum"):
        verify_files(d, m, m.files)
    shard.write_bytes(bytes(data[:-1]))
    with pytest.raises(CheckpointError, match="bytes, manifest says"):
        verify_files(d, m, m.files)
    shard.unlink()
    with pytest.raises(CheckpointError, match="missing"):
        verify_files(d, m, m.files)


def test_structure_mismatch_messages() -> None:
    t = {"kind": "tensor", "shape": [2, 3], "dtype": "float32"}
    assert structure_mismatch({"a": t}, {"a": t}) == ""
    assert "lacks 1 entries of the state" in structure_mismatch({}, {"a": t})
    assert "optimizer" in structure_mismatch({"a": t, "b": t}, {"a": t})
    assert "float32[2, 3]" in structure_mismatch({"a": t}, {"a": {**t, "shape": [3, 2]}})
    assert "object" in structure_mismatch({"a": {"kind": "object"}}, {"a": t})


def test_commit_replaces_same_step_from_an_abandoned_timeline(tmp_path: Path) -> None:
    old, _ = _make(tmp_path, step=5)
    (old / "stale").write_text("x")
    staging = tmp_path / ".staging-step-5-n"
    staging.mkdir()
    (staging / "new").write_text("y")
    commit(staging, tmp_path / "step-5")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-5"]
    assert (tmp_path / "step-5" / "new").exists() and not (tmp_path / "step-5" / "stale").exists()


def test_checksum_algorithms_agree_with_their_references(tmp_path: Path) -> None:
    import xxhash

    data = bytes(range(256)) * 5000
    (tmp_path / "f").write_bytes(data)
    assert file_checksum(tmp_path / "f", "crc32") == (len(data), f"{zlib.crc32(data):08x}")
    assert file_checksum(tmp_path / "f", "xxh3_64")[1] == xxhash.xxh3_64_hexdigest(data)
    with pytest.raises(ValueError, match="not available"):
        new_hasher("md4")


def test_manifest_with_an_unknown_algorithm_cannot_verify(tmp_path: Path) -> None:
    d, _ = _make(tmp_path)
    data = json.loads((d / "manifest.json").read_text())
    data["checksum"] = "sha3_999"
    (d / "manifest.json").write_text(json.dumps(data))
    back = read_manifest(d)
    verify_files(d, back, back.files, checksums=False)
    with pytest.raises(CheckpointError, match="not available"):
        verify_files(d, back, back.files)
