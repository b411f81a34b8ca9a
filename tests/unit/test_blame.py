"""Hang culprits from gathered facts, and reading the dumps they come from (restricted unpickling)."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.launch import blame
from trainguard.launch.blame import HangFacts, backend_of, default_group_enqueued, hang_culprits, is_stopped
from trainguard.launch.evidence import proc_state, read_dumps


def test_stopped_rank_is_the_culprit_and_the_explanation_says_why() -> None:
    b = hang_culprits(HangFacts(world_size=4, enqueued={0: 7, 1: 7, 3: 7}, stopped=(2,), steps={0: 5, 2: 5}))
    assert b.culprits == (2,) and b.rule == "stopped"
    assert "stopped" in b.explanation and "control thread could not answer" in b.explanation
    assert "itself the culprit" in b.explanation


def test_a_rank_short_of_the_collective_the_others_wait_in_is_the_culprit() -> None:
    b = hang_culprits(HangFacts(world_size=3, enqueued={0: 11, 1: 12, 2: 12}, steps={0: 5, 1: 5, 2: 5}))
    assert b.culprits == (0,) and b.rule == "enqueued" and "enqueued fewer" in b.explanation


def test_a_live_rank_that_cannot_answer_while_others_did_is_frozen() -> None:
    b = hang_culprits(HangFacts(world_size=3, enqueued={0: 4, 1: 4}, unanswered=(2,)))
    assert b.culprits == (2,) and b.rule == "frozen" and "culprit signal" in b.explanation
    stale = hang_culprits(HangFacts(world_size=2, enqueued={0: 4}, stale=(1,)))
    assert stale.culprits == (1,) and "heartbeat" in stale.explanation


def test_nobody_answering_is_not_blamed_on_everyone() -> None:
    b = hang_culprits(HangFacts(world_size=2, unanswered=(0, 1), steps={0: 3, 1: 2}))
    assert b.culprits == (1,) and b.rule == "steps"


def test_unreadable_dump_is_reported_but_not_blamed() -> None:
    b = hang_culprits(HangFacts(world_size=3, enqueued={0: 5, 1: 5}, unreadable={2: "damaged or truncated pickle"},
                                steps={0: 4, 1: 4, 2: 4}))
    assert b.culprits == () and b.rule == "none"
    assert "rank 2: damaged or truncated pickle" in b.explanation


def test_missing_dump_and_steps_behind_are_the_last_resorts() -> None:
    assert hang_culprits(HangFacts(world_size=3, enqueued={0: 5, 1: 5})).culprits == (2,)
    assert hang_culprits(HangFacts(world_size=2, steps={0: 9, 1: 8})).culprits == (1,)
    assert hang_culprits(HangFacts(world_size=2, steps={0: 9, 1: 9})).culprits == ()


def test_status_and_backend_helpers() -> None:
    assert default_group_enqueued({"0": {"last_enqueued_collective": 6}, "1": {"last_enqueued_collective": 9}}) == 6
    assert default_group_enqueued({"3": {"last_enqueued_collective": 2}}) == 2
    assert default_group_enqueued({}) == -1
    assert backend_of([{"profiling_name": "gloo:all_reduce"}]) == "gloo"
    assert backend_of([{"profiling_name": "nccl:broadcast"}]) == "nccl"
    assert backend_of([]) is None
    assert is_stopped("T") and is_stopped("t") and not is_stopped("S") and not is_stopped(None)


def _dump(enqueued: int) -> bytes:
    entry = {"collective_seq_id": enqueued, "p2p_seq_id": 0, "op_id": enqueued, "record_id": enqueued,
             "pg_id": 0, "process_group": ("0", "default_pg"), "profiling_name": "gloo:all_reduce",
             "input_sizes": [[4]], "output_sizes": [[4]], "input_dtypes": ["Float"], "output_dtypes": ["Float"],
             "is_p2p": False, "retired": False, "state": "scheduled", "timeout_ms": 1000,
             "time_created_ns": 1, "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
             "thread_id": 1, "thread_name": "main", "frames": []}
    return pickle.dumps({"version": "2.10", "pg_config": {}, "comm_lib_version": "", "entries": [entry],
                         "pg_status": {"0": {"last_enqueued_collective": enqueued,
                                             "last_started_collective": -1,
                                             "last_completed_collective": enqueued - 1}}})


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("code ran",))


def test_dumps_are_read_with_the_restricted_unpickler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "fr_trace_rank_0.pkl").write_bytes(_dump(12))
    (tmp_path / "fr_trace_rank_1.pkl").write_bytes(_dump(11))
    (tmp_path / "fr_trace_rank_2.pkl").write_bytes(_dump(12)[:40])  # torn
    (tmp_path / "fr_trace_rank_3.pkl").write_bytes(pickle.dumps({"version": "2.10", "entries": [_Boom()]}))
    summary = read_dumps(tmp_path)
    assert summary.enqueued == {0: 12, 1: 11} and summary.backend == "gloo"
    assert set(summary.unreadable) == {2, 3}
    assert "code ran" not in capsys.readouterr().out  # a pickle that calls code is refused, never run


def test_proc_state_sees_a_stopped_process() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert proc_state(proc.pid) in ("R", "S")
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while proc_state(proc.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert is_stopped(proc_state(proc.pid))
    finally:
        proc.kill()
        proc.wait()
    assert proc_state(proc.pid) is None


def test_pipeline_ranks_in_step_are_not_behind_though_gloo_op_ids_differ() -> None:
    from trainguard.launch.blame import default_group_collectives

    # Stage 1 also sent and received: its gloo op id counter is ahead, its collectives are not.
    def allreduce(seq: int) -> dict[str, object]:
        return {"pg_id": 0, "is_p2p": False, "collective_seq_id": seq, "profiling_name": "gloo:all_reduce"}

    stage0 = default_group_collectives([allreduce(1), allreduce(2)], {"0": {"last_enqueued_collective": 6}})
    stage1 = default_group_collectives([allreduce(1), allreduce(2)], {"0": {"last_enqueued_collective": 9}})
    assert stage0 == stage1 == 2
    lagging = default_group_collectives([allreduce(1)], {"0": {"last_enqueued_collective": 9}})
    assert lagging == 1
    assert default_group_collectives([], {"0": {"last_enqueued_collective": 4}}) == 4  # no entries: counters


def test_exit_codes_are_said_in_words_and_a_silent_sigkill_is_explained() -> None:
    codes = {0: -signal.SIGABRT, 1: -signal.SIGKILL, 2: 1}
    assert blame.crash_detail(codes) == "rank 0 killed by SIGABRT, rank 1 killed by SIGKILL, rank 2 exit code 1"
    assert blame.exit_words(-200) == "killed by signal 200"
    culprits, kind = blame.crash_culprits(codes)
    assert (culprits, kind) == ([1], "crash")
    note = blame.unexplained_crash_note(codes, culprits)
    assert "rank 1 died of SIGKILL" in note and "OOM killer" in note
    # a rank that exited with its own error gets no such guess
    assert blame.unexplained_crash_note({0: 1}, [0]) == ""
    assert blame.unexplained_crash_note({0: -signal.SIGSEGV}, [0]) == ""


def test_the_only_rank_of_a_one_rank_job_is_the_culprit_of_its_hang() -> None:
    b = hang_culprits(HangFacts(world_size=1, enqueued={0: 4}, steps={0: 9}))
    assert b.culprits == (0,) or list(b.culprits) == [0], b
