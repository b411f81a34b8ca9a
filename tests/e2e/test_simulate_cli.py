"""`trainguard simulate` and `trainguard plan` from the command line: JSON schemas, run directory, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cli import assert_one_line_error, trainguard

BUCKETS = {"startup", "checkpoint_save", "checkpoint_restore", "lost_progress", "detection", "restart", "other"}


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


def test_auto_interval_and_unwritable_events_dir(tmp_path: Path) -> None:
    r = trainguard("simulate", "--trials", "20", "--days", "5", "--checkpoint-interval", "auto", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["policy"]["interval"] == "auto"
    assert 5 < doc["policy"]["checkpoint_interval_minutes"] < 80
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
