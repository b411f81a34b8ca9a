"""The data behind the run page and the HTML report (trainguard.report.view): complete for small runs, bounded
for a simulated 54-day run, and consistent with the goodput report."""

from __future__ import annotations

from pathlib import Path

from trainguard.accounting.goodput import compute_goodput
from trainguard.report import view as v
from trainguard.samples import SAMPLE_RUN
from trainguard.sim.events_out import write_trial
from trainguard.sim.models import load_model
from trainguard.sim.policy import JobConfig, PolicyConfig


def test_sample_run_view_matches_its_report() -> None:
    report = compute_goodput(SAMPLE_RUN)
    view = v.build_view(SAMPLE_RUN, report)
    assert view["report"] == report.to_json()
    assert view["run"]["start_epoch"] == 1_767_000_000.0
    assert view["run"]["simulated"] is False  # generated, but not by the simulator: no simulation page
    progress = view["timeline"]["progress"]
    steps = [s for s in progress["step"] if s is not None]
    assert max(steps) == report.completed_steps == 600
    assert progress["step"].count(None) == report.attempts  # one break after each attempt's line
    m = view["timeline"]["markers"]
    assert m["failures"]["count"] == 2 and m["restarts"]["count"] == 3 and m["planned"]["count"] == 1
    assert m["restarts"]["step"] == [100, 250, 450]  # restarts resume at the restored step
    assert m["checkpoints"]["count"] == 12  # one per save, not one per rank
    assert m["restores"]["count"] == 3
    assert [d["attempt"] for d in view["interruption_details"]] == [i.attempt for i in report.interruptions]
    assert view["interruption_details"][0]["explanation"].startswith("uncorrectable ECC error")
    assert view["stragglers"] is None and view["telemetry"] is None
    assert set(view["bucket_order"]) == set(report.badput_seconds)


def test_a_54_day_simulated_run_stays_small(tmp_path: Path) -> None:
    run = write_trial(tmp_path / "sim", load_model("llama3"), JobConfig(gpus=16384, days=54.0), PolicyConfig(),
                      seed=1).path
    report = compute_goodput(run)
    view = v.build_view(run, report)
    assert view["run"]["simulated"] is True
    progress = view["timeline"]["progress"]
    assert len(progress["t"]) <= v.MAX_PROGRESS_POINTS + report.attempts
    # Thinning keeps each attempt's first and last point: the line still reaches the last kept step.
    assert max(s for s in progress["step"] if s is not None) >= report.completed_steps
    failures = view["timeline"]["markers"]["failures"]
    assert failures["count"] == len([i for i in report.interruptions if not i.planned]) == len(failures["t"])
    assert len(view["timeline"]["markers"]["checkpoints"]["t"]) <= v.MAX_MARKERS


def test_thinning_keeps_ends_and_bounds() -> None:
    assert v._thin(5, 10) == [0, 1, 2, 3, 4]
    kept = v._thin(10_000, 100)
    assert kept[0] == 0 and kept[-1] == 9_999 and len(kept) <= 100


def test_evidence_outside_the_evidence_folders_is_text(tmp_path: Path) -> None:
    (tmp_path / "diagnostics" / "attempt-0").mkdir(parents=True)
    (tmp_path / "diagnostics" / "attempt-0" / "stacks.txt").write_text("x")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "m.json").write_text("{}")
    assert v.evidence_link(tmp_path, "diagnostics/attempt-0/stacks.txt")["kind"] == "file"
    assert v.evidence_link(tmp_path, "diagnostics/attempt-0/")["kind"] == "dir"
    for item in ("checkpoints/m.json", "diagnostics/../checkpoints/m.json", "/etc/passwd", "diagnostics/none.txt"):
        assert v.evidence_link(tmp_path, item) == {"text": item, "path": None, "kind": "text"}, item


def test_memory_tier_records_give_their_own_markers_and_the_restored_step(tmp_path: Path) -> None:
    from tests.unit.streams import memory_tier_restore
    from trainguard.core.rundir import RunDir

    run = RunDir(tmp_path / "run").create()
    for name, records in memory_tier_restore().writers.items():
        with run.writer(name) as w:
            w.write_all(records)
    view = v.build_view(run.root, compute_goodput(run))
    m = view["timeline"]["markers"]
    # step 4 saved to storage and copied to memory: two markers; step 6 copied only
    assert sorted(m["checkpoints"]["label"]) == ["copied step 4 to memory (stall 0.5 s)",
                                                 "copied step 6 to memory (stall 0.5 s)", "saved step 4 (stall 0.5 s)"]
    # the agent named storage's step 4; the attempt restored step 6 from memory
    assert m["restarts"]["step"] == [6] and m["restarts"]["label"] == ["attempt 1 from step 6"]
    assert m["restores"]["label"] == ["restored step 6 from memory in 0.5 s"]
