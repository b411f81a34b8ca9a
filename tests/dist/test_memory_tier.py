"""The memory tier under faults: real 2-rank (one case 3-rank) gloo jobs, each rank a "node" with its own holder
on loopback.

Storage saves every 4 steps, memory copies every step; every recovered job's losses equal the
fault-free run's, bit for bit, and each case checks which tier served the restore.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _memtier_train import SECRET, launch

from trainguard.checkpoint.memory_client import Address, HolderClient
from trainguard.checkpoint.memory_store import run_id
from trainguard.launch.store_auth import StoreSigner

STEPS = 8
Dirs = tuple[Path, Path, Path]
"""(test directory, checkpoint directory, memory root)."""
SIGNER = StoreSigner(SECRET.encode())


def _node(shm: Path, ckpt: Path, node: str) -> Path:
    return shm / f"trainguard-mem-{os.getuid()}" / run_id(ckpt) / f"node-{node}"


def _stop_holder(shm: Path, ckpt: Path, node: str) -> None:
    """The node's holder goes, and its memory with it (a lost node, or a restarted holder)."""
    state = json.loads((_node(shm, ckpt, node) / "holder.json").read_text())
    HolderClient(Address(node, state["address"], state["port"]), SIGNER).stop()
    for _ in range(200):
        if not _node(shm, ckpt, node).exists():
            return
        import time

        time.sleep(0.05)
    raise AssertionError(f"holder of {node} did not clean up")


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[Dirs]:
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o700)
    ckpt = tmp_path / "ckpt"
    yield tmp_path, ckpt, shm
    base = shm / f"trainguard-mem-{os.getuid()}" / run_id(ckpt)
    for node in base.iterdir() if base.exists() else []:
        if (node / "holder.json").exists():
            _stop_holder(shm, ckpt, node.name.removeprefix("node-"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    """Per-step losses of a fault-free run with the memory tier on."""
    tmp = tmp_path_factory.mktemp("reference")
    shm = tmp / "shm"
    shm.mkdir(mode=0o700)
    codes, results = launch(tmp, tmp / "ckpt", shm, ["nA", "nB"], steps=STEPS, tag="ref")
    assert codes == [0, 0], (tmp / "ref-rank0.log").read_text()
    assert results[0]["losses"] == results[1]["losses"]
    for node in ("nA", "nB"):
        _stop_holder(shm, tmp / "ckpt", node)
    return results[0]["losses"]


def _resume(tmp: Path, ckpt: Path, shm: Path, nodes: list[str], start: int, tiers: list[str],
            reference: dict[str, float], placement: str = "") -> list[dict]:
    codes, results = launch(tmp, ckpt, shm, nodes, steps=STEPS, tag="resume", placement=placement)
    assert codes == [0] * len(nodes), "".join((tmp / f"resume-rank{r}.log").read_text() for r in range(len(nodes)))
    assert [r["start"] for r in results] == [start] * len(nodes)
    assert [r["tier"] for r in results] == tiers
    for step in range(start + 1, STEPS + 1):
        assert results[0]["losses"][str(step)] == reference[str(step)]
    return results


def _crash(tmp: Path, ckpt: Path, shm: Path, nodes: list[str], rank: int = 0, placement: str = "") -> None:
    codes, _ = launch(tmp, ckpt, shm, nodes, steps=STEPS, fault="crash", fault_step=6, fault_rank=rank, tag="fault",
                      placement=placement)
    assert codes[rank] == -9, (tmp / "fault-rank0.log").read_text()


def test_rank_crash_restores_from_own_memory(dirs: Dirs, reference: dict[str, float]) -> None:
    tmp, ckpt, shm = dirs
    _crash(tmp, ckpt, shm, ["nA", "nB"])
    results = _resume(tmp, ckpt, shm, ["nA", "nB"], 6, ["own", "own"], reference)
    assert [r["storage_bytes"] for r in results] == [0, 0]


def test_node_loss_restores_from_the_peer_replica(dirs: Dirs, reference: dict[str, float]) -> None:
    tmp, ckpt, shm = dirs
    _crash(tmp, ckpt, shm, ["nA", "nB"])
    _stop_holder(shm, ckpt, "nA")  # node A is gone; its rank comes back on a spare, node C
    results = _resume(tmp, ckpt, shm, ["nC", "nB"], 6, ["peer:nB", "own"], reference)
    assert [r["storage_bytes"] for r in results] == [0, 0]
    # what the records say: the restore's tier, and the copies replicated around the ring nB -> nC -> nB
    assert [r["loaded_tiers"] for r in results] == [["peer"], ["memory"]]
    assert [r["copy_paths"] for r in results] == [["memory:own+peer:nB"], ["memory:own+peer:nC"]]


def test_node_and_its_peer_lost_fall_to_storage(dirs: Dirs, reference: dict[str, float]) -> None:
    tmp, ckpt, shm = dirs
    _crash(tmp, ckpt, shm, ["nA", "nB"])
    _stop_holder(shm, ckpt, "nA")
    _stop_holder(shm, ckpt, "nB")
    results = _resume(tmp, ckpt, shm, ["nC", "nD"], 4, ["storage", "storage"], reference)
    assert all(r["storage_bytes"] > 0 for r in results)


def test_corrupted_memory_copy_is_detected_and_the_peer_serves(dirs: Dirs, reference: dict[str, float]) -> None:
    tmp, ckpt, shm = dirs
    _crash(tmp, ckpt, shm, ["nA", "nB"])
    own = _node(shm, ckpt, "nA") / "own" / "rank-0"
    slot = next(p for p in own.glob("slot-*.json") if json.loads(p.read_text())["step"] == 6)
    data = own / slot.name.replace(".json", ".bin")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 3] ^= 0x01  # one flipped bit in the middle of the tensors
    data.write_bytes(bytes(raw))
    _resume(tmp, ckpt, shm, ["nA", "nB"], 6, ["peer:nB", "own"], reference)
    assert "own/rank-0/slot-" in (tmp / "resume-rank0.log").read_text()  # reported as rejected, by checksum
    assert "checksum mismatch" in (tmp / "resume-rank0.log").read_text()


def test_holder_restart_loses_memory_and_storage_serves(dirs: Dirs, reference: dict[str, float]) -> None:
    tmp, ckpt, shm = dirs
    _crash(tmp, ckpt, shm, ["nA", "nA"])  # one node: no peer replica
    _stop_holder(shm, ckpt, "nA")
    _resume(tmp, ckpt, shm, ["nA", "nA"], 4, ["storage", "storage"], reference)


def test_save_interrupted_mid_copy_keeps_the_previous_copy(dirs: Dirs, reference: dict[str, float]) -> None:
    tmp, ckpt, shm = dirs
    codes, _ = launch(tmp, ckpt, shm, ["nA", "nB"], steps=STEPS, fault="kill-mid-copy", fault_step=6,
                      fault_rank=1, tag="fault")
    assert codes[1] == -9
    # Rank 1's copy of step 6 was half written: step 5, in the other slot, is the newest both ranks hold.
    _resume(tmp, ckpt, shm, ["nA", "nB"], 5, ["own", "own"], reference)


def test_clique_node_and_its_ring_peer_lost_restore_from_the_third_clique_node(dirs: Dirs) -> None:
    # Three nodes, one clique: every copy is on all three. Nodes A and B go (with a ring, rank 0's only
    # replica was on B): ranks 0 and 1 come back on new nodes and fetch theirs from C.
    tmp, ckpt, shm = dirs
    ref_dir = tmp / "reference"
    ref_dir.mkdir()
    codes, ref = launch(ref_dir, ref_dir / "ckpt", shm, ["rA", "rB", "rC"], steps=STEPS, tag="ref")
    assert codes == [0, 0, 0], (ref_dir / "ref-rank0.log").read_text()
    for node in ("rA", "rB", "rC"):
        _stop_holder(shm, ref_dir / "ckpt", node)
    nodes = ["nA", "nB", "nC"]
    _crash(tmp, ckpt, shm, nodes, placement="clique:3")
    assert {p.name for p in (_node(shm, ckpt, "nC") / "replicas").iterdir()} == {"rank-0", "rank-1"}
    _stop_holder(shm, ckpt, "nA")
    _stop_holder(shm, ckpt, "nB")
    results = _resume(tmp, ckpt, shm, ["nD", "nE", "nC"], 6, ["peer:nC", "peer:nC", "own"], ref[0]["losses"],
                      placement="clique:3")
    assert [r["storage_bytes"] for r in results] == [0, 0, 0]
