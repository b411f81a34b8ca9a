"""The peers benchmark's reading of step logs and NVRx's log, and its table."""

from __future__ import annotations

import time

import pytest

from benchmarks.peers_summary import crash_gap, nvrx_detections, spread, table


def _line(rank: int, step: int, t: float, restart: int = 0) -> dict[str, float]:
    return {"rank": rank, "step": step, "time": t, "restart": restart}


def test_a_full_restart_counts_only_steps_of_the_new_processes() -> None:
    lines = [_line(0, 1, 10.0), _line(1, 1, 10.0), _line(1, 2, 11.0),
             _line(0, 2, 11.2),  # the old rank 0 finished its step after rank 1 died: not recovery
             _line(0, 1, 18.0, restart=1), _line(1, 1, 19.5, restart=1), _line(0, 2, 19.6, restart=1)]
    gap = crash_gap(lines, fault_rank=1, fault_step=2)
    assert gap.fault_time == 11.0
    assert gap.first_new_step_seconds == pytest.approx(8.5)  # the slowest rank's first new step
    assert gap.survivor_stall_seconds is None


def test_a_continuing_rank_counts_its_own_steps_and_its_stall_is_given() -> None:
    lines = [_line(1, 5, 10.0), _line(0, 5, 10.01),  # the survivor ends the fault step just after: not recovery
             _line(0, 6, 15.0), _line(1, 6, 16.0, restart=1)]
    gap = crash_gap(lines, fault_rank=1, fault_step=5, continuing_ranks=(0,))
    assert gap.first_new_step_seconds == pytest.approx(6.0)
    assert gap.survivor_stall_seconds == pytest.approx(5.0)


def test_a_fault_rank_that_healed_past_the_fault_step_faults_at_its_first_step_after_it() -> None:
    # A torchft group that joined late heals to its peer's step and never logs step 2 itself; its copy of the
    # script kills itself at the first step past it. Before, the benchmark reported an error for that run.
    lines = [_line(0, 1, 9.0), _line(0, 2, 9.5), _line(1, 3, 10.0), _line(0, 3, 10.01),
             _line(0, 4, 12.0), _line(1, 4, 13.0, restart=1)]
    gap = crash_gap(lines, fault_rank=1, fault_step=2, continuing_ranks=(0,))
    assert gap.fault_time == 10.0
    assert gap.survivor_stall_seconds == pytest.approx(2.0)  # step 3 on rank 0 is the fault step's end, not recovery


def test_a_rank_that_never_steps_again_is_an_error_not_a_figure() -> None:
    with pytest.raises(ValueError, match=r"ranks \[0\]"):
        crash_gap([_line(0, 2, 10.0), _line(1, 2, 10.0), _line(1, 1, 20.0, restart=1)], 1, 2)
    with pytest.raises(ValueError, match="never logged step 3"):
        crash_gap([_line(1, 2, 10.0)], 1, 3)


def test_nvrx_hang_lines_give_local_time_and_rank_in_order() -> None:
    log = "\n".join([
        "[2026-12-05 10:26:18,100] [INFO] [RankMonServer27905@vm:0] Started periodic restart check.",
        "[2026-12-05 10:26:18,258] [WARNING] [RankMonServer27905@vm:0] Did not get subsequent heartbeat. Waited 0.29 s",
        "[2026-12-05 10:26:18,289] [WARNING] [RankMonServer27906@vm:1] Did not get subsequent heartbeat. Waited 0.29 s",
        "[2026-12-05 10:26:19,001] [WARNING] [ft_launcher27896@vm] Did not get subsequent heartbeat.",
    ])
    found = nvrx_detections(log)
    base = time.mktime(time.strptime("2026-12-05 10:26:18", "%Y-%m-%d %H:%M:%S"))
    assert [r for _, r in found] == [0, 1]
    assert found[0][0] == pytest.approx(base + 0.258)


def test_spread_counts_missing_values_and_the_table_says_never() -> None:
    s = spread([3.0, None, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"], s["missing"]) == (2.0, 1.0, 3.0, 3, 1)
    summary = {"x": {"crash_early": {"first_new_step": spread([4.0])},
                     "hang": {"detection": spread([None, None]), "culprit_right": 0, "culprit_named": 0}},
               "y": {"hang": {"detection": spread([2.0, 6.0, None]), "culprit_right": 1, "culprit_named": 2}}}
    text = table(summary, {"x": "system x"}, 30)
    assert "| system x | 4.00 s | not run | none within 30 s | names no rank |" in text
    assert "| y | not run | not run | 4.00 s (2.00-6.00), none within 30 s in 1 | 1 of 2 |" in text


def test_only_a_run_of_every_system_and_fault_replaces_the_peers_table() -> None:
    from benchmarks.peers import FAULTS, SYSTEMS, default_out

    assert default_out(list(SYSTEMS), list(FAULTS)).endswith("benchmarks/results/peers.json")
    assert default_out(["torchrun", "trainguard_heal"], list(FAULTS)) == ""
    assert default_out(list(SYSTEMS), ["crash_early"]) == ""
