"""A real run's ``trainguard report`` carries the thermal and power sections (terminal, --json, --html)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.e2e._run_helpers import ROOT, events, of_type, trainguard

PLAIN_DDP = ROOT / "tests" / "e2e" / "unmodified" / "plain_ddp.py"


@pytest.mark.slow
def test_a_real_runs_report_has_the_thermal_and_power_sections(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    res = trainguard("run", "--standalone", "--nproc-per-node", "2", "--run-dir", str(run_dir), "--quiet",
                     "--no-health-checks", "--telemetry-seconds", "1", "--straggler-probe-seconds", "0",
                     str(PLAIN_DDP), "--steps", "30", "--ckpt-dir", str(tmp_path / "ck"), "--step-seconds", "0.05",
                     timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    samples = of_type(events(run_dir, "telemetry-"), "telemetry_sample")

    out = trainguard("report", str(run_dir), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    thermal, power = doc["thermal"], doc["power"]
    assert thermal["samples"] == len(samples)  # this machine may expose no sensors: then 0, and said so
    assert thermal["slow_hosts"] == [] and isinstance(thermal["bins"], list)
    # No GPU here: the simulator's model is sized by the world size, one GPU per rank.
    assert power["model"]["gpus"] == 2 and power["model"]["basis"] == "world size (one GPU per rank)"
    assert power["model"]["swings_watts"]["failure_or_stop"] == pytest.approx(2 * (700 - 90))

    text = trainguard("report", str(run_dir))
    assert text.returncode == 0, text.stderr
    # A CPU-only job has no power readings: the terminal leaves the section out rather than print a model of
    # GPUs the job never had as if it were a finding (the JSON keeps the model, labelled as one).
    assert "power (" not in text.stdout and "simulator model for" not in text.stdout
    if samples:
        assert "thermal (" in text.stdout

    if importlib.util.find_spec("jinja2") and importlib.util.find_spec("plotly"):
        page = tmp_path / "r.html"
        html = trainguard("report", str(run_dir), "--html", str(page))
        assert html.returncode == 0, html.stderr
        body = page.read_text()
        # The section holds what the terminal shows: thermal lines when this machine has sensors; nothing
        # (no section) on a CPU-only machine without them.
        expected = 1 if "thermal (" in text.stdout else 0
        assert body.count('<section id="thermal-power-section">') == expected
        if expected:
            assert body.index("thermal-power-section") < body.rindex("</main>")
