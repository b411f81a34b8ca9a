"""Verdicts from every signal the dumps carry: pipelines, tensor-parallel stages, send/recv mixed with
collectives, on gloo (no send/recv records, op ids and pg_status in op-id space) and NCCL."""

from __future__ import annotations

import itertools
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from trainguard.cli import main
from trainguard.localize import Problem, diagnose_path
from trainguard.localize.synth import SynthConfig, rank_dump, write_dumps
from trainguard.localize.verdicts import order_problems


def _write(directory: Path, dumps: dict[int, dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for rank, raw in dumps.items():
        (directory / f"fr_trace_rank_{rank}").write_bytes(pickle.dumps(raw, protocol=2))
    return directory


def _timed_out(cfg: SynthConfig) -> dict[int, dict[str, Any]]:
    """The dumps after gloo's timeout: gloo retires failed work too, and counts it as completed."""
    out = {}
    for r in range(cfg.ranks):
        raw = rank_dump(cfg, r)
        if raw is None:
            continue
        for e in raw["entries"]:
            e["retired"] = True
        for st in raw["pg_status"].values():
            st["last_completed_collective"] = st["last_enqueued_collective"]
        out[r] = raw
    return out


# --- the pipeline stage that receives and never sends ----------------------------------------------------


@pytest.mark.parametrize("recent", [None, 4])
def test_gloo_pipeline_stage_that_never_sends_is_a_hang(tmp_path: Path, recent: int | None) -> None:
    # gloo records no send/recv: every recorded collective matches, but ranks 0 and 1 entered one more
    # all-reduce than ranks 2 and 3, and their pg_status counters (op ids) disagree
    cfg = SynthConfig(ranks=4, pp=4, entries_per_rank=40, fault="no-send", culprit=2, backend="gloo", recent=recent)
    write_dumps(cfg, tmp_path)
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "hang", rep.explanation
    assert rep.culprit_ranks == (2, 3) and rep.problems[0].waiting_ranks == (0, 1)
    assert rep.process_group == "0" and rep.op == "all_reduce" and len(rep.problems) == 1
    assert rep.problems[0].missing_records and rep.problems[0].missing_records[0].startswith("send/recv")
    assert rep.missing_records == rep.problems[0].missing_records
    assert "gloo records no send/recv" in rep.explanation


def test_gloo_pipeline_after_the_timeout_is_still_a_hang(tmp_path: Path) -> None:
    # after the timeout everything is retired: the leaders' all-reduce cannot have finished without the
    # ranks that never entered it, so it failed
    cfg = SynthConfig(ranks=4, pp=4, entries_per_rank=40, fault="no-send", culprit=2, backend="gloo")
    rep = diagnose_path(_write(tmp_path, _timed_out(cfg)))
    assert rep.verdict == "hang" and rep.culprit_ranks == (2, 3), rep.explanation
    assert rep.problems[0].waiting_ranks == (0, 1) and rep.problems[0].confidence == 0.7
    assert "retired" in rep.explanation


def test_gloo_collective_hang_after_the_timeout(tmp_path: Path) -> None:
    cfg = SynthConfig(ranks=4, entries_per_rank=20, fault="hang", culprit=2, backend="gloo")
    rep = diagnose_path(_write(tmp_path, _timed_out(cfg)))
    assert rep.verdict == "hang" and rep.culprit_ranks == (2,) and rep.problems[0].waiting_ranks == (0, 1, 3)
    assert rep.missing_records == ()  # no send/recv in this job


def test_nccl_pipeline_names_the_stage_that_never_sent(tmp_path: Path) -> None:
    # NCCL records the send/recv: rank 3 waits in a receive from rank 2, which posted no send and waits
    # for nothing; ranks 0 and 1 wait in the all-reduce that 2 and 3 never reach (a consequence)
    write_dumps(SynthConfig(ranks=4, pp=4, entries_per_rank=40, fault="no-send", culprit=2), tmp_path)
    rep = diagnose_path(tmp_path)
    assert [(p.verdict, p.culprit_ranks) for p in rep.problems] == [("p2p-hang", (2,)), ("hang", (2, 3))]
    assert rep.verdict == "p2p-hang" and rep.culprit_ranks == (2,)
    hang = rep.problems[1]
    assert hang.blocked_by == (0,) and hang.waiting_ranks == (0, 1)
    # rank 2's pg_status names its last receive's p2p sequence number, not a collective one
    assert hang.collective_seq == 1041


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_skipped_send_names_the_rank_that_skipped_it(tmp_path: Path, backend: str) -> None:
    # rank 1 skips its send and goes on to the all-reduce; ranks 2 and 3 wait in receives
    write_dumps(SynthConfig(ranks=4, pp=4, entries_per_rank=40, fault="p2p-hang", culprit=1, backend=backend),
                tmp_path)
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "p2p-hang" and rep.culprit_ranks == (1,), rep.explanation
    assert set(rep.problems[0].waiting_ranks) == {2, 3}
    assert [p.culprit_ranks for p in rep.problems[1:]] == [(2, 3)]
    if backend == "gloo":  # inferred from op ids: one send/recv fewer than in every earlier step
        assert rep.collective_seq is None and "skipped a send or receive" in rep.explanation
        assert rep.missing_records
    else:  # rank 2 waits in a receive of its own: a link of the chain, not a cause
        assert "a consequence" in rep.explanation


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_skipped_send_between_tensor_parallel_stages(tmp_path: Path, backend: str) -> None:
    # 4 stages of 2 tp ranks: rank 6 skips its send to rank 10, which never reaches its tp all-reduce,
    # where rank 11 waits (and so never sends to 15)
    write_dumps(SynthConfig(ranks=16, pp=4, tp=2, entries_per_rank=60, fault="p2p-hang", culprit=6,
                            backend=backend), tmp_path)
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "p2p-hang" and rep.culprit_ranks == (6,), rep.explanation
    second = rep.problems[1]
    assert second.verdict == "hang" and second.culprit_ranks == (10,) and second.waiting_ranks == (11,)
    assert second.group_ranks == (10, 11) and second.blocked_by == (0,)


def test_tensor_parallel_stage_that_stops_after_receiving(tmp_path: Path) -> None:
    cfg = dict(ranks=16, pp=2, tp=4, entries_per_rank=60, fault="no-send", culprit=5)
    write_dumps(SynthConfig(**cfg, backend="gloo"), tmp_path / "gloo")  # type: ignore[arg-type]
    rep = diagnose_path(tmp_path / "gloo")
    assert rep.verdict == "hang" and rep.culprit_ranks == (5,)
    assert rep.problems[0].group_ranks == (4, 5, 6, 7) and rep.problems[0].waiting_ranks == (4, 6, 7)
    write_dumps(SynthConfig(**cfg), tmp_path / "nccl")  # type: ignore[arg-type]
    rep = diagnose_path(tmp_path / "nccl")
    # the ranks 12-15 wait on sends of 4-7: 4, 6 and 7 wait in their tp all-reduce, 5 waits for nothing
    assert [(p.verdict, p.culprit_ranks) for p in rep.problems[:2]] == [("p2p-hang", (5,)), ("hang", (5,))]


# --- insufficient evidence: what the dumps do not record -----------------------------------------------


def test_healthy_gloo_pipeline_is_insufficient_evidence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_dumps(SynthConfig(ranks=4, pp=4, entries_per_rank=40, backend="gloo"), tmp_path / "gloo")
    assert main(["diagnose", str(tmp_path / "gloo"), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "insufficient-evidence" and doc["culprit_ranks"] == []
    assert doc["missing_records"][0].startswith("send/recv in group 0")
    assert doc["problems"][0]["missing_records"] == doc["missing_records"]
    assert main(["diagnose", str(tmp_path / "gloo")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("verdict: insufficient-evidence") and "not recorded in the dumps:" in out
    # NCCL records its send/recv: the same job is healthy there
    write_dumps(SynthConfig(ranks=4, pp=4, entries_per_rank=40), tmp_path / "nccl")
    assert main(["diagnose", str(tmp_path / "nccl")]) == 0


def test_gloo_job_without_send_recv_stays_healthy(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=8, tp=4, entries_per_rank=40, backend="gloo"), tmp_path)
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "healthy" and rep.missing_records == ()


_RECORDER_OFF = {"version": "2.10", "pg_config": {}, "comm_lib_version": "", "pg_status": {}}
"""What torch 2.13 dumps on gloo with TORCH_FR_BUFFER_SIZE=0 (measured)."""


def test_empty_recorders_are_insufficient_evidence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, dict.fromkeys(range(3), _RECORDER_OFF))
    assert main(["diagnose", str(tmp_path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "insufficient-evidence" and doc["culprit_ranks"] == [0, 1, 2]
    assert "TORCH_FR_BUFFER_SIZE=0" in doc["missing_records"][0] and "record no collective" in doc["explanation"]


@pytest.mark.parametrize("fault", ["none", "hang"])
def test_one_empty_recorder_is_unknown_never_healthy(tmp_path: Path, fault: str) -> None:
    cfg = SynthConfig(ranks=4, entries_per_rank=20, fault=fault, culprit=1)
    dumps = {r: rank_dump(cfg, r) for r in range(4)}
    dumps[1] = dict(_RECORDER_OFF)  # the culprit's recorder was off
    rep = diagnose_path(_write(tmp_path, dumps))  # type: ignore[arg-type]
    assert rep.verdict == "insufficient-evidence" and rep.culprit_ranks == (1,), rep.explanation
    assert rep.unreadable_ranks == () and any("entries of rank 1" in m for m in rep.missing_records)
    if fault == "hang":
        assert rep.problems[0].waiting_ranks == (0, 2, 3)


# --- pg_status beyond the entries ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_pg_status_shows_an_op_the_entries_lack(tmp_path: Path, backend: str) -> None:
    # rank 0's newest entry (the all-reduce it waits in) is missing from its dump, but its pg_status
    # counts it enqueued and not completed: it waits too
    cfg = SynthConfig(ranks=4, entries_per_rank=20, fault="hang", culprit=3, backend=backend)
    dumps = {r: rank_dump(cfg, r) for r in range(4)}
    del dumps[0]["entries"][-1]  # type: ignore[index]
    rep = diagnose_path(_write(tmp_path, dumps))  # type: ignore[arg-type]
    assert rep.verdict == "hang" and rep.culprit_ranks == (3,)
    assert rep.problems[0].waiting_ranks == (0, 1, 2)
    assert any(m.startswith("newest entries of rank 0") for m in rep.missing_records)


# --- ordering: causes first -------------------------------------------------------------------------------


def _p(verdict: str, culprits: tuple[int, ...], waiting: tuple[int, ...], group: str) -> Problem:
    return Problem(verdict=verdict, process_group=group, process_group_desc="", group_ranks=(), collective_seq=1,
                   op="all_reduce", culprit_ranks=culprits, culprit_hosts=(), waiting_ranks=waiting,
                   consequence_ranks=(), explanation="")


def test_a_blocked_problem_comes_after_its_cause_whatever_the_tie_breaks() -> None:
    # B's waiting rank 5 is A's culprit: B blocks A. A ranks first on every tie-break (one culprit,
    # group name), so only the blocked test can put B first.
    a = _p("hang", (5,), (1, 2), "a")
    b = _p("p2p-hang", (7, 8), (5,), "b")
    for given in ([a, b], [b, a]):
        ordered = order_problems(given)
        assert [p.process_group for p in ordered] == ["b", "a"]
        assert ordered[1].blocked_by == (0,)


# --- clones (ranks equal to a checked template) are still type-checked where they differ -----------------


@pytest.mark.parametrize(("field", "value"), [("frames", [{"name": 10**5000}]), ("process_group", [["0"], 1]),
                                              ("record_id", "7"), ("time_created_ns", 2.5)])
def test_a_clone_with_a_hostile_field_is_unreadable(tmp_path: Path, field: str, value: Any) -> None:
    cfg = SynthConfig(ranks=4, entries_per_rank=10, fault="hang", culprit=3)
    dumps = {r: rank_dump(cfg, r) for r in range(4)}
    dumps[1]["entries"][-1][field] = value  # type: ignore[index]  # rank 1 equals rank 0 in compared fields
    rep = diagnose_path(_write(tmp_path, dumps))  # type: ignore[arg-type]
    assert rep.unreadable_ranks == (1,)
    assert any(w.rank == 1 and f"'{field}'" in w.message for w in rep.warnings)
    assert rep.verdict == "hang" and rep.culprit_ranks == (3,)


# --- the synthetic dumps model what torch writes ----------------------------------------------------------


def test_synthetic_gloo_counts_send_recv_in_op_ids_only() -> None:
    cfg = SynthConfig(ranks=4, pp=4, entries_per_rank=6, backend="gloo")
    raw = rank_dump(cfg, 1)  # receives and sends every step
    assert raw is not None
    entries = raw["entries"]
    assert all(not e["is_p2p"] and e["profiling_name"] == "gloo:all_reduce" for e in entries)
    assert [b["op_id"] - a["op_id"] for a, b in itertools.pairwise(entries)] == [3] * 5
    assert [b["collective_seq_id"] - a["collective_seq_id"] for a, b in itertools.pairwise(entries)] == [1] * 5
    assert raw["pg_status"]["0"]["last_enqueued_collective"] == entries[-1]["op_id"]  # op ids, as gloo counts
    nccl = rank_dump(SynthConfig(ranks=4, pp=4, entries_per_rank=6), 1)
    assert nccl is not None
    names = [e["profiling_name"] for e in nccl["entries"][-3:]]
    assert names == ["nccl:recv 1<-0", "nccl:send 1->2", "nccl:all_reduce"]
    assert nccl["pg_status"]["0"]["last_enqueued_collective"] == nccl["entries"][-1]["collective_seq_id"]


def test_synthetic_pipeline_config_is_validated() -> None:
    with pytest.raises(ValueError, match="pipeline stages"):
        SynthConfig(ranks=4, fault="no-send")
    with pytest.raises(ValueError, match="stage that sends"):
        SynthConfig(ranks=4, pp=4, fault="no-send", culprit=3)
    with pytest.raises(ValueError, match="pp must divide"):
        SynthConfig(ranks=6, pp=4)
