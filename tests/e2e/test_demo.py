"""`trainguard demo` trains through its default crash and hang and ends where a fault-free run ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e._run_helpers import TINY_DEMO, events, of_type, trainguard


def _demo(run_dir: Path, *extra: str) -> tuple[dict, str]:
    res = trainguard("demo", "--ranks", "2", "--steps", "16", "--ckpt-every", "3", "--seed", "7",
                     "--model", TINY_DEMO, "--hang-floor", "3", "--run-dir", str(run_dir), "--json", *extra,
                     timeout=170)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout), res.stderr


@pytest.mark.slow
def test_demo_recovers_from_crash_and_hang_with_the_fault_free_loss(tmp_path: Path) -> None:
    faulty, console = _demo(tmp_path / "faulty")
    # The console says what happened: one line per detection, diagnosis and restart, then a summary;
    # rank 0's own progress lines come through with its prefix.
    lines = console.splitlines()
    for word, count in ((" detected in attempt ", 2), ("diagnosis of attempt", 2), ("restart: attempt", 2),
                        ("summary: completed", 1)):
        assert sum(line.startswith("demo: ") and word in line for line in lines) == count, (word, console)
    assert any(line.startswith("[rank0]: train_gpt: step 10/16") for line in lines), console
    assert faulty["unfired_faults"] == []
    assert faulty["status"] == "completed"
    assert faulty["completed_steps"] == faulty["target_steps"] == 16
    assert [(i["kind"], i["culprit_ranks"]) for i in faulty["interruptions"]] == [("crash", [1]), ("hang", [0])]
    assert faulty["interruptions"][1]["detection_latency_seconds"] < 3 + 5
    assert 0 < faulty["ettr"] < 1
    # Steps re-executed after the restarts really ran again (nothing skipped, nothing applied twice).
    records = events(tmp_path / "faulty", "rank-0")
    assert len({s["attempt"] for s in of_type(records, "step_completed")}) == 3

    clean, _ = _demo(tmp_path / "clean", "--inject", "none")
    assert clean["interruptions"] == [] and clean["completed_steps"] == 16
    assert faulty["final_loss"] is not None and clean["final_loss"] is not None
    assert abs(faulty["final_loss"] - clean["final_loss"]) <= 1e-6
    # The loss really moved (training happened), so the equality above is not a constant's.
    first = [s for s in of_type(events(tmp_path / "clean", "rank-0"), "step_completed") if s["step"] == 1]
    assert first[0]["loss"] - clean["final_loss"] > 0.1
