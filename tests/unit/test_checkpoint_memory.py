"""The memory tier in one process: copy layout and verification, slots, the node bound, directory safety,
the holder's authentication, and a Checkpointer restoring from memory (with a real holder process)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from trainguard.checkpoint import CheckpointConfig, Checkpointer, CheckpointError, WriteHooks
from trainguard.checkpoint.memory_client import Address, HolderClient
from trainguard.checkpoint.memory_layout import digest as checksum
from trainguard.checkpoint.memory_layout import pack, plan, unpack, verify
from trainguard.checkpoint.memory_load import OwnCopy, fetch_replica
from trainguard.checkpoint.memory_meta import CopyMeta
from trainguard.checkpoint.memory_store import begin, copies, describe, node_dir, rank_dir, run_id, secure_dir
from trainguard.launch.store_auth import StoreSigner

SECRET = "unit-test-memory-secret-0123456789"


def _copy(flat: dict, step: int = 1) -> tuple[CopyMeta, bytearray]:
    layout = plan(flat)
    data = bytearray(layout.size)
    pack(flat, layout, memoryview(data))
    meta = CopyMeta(step, 0, 1, "crc32", checksum(memoryview(data), "crc32"), layout.size, layout.entries,
                    (layout.objects_offset, len(layout.objects_blob)))
    return CopyMeta.from_bytes(meta.to_bytes()), data


def test_layout_round_trip_and_corruption_detected() -> None:
    flat = {"w": torch.arange(12, dtype=torch.float32).view(3, 4), "b": torch.ones(5, dtype=torch.int64),
            "e": torch.empty(0), "lr": 0.1, "name": "x"}
    meta, data = _copy(flat)
    assert verify(meta, memoryview(data)) == ""
    target = {"w": torch.zeros(3, 4), "b": torch.zeros(5, dtype=torch.int64), "e": torch.empty(0),
              "lr": 0.0, "name": ""}
    staged = unpack(meta, memoryview(data), target)
    assert torch.equal(staged["w"], flat["w"]) and torch.equal(staged["b"], flat["b"])
    assert (staged["lr"], staged["name"]) == (0.1, "x")
    data[7] ^= 0x10
    assert "checksum mismatch" in verify(meta, memoryview(data))
    assert "truncated" in verify(meta, memoryview(data)[:10])


def test_structure_mismatch_is_refused() -> None:
    meta, data = _copy({"w": torch.zeros(3, 4)})
    with pytest.raises(CheckpointError, match="float32"):
        unpack(meta, memoryview(data), {"w": torch.zeros(4, 3)})
    with pytest.raises(CheckpointError, match="does not match"):
        unpack(meta, memoryview(data), {"v": torch.zeros(3, 4)})


def test_malformed_description_is_refused() -> None:
    meta, _ = _copy({"w": torch.zeros(2)})
    raw = json.loads(meta.to_bytes())
    raw["entries"][0][3] = 1 << 40  # an offset past the end
    with pytest.raises(CheckpointError, match="past the end"):
        CopyMeta.from_bytes(json.dumps(raw).encode())


def test_slots_keep_the_previous_copy_until_the_new_one_is_described(tmp_path: Path) -> None:
    node = node_dir(tmp_path, "run", "n0")
    directory = rank_dir(node, "own", 0)
    for step in (1, 2):
        meta, data = _copy({"w": torch.full((4,), float(step))}, step)
        slot, mapped = begin(node, directory, meta.size, 1 << 20, "rank 0")
        mapped[: meta.size] = data
        mapped.close()
        describe(directory, slot, meta)
    assert [c.meta.step for c in copies(directory)] == [2, 1]
    slot, mapped = begin(node, directory, 100, 1 << 20, "rank 0")  # step 3 starts: overwrites step 1's slot
    mapped.close()
    assert [c.meta.step for c in copies(directory)] == [2]


def test_node_bound_refuses_a_copy_that_does_not_fit(tmp_path: Path) -> None:
    node = node_dir(tmp_path, "run", "n0")
    _, mapped = begin(node, rank_dir(node, "own", 0), 600, 1000, "rank 0")
    mapped.close()
    with pytest.raises(CheckpointError, match=r"rank 1 needs .* already holds .*CheckpointConfig.memory_gb"):
        begin(node, rank_dir(node, "own", 1), 600, 1000, "rank 1")


def test_hostile_directories_are_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / f"trainguard-mem-{os.getuid()}")
    with pytest.raises(CheckpointError, match="not a link"):
        node_dir(tmp_path, "run", "n0")
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    with pytest.raises(CheckpointError, match="0700"):
        secure_dir(open_dir)


def test_a_foreign_base_folder_gives_the_job_a_private_one_found_again_by_every_rank(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / f"trainguard-mem-{os.getuid()}")
    record = tmp_path / "run"
    record.mkdir(mode=0o700)
    node = node_dir(tmp_path, "run", "n0", record=record)
    job = node.parent
    assert job.parent == tmp_path and job.name.startswith(f"trainguard-mem-{os.getuid()}-run-"), job
    assert oct(os.lstat(job).st_mode & 0o777) == "0o700" and oct(os.lstat(node).st_mode & 0o777) == "0o700"
    assert node_dir(tmp_path, "run", "n0", record=record) == node  # another rank, or a later attempt
    assert not list((tmp_path / "elsewhere").iterdir())
    # The recorded folder gone (its holder ended): a fresh one, not an error.
    node.rmdir()
    job.rmdir()
    again = node_dir(tmp_path, "run", "n0", record=record)
    assert again.is_dir() and again != node


def test_config_validates_memory_fields() -> None:
    with pytest.raises(ValueError, match="memory_gb"):
        CheckpointConfig(memory_gb=0)
    with pytest.raises(ValueError, match="memory_every_steps"):
        CheckpointConfig(memory_gb=1, memory_every_steps=0)


@pytest.fixture
def memory_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, CheckpointConfig]]:
    monkeypatch.setenv("TRAINGUARD_JOB_SECRET", SECRET)
    monkeypatch.setenv("TRAINGUARD_NODE", "n0")
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o700)
    config = CheckpointConfig(memory_gb=0.01, memory_root=str(shm), memory_address="127.0.0.1", async_save=False)
    yield tmp_path / "ckpt", config
    node = shm / f"trainguard-mem-{os.getuid()}" / run_id(tmp_path / "ckpt") / "node-n0"
    if (node / "holder.json").exists():
        state = json.loads((node / "holder.json").read_text())
        HolderClient(Address("n0", state["address"], state["port"]), StoreSigner(SECRET.encode())).stop()


class _Interrupt(WriteHooks):
    def during_memory_copy(self, step: int, slot: memoryview) -> None:
        if step == 3:
            slot[:] = b"\0" * len(slot)
            raise RuntimeError("copy interrupted")


MemoryJob = tuple[Path, CheckpointConfig]


def test_checkpointer_restores_from_memory_and_survives_an_interrupted_copy(memory_job: MemoryJob) -> None:
    ckpt_dir, config = memory_job
    model = torch.nn.Linear(4, 3)
    with Checkpointer(ckpt_dir, config, hooks=_Interrupt()) as ckpt:
        ckpt.save(1, {"model": model.state_dict(), "step": 1})  # storage and memory
        with torch.no_grad():
            model.weight.add_(1.0)
        ckpt.save_to_memory(2, {"model": model.state_dict(), "step": 2})
        ckpt.wait()
        expected = model.weight.detach().clone()
        with pytest.raises(RuntimeError, match="interrupted"):
            ckpt.save_to_memory(3, {"model": model.state_dict(), "step": 3})
    with torch.no_grad():
        model.weight.zero_()
    with Checkpointer(ckpt_dir, config) as ckpt:
        state = {"model": model.state_dict(), "step": 0}
        assert ckpt.restore(state) == 2
        assert ckpt.last_restore is not None and ckpt.last_restore.tier == "own"
        assert ckpt.last_restore_storage_bytes == 0 and state["step"] == 2
        assert torch.equal(model.weight, expected)


def test_checkpointer_refuses_a_copy_over_the_bound(memory_job: MemoryJob) -> None:
    ckpt_dir, config = memory_job
    with Checkpointer(ckpt_dir, config) as ckpt, pytest.raises(CheckpointError, match="memory_gb"):
        ckpt.save_to_memory(1, {"big": torch.zeros(4 << 20)})  # 16 MiB > 0.01 GiB


def test_holder_ignores_requests_without_the_job_secret(memory_job: MemoryJob) -> None:
    ckpt_dir, config = memory_job
    with Checkpointer(ckpt_dir, config) as ckpt:
        ckpt.save_to_memory(1, {"w": torch.ones(3)})
        ckpt.wait()
        assert ckpt.memory is not None
        address = ckpt.memory.holders()[0]
    intruder = HolderClient(address, StoreSigner(b"not-the-secret-of-this-job"), timeout=10.0)
    with pytest.raises((ConnectionError, CheckpointError, OSError)):
        intruder.replicas()
    assert HolderClient(address, StoreSigner(SECRET.encode())).replicas() == {}


def test_memory_saves_and_restores_are_recorded_with_their_tier(memory_job: MemoryJob, tmp_path: Path) -> None:
    from trainguard.core.events import CheckpointLoaded, CheckpointSaveFinished, CheckpointSaveStarted
    from trainguard.core.rundir import RunDir

    ckpt_dir, config = memory_job
    run = RunDir(tmp_path / "run").create()
    model = torch.nn.Linear(4, 3)
    with run.writer("rank-0") as events:
        with Checkpointer(ckpt_dir, config, events=events, hooks=_Interrupt()) as ckpt:
            ckpt.save(1, {"model": model.state_dict(), "step": 1})  # storage, then a memory copy
            ckpt.save_to_memory(2, {"model": model.state_dict(), "step": 2})
            ckpt.wait()
            with pytest.raises(RuntimeError, match="interrupted"):
                ckpt.save_to_memory(3, {"model": model.state_dict(), "step": 3})
        with Checkpointer(ckpt_dir, config, events=events, attempt=1) as ckpt:
            assert ckpt.restore({"model": model.state_dict(), "step": 0}) == 2
    records = [loaded.record for loaded in run.load()]
    started = [(r.step, r.tier) for r in records if isinstance(r, CheckpointSaveStarted)]
    assert started == [(1, ""), (1, "memory"), (2, "memory"), (3, "memory")]
    finished = {(r.step, r.tier): r for r in records if isinstance(r, CheckpointSaveFinished)}
    assert set(finished) == {(1, ""), (1, "memory"), (2, "memory"), (3, "memory")}
    copy = finished[(2, "memory")]
    assert copy.ok and copy.path == "memory:own" and copy.bytes > 0  # one node: no peer to replicate to
    assert 0 < copy.blocking_seconds <= copy.total_seconds
    assert not finished[(3, "memory")].ok and "interrupted" in finished[(3, "memory")].error
    (loaded,) = [r for r in records if isinstance(r, CheckpointLoaded)]
    assert (loaded.attempt, loaded.step, loaded.tier, loaded.path) == (1, 2, "memory", "memory:own")
    assert loaded.seconds > 0


def test_own_copy_is_checked_before_it_is_used(tmp_path: Path) -> None:
    node = node_dir(tmp_path, "run", "n0")
    directory = rank_dir(node, "own", 0)
    meta, data = _copy({"w": torch.arange(6, dtype=torch.float32)})
    slot, mapped = begin(node, directory, meta.size, 1 << 20, "rank 0")
    mapped[: meta.size] = data
    mapped.close()
    describe(directory, slot, meta)
    with ThreadPoolExecutor(1) as pool:
        good = OwnCopy.start(copies(directory)[0], pool)
        assert torch.equal(good.load({"w": torch.zeros(6)})["w"], torch.arange(6, dtype=torch.float32))
        wrong_shape = OwnCopy.start(copies(directory)[0], pool)
        with pytest.raises(CheckpointError, match=r"float32\[6\]"):
            wrong_shape.load({"w": torch.zeros(2, 3)})
        # Flip one byte in place: rewriting the file would truncate it under the mapping an earlier copy's
        # digest may still read on the pool's thread (SIGBUS, seen once in the suite).
        with (directory / f"slot-{slot}.bin").open("r+b") as fh:
            fh.seek(5)
            byte = fh.read(1)[0]
            fh.seek(5)
            fh.write(bytes([byte ^ 0x01]))
        bad = OwnCopy.start(copies(directory)[0], pool)
        with pytest.raises(CheckpointError, match="checksum mismatch"):
            bad.load({"w": torch.zeros(6)})
        for copy in (good, wrong_shape, bad):
            copy.discard()


def test_a_corrupted_newest_copy_falls_back_to_the_older_one(memory_job: MemoryJob) -> None:
    ckpt_dir, config = memory_job
    with Checkpointer(ckpt_dir, config) as ckpt:
        ckpt.save(1, {"w": torch.full((8,), 1.0)})  # storage and memory
        ckpt.save_to_memory(2, {"w": torch.full((8,), 2.0)})
        ckpt.wait()
        assert ckpt.memory is not None
        own = ckpt.memory.node_dir / "own" / "rank-0"
    newest = next(c for c in copies(own) if c.meta.step == 2)
    raw = bytearray(newest.data.read_bytes())
    raw[3] ^= 0x40
    newest.data.write_bytes(bytes(raw))
    with Checkpointer(ckpt_dir, config) as ckpt:
        state = {"w": torch.zeros(8)}
        assert ckpt.restore(state) == 1  # step 2's copy is rejected unused; step 1's is as new as storage's
        assert ckpt.last_restore is not None and ckpt.last_restore.tier == "own"
        assert torch.equal(state["w"], torch.full((8,), 1.0))
        assert set(ckpt.last_restore.phases) >= {"listing", "agree", "load", "verdict", "copy"}
    assert [c.meta.step for c in copies(own)] == [1]  # never offered again


def test_a_replica_is_checksummed_as_it_arrives(memory_job: MemoryJob) -> None:
    ckpt_dir, config = memory_job
    with Checkpointer(ckpt_dir, config) as ckpt:
        ckpt.save_to_memory(1, {"w": torch.ones(3)})
        ckpt.wait()
        assert ckpt.memory is not None
        address = ckpt.memory.holders()[0]
    signer = StoreSigner(SECRET.encode())
    flat = {"w": torch.arange(1000, dtype=torch.float32)}
    meta, data = _copy(flat, step=5)
    meta = dataclasses.replace(meta, rank=1, world_size=2)
    HolderClient(address, signer).put(meta, memoryview(data))
    staged, _buffer = fetch_replica(address, signer, 10.0, 5, 1, 2, {"w": torch.zeros(1000)})
    assert torch.equal(staged["w"], flat["w"])
    del staged
    with pytest.raises(CheckpointError, match="replica holds rank 1 step 5 of 2 ranks"):
        fetch_replica(address, signer, 10.0, 5, 1, 3, {"w": torch.zeros(1000)})
    HolderClient(address, signer).put(dataclasses.replace(meta, step=6, checksum="0" * 8), memoryview(data))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        fetch_replica(address, signer, 10.0, 6, 1, 2, {"w": torch.zeros(1000)})


def test_the_holder_listens_on_loopback_for_a_one_node_job_and_on_the_nodes_route_otherwise() -> None:
    from trainguard.checkpoint.memory_client import holder_address

    assert holder_address(None, {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}) == ("127.0.0.1", "127.0.0.1")
    # Nodes that meet on loopback (several "nodes" on one host) stay on loopback.
    assert holder_address(None, {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                 "MASTER_PORT": "29500"}) == ("127.0.0.1", "127.0.0.1")
    assert holder_address("10.0.0.5", {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}) == ("10.0.0.5", "10.0.0.5")


def test_an_unauthenticated_header_ends_the_connection_before_the_body_is_read(tmp_path: Path) -> None:
    import io

    from trainguard.checkpoint.memory_holder import HEADER_BYTES, read_request, request_bytes

    signer, nonce = StoreSigner(SECRET.encode()), "ab" * 16
    good = request_bytes(signer, nonce, {"op": "ping"})
    assert len(good.split(b"\n", 1)[0]) + 1 == HEADER_BYTES
    assert read_request(signer, nonce, io.BytesIO(good)) == {"op": "ping"}
    forged = request_bytes(StoreSigner(b"another-secret-0123456789"), nonce, {"op": "ping"}) + b"x" * (1 << 20)
    stream = io.BytesIO(forged)
    assert read_request(signer, nonce, stream) is None
    assert stream.tell() == HEADER_BYTES  # nothing past the header was read
    assert read_request(signer, "cd" * 16, io.BytesIO(good)) is None  # bound to the connection's nonce
