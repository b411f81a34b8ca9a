"""Storage round trip (write, fsync, read back, timed) under the run, checkpoint and data directories."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from trainguard.health import HIGH, LOW, HealthConfig
from trainguard.health import storage as st


def by_name(results: list) -> dict:  # type: ignore[type-arg]
    return {r.name: r for r in results}


def test_real_directories_round_trip(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    cfg = HealthConfig(node="n", run_dir=tmp_path / "run", checkpoint_dir=tmp_path / "run" / "ckpt",
                       data_dirs=(tmp_path / "data",), storage_probe_bytes=256 * 1024)
    res = by_name(st.check_storage(cfg))
    rt = res["storage_roundtrip"]
    assert rt.ok and not rt.skipped and rt.severity == HIGH
    assert "256 KiB written, synced, read back" in rt.detail and str(tmp_path / "data") in rt.detail
    assert res["storage_latency"].ok and res["storage_latency"].severity == LOW
    assert not (tmp_path / "run").exists(), "the check must not create the directories"
    assert not list(tmp_path.rglob(".trainguard-storage-*")), "the probe file is removed"


def test_nothing_to_probe_is_skipped() -> None:
    res = by_name(st.check_storage(HealthConfig(node="n")))
    assert res["storage_roundtrip"].skipped and res["storage_latency"].skipped


def test_failures_mismatches_and_hangs_fail_high(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    res = by_name(st.check_storage(HealthConfig(node="n", run_dir=f)))
    assert not res["storage_roundtrip"].ok and "not a directory" in res["storage_roundtrip"].detail

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as m:
        m.setattr(st.os, "fsync", eio)
        res = by_name(st.check_storage(HealthConfig(node="n", run_dir=tmp_path)))
    assert not res["storage_roundtrip"].ok and "Input/output error" in res["storage_roundtrip"].detail

    real_read = os.read

    def flipped(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        return bytes([data[0] ^ 0xFF]) + data[1:] if data else data

    with monkeypatch.context() as m:
        m.setattr(st.os, "read", flipped)
        res = by_name(st.check_storage(HealthConfig(node="n", run_dir=tmp_path)))
    assert "read back different bytes" in res["storage_roundtrip"].detail

    def hang(directory: Path, size: int) -> tuple[float, None]:
        time.sleep(3)
        return 0.0, None

    with monkeypatch.context() as m:
        m.setattr(st, "_roundtrip", hang)
        res = by_name(st.check_storage(HealthConfig(node="n", run_dir=tmp_path, timeout_seconds=0.3)))
    assert not res["storage_roundtrip"].ok and "no answer within 0.3 s" in res["storage_roundtrip"].detail


def test_slow_storage_fails_low(tmp_path: Path) -> None:
    res = by_name(st.check_storage(HealthConfig(node="n", run_dir=tmp_path, max_storage_latency_seconds=0.0)))
    assert res["storage_roundtrip"].ok
    assert not res["storage_latency"].ok and res["storage_latency"].severity == LOW
    assert "slower than 0 s" in res["storage_latency"].detail
