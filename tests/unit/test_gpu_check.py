"""benchmarks/gpu_check.py's pure helpers: the JSON shape, the deadline, the nvidia-smi parser, the comparisons."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


gc = _load()

SMI = """0, NVIDIA H200, 34, 74.12, 1980, 0, 1234
1, NVIDIA H200, [N/A], [Not Supported], 345, 12, 0
"""


def test_the_script_imports_only_the_standard_library_at_the_top() -> None:
    # Importing it must not pull torch or trainguard: the orchestrator and the overhead worker rely on it.
    assert "torch" not in vars(gc) and "trainguard" not in vars(gc)


def test_nvidia_smi_csv_is_parsed_with_numbers_names_and_missing_values() -> None:
    rows = gc.parse_smi_csv(SMI)
    assert rows[0] == {"index": 0, "name": "NVIDIA H200", "temperature.gpu": 34.0, "power.draw": 74.12,
                       "clocks.sm": 1980.0, "utilization.gpu": 0.0, "memory.used": 1234.0}
    assert rows[1]["index"] == 1 and rows[1]["temperature.gpu"] is None and rows[1]["power.draw"] is None
    assert rows[1]["clocks.sm"] == 345.0


def test_a_name_with_commas_is_rejoined_and_a_short_line_is_refused() -> None:
    rows = gc.parse_smi_csv("3, Odd, Name GPU, 40, 100, 1400, 5, 10\n")
    assert rows[0]["name"] == "Odd, Name GPU" and rows[0]["index"] == 3 and rows[0]["memory.used"] == 10.0
    with pytest.raises(ValueError, match="fields"):
        gc.parse_smi_csv("0, NVIDIA H200, 34\n")
    assert gc.parse_smi_csv("\n\n") == []


def test_deadline_cuts_section_timeouts_and_keeps_a_reserve() -> None:
    now = [0.0]
    d = gc.Deadline(100.0, clock=lambda: now[0])
    assert d.timeout_for(30.0) == 30.0
    assert d.timeout_for(500.0) == 100.0 - gc.FINISH_MARGIN
    assert d.timeout_for(500.0, reserve_fraction=0.5) == 50.0 - gc.FINISH_MARGIN
    now[0] = 90.0
    assert d.remaining() == 10.0 and d.timeout_for(30.0) == 10.0 - gc.FINISH_MARGIN
    assert d.timeout_for(30.0, reserve_fraction=0.5) == 0.0
    now[0] = 200.0
    assert d.remaining() == 0.0 and d.expired() and d.timeout_for(30.0) == 0.0


def test_assembled_result_is_one_json_object_with_ok_per_section() -> None:
    sections = {
        "demo_nccl": {"ok": True, "loss": {"abs_difference": float("nan")}, "findings": ["one"]},
        "nvml": gc.skipped("no GPU", ok=True),
        "overhead": {"ok": False, "checks": {"at_least_one_pair": False}},
        "checkpoint_gpu": "garbage",
    }
    out = gc.assemble("cpu-smoke", {"ok": True}, sections, started="t", wall_seconds=1.234, deadline_seconds=450.0,
                      findings=["env finding"])
    text = json.dumps(out, allow_nan=False)  # no NaN survives
    assert json.loads(text)["format"] == gc.FORMAT
    assert out["ok"] is False and out["mode"] == "cpu-smoke" and out["wall_seconds"] == 1.23
    assert list(out["sections"]) == ["demo_nccl", "nvml", "checkpoint_gpu", "overhead"]  # the documented order
    for sec in out["sections"].values():
        assert isinstance(sec["ok"], bool) and isinstance(sec["skipped"], bool)
        assert sec["ok"] or sec["skipped"] or sec["error"]
    assert out["sections"]["demo_nccl"]["loss"]["abs_difference"] is None
    assert out["sections"]["overhead"]["error"] == "at_least_one_pair failed"
    assert "returned str" in out["sections"]["checkpoint_gpu"]["error"]
    assert out["summary"] == {"demo_nccl": "ok", "nvml": "skipped", "checkpoint_gpu": "failed", "overhead": "failed"}
    assert out["findings"] == ["env finding", "demo_nccl: one"]
    assert out["goals"] == {} and out["goals_note"]  # the smoke run judges no goal
    with_goals = gc.assemble("gpu", {}, {"overhead": {"ok": True, "goal_met": False},
                                         "checkpoint_gpu": {"ok": True, "goals": {"fast": True}}},
                             started="t", wall_seconds=0, deadline_seconds=450.0)
    assert with_goals["ok"] is True  # goals are reported, not part of ok
    assert with_goals["goals"] == {"checkpoint_gpu.fast": True, "overhead.goal_met": False}
    all_ok = gc.assemble("gpu", {"ok": True}, {"nvml": {"ok": True}}, started="t", wall_seconds=0,
                         deadline_seconds=450.0)
    assert all_ok["ok"] is True


def test_json_object_is_found_after_other_output() -> None:
    assert gc.parse_json_object('noise\n{"a": 1}\n') == {"a": 1}
    assert gc.parse_json_object("[1, 2]") is None
    assert gc.parse_json_object("") is None


def test_losses_take_the_last_execution_of_each_step_and_compare_exactly() -> None:
    lines = [json.dumps({"type": "step_completed", "step": s, "loss": loss})
             for s, loss in ((1, 5.0), (2, 4.0), (2, 3.5), (3, 3.0))] + ["not json", '{"type": "other"}']
    losses = gc.step_losses(lines)
    assert losses == {1: 5.0, 2: 3.5, 3: 3.0}
    same = gc.compare_losses(losses, dict(losses), 3)
    assert same["bitwise_equal"] and same["equal_within_tolerance"] and same["steps_compared"] == 3
    off = gc.compare_losses(losses, {**losses, 3: 3.0 + 1e-3}, 3)
    assert not off["equal_within_tolerance"] and off["abs_difference"] == pytest.approx(1e-3)
    missing = gc.compare_losses(losses, {1: 5.0}, 3)
    assert missing["final_loss_with_faults"] is None and not missing["equal_within_tolerance"]


def test_nvml_comparison_brackets_nvidia_smi_between_two_readings() -> None:
    before = {"temperature_c": 40.0, "power_watts": 100.0, "clock_mhz": 1980.0}
    after = {"temperature_c": 42.0, "power_watts": 300.0, "clock_mhz": 1980.0}
    smi = {"temperature.gpu": 41.0, "power.draw": 200.0, "clocks.sm": 1000.0, "utilization.gpu": None}
    cmp = gc.compare_round(before, smi, after)
    assert cmp["temperature_c"]["within_tolerance"] and cmp["temperature_c"]["difference"] == 0.0
    assert cmp["power_watts"]["within_tolerance"]  # inside the bracket even though it differs from both ends
    assert cmp["clock_mhz"]["within_tolerance"] is False and cmp["clock_mhz"]["difference"] == -980.0
    assert cmp["utilization_pct"]["within_tolerance"] is None
    summary = gc.summarize_rounds([cmp, cmp])
    assert summary["clock_mhz"] == {"max_abs_difference": 980.0, "rounds_compared": 2, "all_within_tolerance": False,
                                    "tolerance_abs_rel": list(gc.NVML_TOLERANCES["clock_mhz"])}
    assert not gc.sampler_ok({"0": summary})
    good = gc.summarize_rounds([gc.compare_round(before, {**smi, "clocks.sm": 1990.0}, after)])
    assert gc.sampler_ok({"0": good}) and not gc.sampler_ok({})


def test_pairs_alternate_and_the_overhead_is_the_median_pair_ratio() -> None:
    assert [gc.pair_order(i)[0] for i in range(4)] == ["trainguard", "torchrun", "trainguard", "torchrun"]
    pairs = [{"ratio_median": r, "ratio_mean": r} for r in (1.002, 1.03, 0.999)]
    s = gc.overhead_summary(pairs)
    assert s["median_ratio"] == 1.002 and s["overhead_fraction"] == pytest.approx(0.002) and s["goal_met"]
    assert gc.overhead_summary([{"ratio_median": 1.05, "ratio_mean": 1.05}])["goal_met"] is False
    assert gc.overhead_summary([])["goal_met"] is None


def test_dump_summary_counts_states_ops_and_timing() -> None:
    dump = {"version": "2.10", "pg_status": {"0": {}}, "entries": [
        {"state": "completed", "profiling_name": "nccl:all_reduce", "duration_ms": 0.1},
        {"state": "completed", "profiling_name": "nccl:all_reduce", "time_discovered_started_ns": 5},
        {"state": "scheduled", "profiling_name": "nccl:broadcast"}, "not an entry"]}
    s = gc.dump_summary(dump)
    assert s["entries"] == 3 and s["states"] == {"completed": 2, "scheduled": 1}
    assert s["ops"] == {"nccl:all_reduce": 2, "nccl:broadcast": 1} and s["entries_with_timing"] == 2
    assert gc.dump_summary(["x"]) == {"decoded": False}


def test_cli_refuses_unknown_sections_and_absurd_deadlines(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        gc.parse_args(["--only", "nope"])
    with pytest.raises(SystemExit):
        gc.parse_args(["--deadline", "5"])
    args = gc.parse_args(["--only", "nvml,overhead", "--skip", "overhead"])
    assert args.sections == ["nvml"]
    assert gc.parse_args([]).sections == list(gc.SECTIONS)


def _gone(pid: int) -> bool:
    try:
        return "zombie" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def test_a_command_past_its_timeout_is_stopped_with_everything_it_started(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    done = gc.run_cmd(["bash", "-c", f"sleep 60 & echo $! > {marker}; wait"], 1.0, logs=tmp_path, name="slow")
    assert done.timed_out and done.rc is None and done.seconds < 15
    child = int(marker.read_text())
    for _ in range(100):  # a killed process may take a moment to go on a loaded machine
        if _gone(child):
            break
        time.sleep(0.05)
    assert _gone(child)
    quick = gc.run_cmd(["bash", "-c", "echo out; echo err >&2; exit 3"], 10.0, logs=tmp_path, name="quick")
    assert (quick.rc, quick.out.strip(), quick.err.strip(), quick.timed_out) == (3, "out", "err", False)
