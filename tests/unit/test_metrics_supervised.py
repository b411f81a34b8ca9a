"""``trainguard run --metrics-port``: a real supervised job (2 gloo ranks, a crash, a restart) scraped while it runs."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "16", "--batch", "4", "--vocab", "64"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.mark.slow
def test_metrics_of_a_running_job(tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "run.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainguard", "run", "--nproc-per-node", "2", "--metrics-port", str(port),
         "--run-dir", str(tmp_path / "run"), "--no-health-checks", "--inject", "crash@step=30,rank=1", "-q",
         str(ROOT / "src" / "trainguard" / "examples" / "train_gpt.py"), "--steps", "300", "--ckpt-every", "10", *TINY],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    seen: list[dict] = []
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            s = scrape(port)
            if s:  # None: not listening yet; {}: listening, not yet following the run (MetricsServer.follow)
                seen.append(s)
            time.sleep(0.2)
        assert proc.wait(60) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    assert seen, "the metrics endpoint never answered while the job ran"
    last = seen[-1]
    running = [s for s in seen if s.get(("trainguard_steps_per_second", ()), 0) > 0]
    assert running, "no scrape saw the job making progress"
    assert max(s[("trainguard_step", ())] for s in seen) > 30
    assert last[("trainguard_restarts_total", ())] == 1
    assert last[("trainguard_failures_detected_total", (("kind", "crash"),))] == 1
    assert sum(v for (name, _), v in last.items() if name == "trainguard_interruptions_total") == 1
    assert ("trainguard_last_checkpoint_age_seconds", ()) in last
    assert 0 < last[("trainguard_ettr_ratio", ())] < 1
