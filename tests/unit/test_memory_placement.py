"""Where the memory tier puts replicas: ring and clique placement, their parsing, and how a job chooses one."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from trainguard.checkpoint import CheckpointConfig, CheckpointError
from trainguard.checkpoint.checkpointer import _with_launcher_memory_tier
from trainguard.checkpoint.memory_placement import Placement, cliques, parse_placement, replica_nodes
from trainguard.checkpoint.memory_store import begin, node_dir, rank_dir
from trainguard.core.protocol import MEMORY_PLACEMENT_ENV
from trainguard.launch import SupervisorConfig

RING = Placement("ring")


def _all(nodes: list[str], placement: Placement) -> dict[str, list[str]]:
    return {n: replica_nodes(nodes, n, placement) for n in nodes}


def test_ring_is_the_next_node_by_node_id() -> None:
    assert _all(["n2", "n0", "n1"], RING) == {"n0": ["n1"], "n1": ["n2"], "n2": ["n0"]}
    assert _all(["a", "b"], RING) == {"a": ["b"], "b": ["a"]}
    assert _all(["solo"], RING) == {"solo": []}


def test_clique_replicates_to_every_other_node_of_its_clique() -> None:
    nodes = [f"n{i}" for i in range(6)]
    got = _all(nodes, parse_placement("clique:3"))
    assert got["n0"] == ["n1", "n2"] and got["n1"] == ["n0", "n2"] and got["n4"] == ["n3", "n5"]
    assert all(node not in targets for node, targets in got.items())
    assert _all(["b", "a", "d", "c"], parse_placement("clique:2")) == {"a": ["b"], "b": ["a"], "c": ["d"], "d": ["c"]}


def test_odd_counts_never_leave_a_node_alone() -> None:
    assert cliques(5, 2) == [range(0, 2), range(2, 5)]  # a last clique of one joins the one before it
    assert cliques(7, 3) == [range(0, 3), range(3, 7)]
    assert cliques(5, 3) == [range(0, 3), range(3, 5)]  # a last clique of two stays a clique
    got = _all([f"n{i}" for i in range(5)], parse_placement("clique:2"))
    assert got["n4"] == ["n2", "n3"] and got["n2"] == ["n3", "n4"] and got["n0"] == ["n1"]
    assert parse_placement("clique:2").replicas_per_copy(5) == 2
    assert parse_placement("clique:2").replicas_per_copy(4) == 1
    assert RING.replicas_per_copy(5) == 1 and RING.replicas_per_copy(1) == 0


def test_a_clique_larger_than_the_job_is_all_nodes() -> None:
    assert _all(["a", "b", "c"], parse_placement("clique:8")) == {"a": ["b", "c"], "b": ["a", "c"], "c": ["a", "b"]}
    assert _all(["a"], parse_placement("clique:8")) == {"a": []}


def test_parsing_and_bad_values() -> None:
    assert parse_placement("ring") == RING
    assert parse_placement(" Clique:4 ") == Placement("clique", 4)
    assert str(parse_placement("clique:4")) == "clique:4" and str(RING) == "ring"
    for bad in ("", "star", "clique", "clique:", "clique:1", "clique:0", "clique:-2", "clique:x", "ring:2"):
        with pytest.raises(ValueError, match=r"'ring' or 'clique:K' with an integer K >= 2"):
            parse_placement(bad)
    with pytest.raises(ValueError, match="not one of the job's nodes"):
        replica_nodes(["a", "b"], "c", RING)


def test_config_and_run_flag_validate_the_placement() -> None:
    assert CheckpointConfig(memory_gb=1, memory_placement="clique:3").memory_placement == "clique:3"
    with pytest.raises(ValueError, match=r"^CheckpointConfig.memory_placement: .*got 'clique:1'"):
        CheckpointConfig(memory_gb=1, memory_placement="clique:1")
    base = {"command": ("t.py",), "run_dir": Path("/tmp/r"), "run_id": "r", "node_id": "n",
            "rdzv_endpoint": "127.0.0.1:1"}
    assert SupervisorConfig(**base, memory_checkpoint_placement="clique:2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^memory_checkpoint_placement: .*got 'mesh'"):
        SupervisorConfig(**base, memory_checkpoint_placement="mesh")  # type: ignore[arg-type]


def test_the_launcher_placement_applies_where_the_script_sets_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(MEMORY_PLACEMENT_ENV, "clique:4")
    assert _with_launcher_memory_tier(CheckpointConfig(memory_gb=1)).memory_placement == "clique:4"
    assert _with_launcher_memory_tier(CheckpointConfig(memory_gb=1, memory_placement="ring")).memory_placement \
        == "ring"  # the script's own wins
    monkeypatch.setenv(MEMORY_PLACEMENT_ENV, "clique:one")
    with caplog.at_level(logging.WARNING):
        assert _with_launcher_memory_tier(CheckpointConfig(memory_gb=1)).memory_placement is None
    assert MEMORY_PLACEMENT_ENV in caplog.text


def test_the_node_bound_counts_the_replicas_of_every_clique_peer(tmp_path: Path) -> None:
    # Clique of 3: a node holds its own rank's copy and a replica of each of the two other nodes' ranks.
    root = tmp_path / "shm"
    root.mkdir(mode=0o700)
    node = node_dir(root, "run", "n0")
    size, bound = 1000, 2500
    _, own = begin(node, rank_dir(node, "own", 0), size, bound, "rank 0")
    _, first = begin(node, rank_dir(node, "replicas", 1), size, bound, "rank 1's replica")
    with pytest.raises(CheckpointError, match=r"rank 2's replica needs .* already holds 0.000 GB"):
        begin(node, rank_dir(node, "replicas", 2), size, bound, "rank 2's replica")
    own.close()
    first.close()
