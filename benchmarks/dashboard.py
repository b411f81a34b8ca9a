"""Benchmark of the dashboard: the run page of a simulated 54-day, ~419-interruption Llama 3 run in Chromium.

Anchor (issue 15): the page loads in under 2 s. Load time is measured in the page (``performance.now()``
when the last plot is drawn, from navigation start: HTML, plotly.js, data, every chart and table), in
headless Chromium (Debian's package, through Playwright):

- ``cold``: a fresh server (the report and view are computed on the request) and a fresh browser profile;
- ``warm_server``: the server has the run cached, the browser profile is fresh (plotly.js fetched again);
- ``warm``: a reload in the same profile (plotly.js from the browser cache).

Also the same run as ``report --html`` (written, and opened from disk). Each figure is the best of three
(the machine is shared), all repeats listed. Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trainguard.core.events import FailureDetected
from trainguard.core.rundir import RunDir
from trainguard.sim.events_out import write_trial
from trainguard.sim.models import load_model
from trainguard.sim.policy import JobConfig, PolicyConfig

TARGET = 419
"""Unexpected interruptions of Llama 3 405B in 54 days (the run is the seed whose trial comes closest)."""
REPEATS = 3
TOKEN = "benchmark-token-0123456789"
"""The dashboard needs a token on loopback too; the benchmark sets its own."""


def make_run(root: Path) -> tuple[Path, int, int]:
    """The simulated run among seeds 0-9 with the unexpected-interruption count nearest `TARGET`."""
    model, job, policy = load_model("llama3"), JobConfig(gpus=16384, days=54.0), PolicyConfig()
    best: tuple[int, int, Path] | None = None
    for seed in range(10):
        path = root / f"seed-{seed}"
        write_trial(path, model, job, policy, seed=seed)
        failures = sum(isinstance(e.record, FailureDetected) for e in RunDir(path).load())
        if best is None or abs(failures - TARGET) < abs(best[1] - TARGET):
            best = (seed, failures, path)
    assert best is not None
    run = root / "llama3-54d"
    shutil.move(best[2], run)
    return run, best[0], best[1]


class Server:
    def __init__(self, runs: Path, log: Path) -> None:
        self.fh = log.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "trainguard", "serve", str(runs), "--port", "0"],
                                     stdout=self.fh, stderr=subprocess.STDOUT,
                                     env={**os.environ, "TRAINGUARD_TOKEN": TOKEN})
        deadline = time.monotonic() + 60
        while "http://" not in log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not start: {log.read_text()}")
            time.sleep(0.05)
        self.url = "http://" + log.read_text().split("http://", 1)[1].split()[0].rstrip("/")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.fh.close()


def load_ms(page: Any, url: str, *, reload: bool = False) -> float:
    if reload:
        page.reload()
    else:
        page.goto(url)
    deadline = time.monotonic() + 60
    while not page.evaluate("window.tgReady === true"):
        if time.monotonic() > deadline:
            raise SystemExit(f"{url}: the page never finished drawing")
        time.sleep(0.01)
    return float(page.evaluate("window.tgReadyMs"))


def main() -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("Debian's chromium is needed: run scripts/setup")
    tmp = Path(tempfile.mkdtemp(prefix="tg-dashboard-bench-"))
    try:
        t0 = time.perf_counter()
        runs = tmp / "runs"
        run, seed, failures = make_run(runs)
        records = len(RunDir(run).load())
        times: dict[str, list[float]] = {"cold": [], "warm_server": [], "warm": [], "html_report_open": []}
        html_write: list[float] = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            for i in range(REPEATS):
                server = Server(runs, tmp / f"serve-{i}.log")
                try:
                    url = f"{server.url}/runs/{run.name}"
                    for key in ("cold", "warm_server"):
                        # The token as a header (as a script sends it): no ?token= redirect inside the timing.
                        ctx = browser.new_context(viewport={"width": 1400, "height": 1000},
                                                  extra_http_headers={"Authorization": f"Bearer {TOKEN}"})
                        page = ctx.new_page()
                        times[key].append(load_ms(page, url))
                        if key == "warm_server":
                            times["warm"].append(load_ms(page, url, reload=True))
                        ctx.close()
                    rows = None
                finally:
                    server.stop()
                out = tmp / f"report-{i}.html"
                started = time.perf_counter()
                subprocess.run([sys.executable, "-m", "trainguard", "report", str(run), "--html", str(out), "--json"],
                               check=True, capture_output=True)
                html_write.append(time.perf_counter() - started)
                ctx = browser.new_context(offline=True)
                page = ctx.new_page()
                times["html_report_open"].append(load_ms(page, out.as_uri()))
                rows = page.locator("#interruptions tbody tr").count()
                ctx.close()
            browser.close()
        doc: dict[str, Any] = {
            "run": {"model": "llama3", "gpus": 16384, "days": 54, "seed": seed, "unexpected_interruptions": failures,
                    "interruption_rows_shown": rows, "records": records,
                    "events_bytes": sum(f.stat().st_size for f in (run / "events").iterdir())},
            "page_load_seconds": {k: round(min(v) / 1000, 3) for k, v in times.items()},
            "page_load_seconds_all_repeats": {k: [round(x / 1000, 3) for x in v] for k, v in times.items()},
            "anchor_seconds": 2.0,
            "under_anchor": all(min(v) / 1000 < 2.0 for k, v in times.items() if k != "html_report_open"),
            "html_report_write_seconds": round(min(html_write), 3),
            "html_report_bytes": (tmp / "report-0.html").stat().st_size,
            "cpus": os.cpu_count(),
            "benchmark_seconds": round(time.perf_counter() - t0, 1),
        }
        print(json.dumps(doc, indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
