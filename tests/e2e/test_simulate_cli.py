"""`trainguard simulate` and `trainguard plan` from the command line: JSON schemas, run directory, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cli import assert_one_line_error, trainguard

BUCKETS = {"startup", "checkpoint_save", "checkpoint_restore", "lost_progress", "detection", "restart", "straggler",
           "other"}


def test_simulate_json_schema_and_events_for_report(tmp_path: Path) -> None:
    run = tmp_path / "simrun"
    r = trainguard("simulate", "--trials", "50", "--days", "7", "--json", "--events", str(run))
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert set(doc["ettr"]) >= {"mean", "p5", "p95"}
    assert doc["ettr"]["p5"] <= doc["ettr"]["mean"] <= doc["ettr"]["p95"]
    assert "Faulty GPU" in doc["interruptions"]["by_category"]
    assert doc["interruptions"]["mean"] == pytest.approx(doc["interruptions"]["unexpected_mean"]
                                                         + doc["interruptions"]["planned_mean"])
    assert doc["mttf_hours"] == pytest.approx(3.09, rel=0.1)
    assert doc["power_swing_mw"] > 5
    assert set(doc["badput_hours"]) == BUCKETS
    rep = trainguard("report", str(run), "--json")
    assert rep.code == 0, rep.err
    report = json.loads(rep.out)
    ettr = report["productive_seconds"] / report["wall_seconds"]
    assert ettr == pytest.approx(doc["events_trial"]["ettr"], rel=0.005)
    again = trainguard("simulate", "--trials", "5", "--days", "1", "--events", str(run))
    assert_one_line_error(again, 2)


def test_simulate_text_and_custom_model(tmp_path: Path) -> None:
    model = tmp_path / "m.toml"
    model.write_text('name = "mine"\n[[failure]]\ncategory = "NIC"\nrate_per_node_day = 0.01\ndetection = "hang"\n')
    r = trainguard("simulate", "--model", str(model), "--gpus", "1024", "--days", "10", "--trials", "20",
                   "--checkpoint-interval", "daly", "--spares", "2", "--seed", "3")
    assert r.code == 0, r.err
    assert "mine: 1,024 GPUs" in r.out and "NIC" in r.out and "ETTR" in r.out


def test_best_and_auto_intervals_and_unwritable_events_dir(tmp_path: Path) -> None:
    r = trainguard("simulate", "--trials", "20", "--days", "5", "--checkpoint-interval", "best", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["policy"]["interval"] == "best"
    assert 5 < doc["policy"]["checkpoint_interval_minutes"] < 80
    auto = json.loads(trainguard("simulate", "--trials", "2", "--days", "5", "--checkpoint-interval", "auto",
                                 "--json").out)
    # auto = Daly, as in the checkpointer (18.6 min at llama3 scale with a 60 s stall)
    assert auto["policy"]["checkpoint_interval_minutes"] == pytest.approx(auto["analytic"]["daly_minutes"], abs=0.1)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_one_line_error(trainguard("simulate", "--trials", "2", "--days", "1", "--events", str(blocker / "run")), 4)


def test_plan_json_and_calibration(tmp_path: Path) -> None:
    run = tmp_path / "simrun"
    assert trainguard("simulate", "--trials", "2", "--days", "3", "--checkpoint-stall", "20",
                      "--events", str(run)).code == 0
    r = trainguard("plan", "--trials", "20", "--days", "5", "--target-ettr", "0.8", "--from-run", str(run), "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["calibration"]["checkpoint_stall_seconds"] == pytest.approx(20)
    iv = doc["interval"]
    assert set(iv) >= {"young_minutes", "daly_minutes", "meta_optimal_minutes", "best_minutes", "candidates"}
    assert iv["best_ettr"] == max(c["ettr_mean"] for c in iv["candidates"])
    assert set(doc["spares"]) >= {"needed", "target_ettr", "ettr_unlimited"}
    assert set(doc["budgets"]) >= {"max_restart_overhead_seconds", "max_checkpoint_stall_seconds"}


def test_simulate_recovery_schemes(tmp_path: Path) -> None:
    base = ("simulate", "--gpus", "131072", "--days", "3", "--trials", "10", "--json")
    plain = json.loads(trainguard(*base).out)
    r = trainguard(*base, "--replica-groups", "8", "--inprocess-share", "0.5", "--inprocess-seconds", "5",
                   "--warm-start-seconds", "20", "--memory-checkpoint", "peer", "--memory-restore-seconds", "2",
                   "--group-reconfigure-seconds", "3")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    pol = doc["policy"]
    assert (pol["replica_groups"], pol["inprocess_share"], pol["inprocess_restart_seconds"]) == (8, 0.5, 5)
    assert (pol["warm_start_seconds"], pol["memory_checkpoint"], pol["memory_restore_seconds"]) == (20, "peer", 2)
    assert pol["group_reconfigure_seconds"] == 3
    assert doc["ettr"]["mean"] > plain["ettr"]["mean"] + 0.3
    assert doc["interruptions"]["mean"] == pytest.approx(plain["interruptions"]["mean"])  # same failures
    refused = trainguard("simulate", "--trials", "2", "--days", "1", "--replica-groups", "4",
                         "--events", str(tmp_path / "run"))
    assert_one_line_error(refused, 2)
    assert "--replica-groups" in refused.err and not (tmp_path / "run").exists()


BAD_SIM = [
    (["--gpus", "0"], 2),
    (["--gpus", "20000000"], 2),
    (["--days", "0"], 2),
    (["--days", "nan"], 2),
    (["--trials", "0"], 2),
    (["--trials", "2000000"], 2),
    (["--checkpoint-stall", "-5"], 2),
    (["--checkpoint-interval", "often"], 2),
    (["--restart-overhead", "10"], 2),
    (["--spares", "-1"], 2),
    (["--gpus", "many"], 2),
    (["--model", "nosuch"], 2),
    (["--seed", "-1"], 2),
    (["--step-seconds", "5e-324"], 2),  # once an OverflowError (exit 70) in the interval arithmetic
    (["--gpus", "10000000", "--days", "3650", "--trials", "1000"], 2),
    (["--inprocess-share", "1.5"], 2),
    (["--inprocess-share", "nan"], 2),
    (["--inprocess-seconds", "-1"], 2),
    (["--warm-start-seconds", "-5"], 2),
    (["--memory-checkpoint", "disk"], 2),
    (["--memory-restore-seconds", "inf"], 2),
    (["--replica-groups", "0"], 2),
    (["--replica-groups", "two"], 2),
    (["--group-reconfigure-seconds", "-1"], 2),
    (["--checkpoint-interval", "sometimes"], 2),
]


@pytest.mark.parametrize(("args", "code"), BAD_SIM)
def test_simulate_absurd_arguments(args: list[str], code: int) -> None:
    assert_one_line_error(trainguard("simulate", "--trials", "3", *args), code)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("[[failure]\n", 3),
        ('[[failure]]\ncategory = "Faulty GPU"\nrate_per_gpu_hour = -1\n', 2),
        ('[[failure]]\ncategory = "Gremlins"\nrate_per_gpu_hour = 1e-6\n', 2),
        ('[[failure]]\ncategory = "NIC"\nrate_per_gpu_hour = 1e-6\nflavour = 1\n', 2),
        ("\x00\xff garbage", 3),
    ],
)
def test_bad_model_files(tmp_path: Path, text: str, code: int) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(text.encode("latin-1"))
    assert_one_line_error(trainguard("simulate", "--trials", "3", "--model", str(path)), code)


def test_plan_bad_input(tmp_path: Path) -> None:
    assert_one_line_error(trainguard("plan", "--target-ettr", "1.5"), 2)
    assert_one_line_error(trainguard("plan", "--from-run", str(tmp_path / "missing")), 3)
    (tmp_path / "empty" / "events").mkdir(parents=True)
    (tmp_path / "empty" / "events" / "a.jsonl").write_text("not json\n")
    assert_one_line_error(trainguard("plan", "--from-run", str(tmp_path / "empty")), 3)


def test_plan_frontier_at_131072_gpus() -> None:
    base = ("plan", "--gpus", "131072", "--target-ettr", "0.9", "--days", "2", "--trials", "5", "--json")
    r = trainguard(*base)
    assert r.code == 0, r.err
    fr = json.loads(r.out)["frontier"]
    assert set(fr) >= {"target_ettr", "reachable", "trials", "inprocess_share", "replica_groups", "stalls_seconds",
                       "restart_range_seconds", "best_ettr", "corner_badput_fraction", "points"}
    # with a 10-minute hang timeout detection alone keeps 131,072 GPUs below 0.9: said, not hidden
    assert fr["reachable"] is False and fr["points"] == []
    assert set(fr["best_ettr"]) == {"restart", "inprocess", "replica-groups"}
    assert set(fr["detection_scale"]) == {"restart", "inprocess", "replica-groups"}
    assert all(f is None or 0 <= f < 1 for f in fr["detection_scale"].values())
    fast = trainguard(*base, "--hang-timeout", "60", "--sdc-check-hours", "0.1", "--frontier-replica-groups", "16")
    assert fast.code == 0, fast.err
    fr = json.loads(fast.out)["frontier"]
    assert fr["reachable"] is True and fr["replica_groups"] == 16
    assert set(fr["detection_scale"]) == set(fr["best_ettr"]) - {p["scheme"] for p in fr["points"]}
    for p in fr["points"]:
        assert set(p) == {"scheme", "checkpoint_stall_seconds", "restart_seconds", "ettr", "interval_minutes"}
        assert p["ettr"] >= 0.9
    text = trainguard(*base[:-1], "--hang-timeout", "60", "--sdc-check-hours", "0.1")
    assert text.code == 0 and "frontier for ETTR 0.900" in text.out and "replica groups" in text.out


@pytest.mark.parametrize("args", [["--frontier-inprocess-share", "0"], ["--frontier-inprocess-share", "nan"],
                                  ["--frontier-replica-groups", "1"], ["--frontier-trials", "0"],
                                  ["--target-ettr", "0"], ["--inprocess-share", "-0.1"]])
def test_plan_bad_frontier_values(args: list[str]) -> None:
    assert_one_line_error(trainguard("plan", "--trials", "2", "--days", "1", *args), 2)


_WITHOUT_NUMPY = r'''
import builtins, sys
real = builtins.__import__
def no_numpy(name, *args, **kwargs):
    if name == "numpy" or name.startswith("numpy."):
        raise ModuleNotFoundError("No module named 'numpy'", name="numpy")
    return real(name, *args, **kwargs)
builtins.__import__ = no_numpy
from trainguard.cli import main
sys.exit(main(sys.argv[1:]))
'''


@pytest.mark.parametrize("verb", ["simulate", "plan"])
def test_without_numpy_the_simulator_says_what_to_install(verb: str) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _WITHOUT_NUMPY, verb, "--trials", "2"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "pip install numpy" in r.stderr and "Traceback" not in r.stderr
