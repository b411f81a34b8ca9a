"""Verdicts on synthetic dumps: every fault, both backends, groups, ordering, consequences."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from trainguard.localize import diagnose_path
from trainguard.localize.synth import SynthConfig, write_dumps


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
@pytest.mark.parametrize("fault", ["none", "hang", "desync", "mismatch", "crash"])
def test_each_planted_fault_default_group(tmp_path: Path, backend: str, fault: str) -> None:
    write_dumps(SynthConfig(ranks=6, entries_per_rank=40, fault=fault, culprit=4, backend=backend), tmp_path)
    rep = diagnose_path(tmp_path)
    if fault == "none":
        assert rep.verdict == "healthy" and rep.culprit_ranks == () and rep.problems == ()
        return
    assert rep.verdict == fault, rep.explanation
    assert rep.culprit_ranks == (4,)
    assert rep.process_group == "0" and rep.op == "all_reduce"
    assert len(rep.problems) == 1


@pytest.mark.parametrize("fault", ["hang", "desync", "mismatch", "crash"])
def test_fault_inside_one_tensor_parallel_group_leaves_the_others_healthy(tmp_path: Path, fault: str) -> None:
    cfg = SynthConfig(ranks=16, entries_per_rank=60, tp=4, fault=fault, culprit=9, fault_group="tp")
    write_dumps(cfg, tmp_path)
    rep = diagnose_path(tmp_path)
    assert rep.verdict == fault and rep.culprit_ranks == (9,)
    assert [p.process_group for p in rep.problems] == ["3"]
    assert rep.problems[0].group_ranks == (8, 9, 10, 11)
    if fault == "hang":
        assert rep.problems[0].waiting_ranks == (8, 10, 11)


def test_p2p_hang_names_the_peer_that_never_posted(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=8, entries_per_rank=30, fault="p2p-hang", culprit=5), tmp_path)
    rep = diagnose_path(tmp_path, {r: f"node{r // 4}" for r in range(8)})
    assert rep.verdict == "p2p-hang" and rep.culprit_ranks == (5,)
    assert rep.culprit_hosts == ("node1",)
    assert rep.problems[0].waiting_ranks == (4,)
    assert rep.problems[0].evidence[0].op == "send" and rep.problems[0].evidence[0].peer == 5


def test_supervisor_evidence_mode_gives_the_same_answer(tmp_path: Path) -> None:
    cfg = SynthConfig(ranks=32, entries_per_rank=2000, tp=8, fault="hang", culprit=17, recent=8)
    write_dumps(cfg, tmp_path)
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "hang" and rep.culprit_ranks == (17,)


def test_gloo_mismatch_explains_the_missing_dumps(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=4, entries_per_rank=20, fault="mismatch", culprit=1, backend="gloo"), tmp_path)
    (tmp_path / "nccl_trace_rank_2").unlink()  # the receiver aborted: no dump
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "mismatch" and rep.culprit_ranks == (1,)
    assert rep.problems[0].consequence_ranks == (2,)
    assert [p.verdict for p in rep.problems] == ["mismatch"]
    assert rep.missing_ranks == (2,)


def test_two_ranks_disagreeing_has_no_majority(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=2, entries_per_rank=10, fault="mismatch", culprit=1), tmp_path)
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "mismatch" and rep.culprit_ranks == (0, 1)
    assert rep.problems[0].confidence < 0.6


def test_missing_dump_with_everything_completed_is_not_blamed_on_nccl(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=4, entries_per_rank=10), tmp_path)
    (tmp_path / "nccl_trace_rank_1").unlink()
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "healthy" and rep.culprit_ranks == ()
    assert rep.missing_ranks == (1,)
    assert any(w.file == "rank 1" for w in rep.warnings)


def test_world_size_reveals_a_missing_last_rank(tmp_path: Path) -> None:
    # NCCL's pg_config names every member, so a missing last rank is noticed
    write_dumps(SynthConfig(ranks=4, entries_per_rank=10, fault="crash", culprit=3), tmp_path / "nccl")
    rep = diagnose_path(tmp_path / "nccl")
    assert rep.verdict == "crash" and rep.culprit_ranks == (3,)
    # gloo's pg_config is broken: nothing says rank 3 existed, unless the world size is given
    write_dumps(SynthConfig(ranks=4, entries_per_rank=10, fault="crash", culprit=3, backend="gloo"),
                tmp_path / "gloo")
    assert diagnose_path(tmp_path / "gloo").verdict == "healthy"
    rep = diagnose_path(tmp_path / "gloo", world_size=4)
    assert rep.verdict == "crash" and rep.culprit_ranks == (3,)


# --- hand-built dumps for cross-group reasoning -------------------------------------------------------


def _e(pg: str, desc: str, seq: int, rid: int, *, state: str = "completed", op: str = "all_reduce") -> dict[str, Any]:
    return {
        "record_id": rid, "pg_id": 0 if pg == "0" else 1, "process_group": (pg, desc),
        "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": rid, "profiling_name": f"nccl:{op}",
        "time_created_ns": rid, "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]],
        "output_dtypes": ["Float"], "state": state, "time_discovered_started_ns": 1 if state != "scheduled" else None,
        "time_discovered_completed_ns": 2 if state == "completed" else None, "retired": state == "completed",
        "timeout_ms": 1000, "is_p2p": False, "frames": [{"name": "step", "filename": "train.py", "line": rid}],
    }


def _write(d: Path, rank: int, entries: list[dict[str, Any]]) -> None:
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(8)))},
           "1": {"name": "1", "desc": "tp", "ranks": "[0, 1, 2, 3]"},
           "2": {"name": "2", "desc": "tp", "ranks": "[4, 5, 6, 7]"}}
    top = {"version": "2.10", "pg_config": cfg, "pg_status": {}, "comm_lib_version": "", "entries": entries}
    (d / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(top, protocol=2))


def test_the_problem_that_blocks_the_other_comes_first(tmp_path: Path) -> None:
    # tp group 2: ranks 4, 5, 7 wait in tp seq 2, rank 6 never enters it (stuck in compute);
    # so 4-7 never reach default seq 2, where ranks 0-3 wait: that hang is a consequence.
    for r in range(8):
        tp = "1" if r < 4 else "2"
        es = [_e("0", "default_pg", 1, 0), _e(tp, "tp", 1, 1)]
        if r < 4:
            es += [_e(tp, "tp", 2, 2), _e("0", "default_pg", 2, 3, state="started")]
        elif r != 6:
            es += [_e(tp, "tp", 2, 2, state="started")]
        _write(tmp_path, r, es)
    rep = diagnose_path(tmp_path)
    assert [p.verdict for p in rep.problems] == ["hang", "hang"]
    first, second = rep.problems
    assert first.process_group == "2" and first.culprit_ranks == (6,) and first.waiting_ranks == (4, 5, 7)
    assert second.process_group == "0" and second.culprit_ranks == (4, 5, 6, 7)
    assert second.blocked_by == (0,)
    assert rep.verdict == "hang" and rep.culprit_ranks == (6,)


def test_device_never_started_on_one_rank(tmp_path: Path) -> None:
    # every rank entered default seq 2; it started on the device everywhere except on rank 3
    for r in range(8):
        _write(tmp_path, r, [_e("0", "default_pg", 1, 0),
                             _e("0", "default_pg", 2, 1, state="scheduled" if r == 3 else "started")])
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "hang" and rep.culprit_ranks == (3,)


def test_everyone_in_flight_is_not_a_problem(tmp_path: Path) -> None:
    for r in range(8):
        _write(tmp_path, r, [_e("0", "default_pg", 1, 0), _e("0", "default_pg", 2, 1, state="started")])
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "healthy" and rep.culprit_ranks == ()


def test_many_distinct_rank_classes_are_counted_exactly(tmp_path: Path) -> None:
    # 40 classes of 3 ranks; each class has its own group with class-specific sizes, so the fast
    # path keeps many templates (evicting and replaying some); rank 61 mismatches in the default group.
    n = 120
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(n)))}}
    for c in range(n // 3):
        cfg[f"x{c}"] = {"name": f"x{c}", "desc": "dp", "ranks": str([3 * c, 3 * c + 1, 3 * c + 2])}
    for r in range(n):
        c = r // 3
        es = []
        for seq in range(1, 4):
            x = _e(f"x{c}", "dp", seq, 2 * seq)
            x["pg_id"], x["input_sizes"], x["output_sizes"] = 5, [[c + 1]], [[c + 1]]
            es.append(x)
            d = _e("0", "default_pg", seq, 2 * seq + 1)
            if r == 61 and seq == 3:
                d["input_sizes"] = d["output_sizes"] = [[5]]
            es.append(d)
        top = {"version": "2.10", "pg_config": cfg, "pg_status": {}, "comm_lib_version": "", "entries": es}
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(top, protocol=2))
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "mismatch" and rep.culprit_ranks == (61,)
    assert rep.collective_seq == 3 and len(rep.problems) == 1
    assert f"majority ({n - 1} ranks)" in rep.explanation


def _plant_gather(directory: Path, sizes: int, input_dtype: Any) -> None:
    """Turn entry 5 of every rank's dump into a gather rooted at rank 0: only the root records outputs
    (as DCP's gather_object on gloo does). ``input_dtype(rank)`` gives each rank's input dtype."""
    for path in sorted(directory.iterdir()):
        rank = int(path.name.rsplit("_", 1)[1].split(".")[0])
        dump: dict[str, Any] = pickle.loads(path.read_bytes())
        e = dump["entries"][5]
        e["profiling_name"] = "gloo:gather"
        e["input_sizes"], e["input_dtypes"] = [[sizes]], [input_dtype(rank)]
        root_dtype = input_dtype(0)
        e["output_sizes"], e["output_dtypes"] = ([[sizes]] * 4, [root_dtype] * 4) if rank == 0 else ([], [])
        path.write_bytes(pickle.dumps(dump))


def test_rooted_gather_with_root_only_outputs_is_not_a_mismatch(tmp_path: Path) -> None:
    # Only the destination rank records output sizes and dtypes; that is how a gather looks, not a mismatch.
    write_dumps(SynthConfig(ranks=4, entries_per_rank=20, fault="none", backend="gloo"), tmp_path)
    _plant_gather(tmp_path, 24862, lambda rank: "Byte")
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "healthy", rep.explanation
    assert rep.culprit_ranks == ()


def test_rooted_gather_with_a_real_dtype_difference_is_still_a_mismatch(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=4, entries_per_rank=20, fault="none", backend="gloo"), tmp_path)
    _plant_gather(tmp_path, 8, lambda rank: "Int" if rank == 3 else "Float")
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "mismatch" and rep.culprit_ranks == (3,), rep.explanation
