"""Run data stays inert in plots and in the HTML report, in real Chromium.

Plotly draws its strings as a subset of HTML (``<a href>``, ``<b>``, ``<br>``): a host name, failure kind,
checkpoint error or stop reason holding markup must be drawn as the characters it is, never as a link. The
self-contained HTML report must make no request at all when opened from disk, whatever tries to.
"""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Iterator
from html import unescape
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.web.conftest import Server, trainguard, wait_for
from trainguard.core import events as ev
from trainguard.core.rundir import RunDir

LINK = '<a href="http://evil.invalid/">x</a>'
T0 = 1_767_000_000.0


def _steps(attempt: int, first: int, last: int, start: float) -> list[ev.Event]:
    return [ev.StepCompleted(time=start + i + 1, host=host, attempt=attempt, rank=rank, step=step,
                             duration_seconds=1.0)
            for i, step in enumerate(range(first, last + 1)) for rank, host in ((0, "h0"), (1, LINK))]


@pytest.fixture
def markup_run(tmp_path: Path) -> Path:
    """A run whose host, device, failure kind, checkpoint error and stop reason are all a link."""
    rd = RunDir(tmp_path / "runs" / "markup").create()
    with rd.writer("agent-h0") as w:
        w.write_all([
            ev.RunStarted(time=T0, host="h0", run_id="markup", world_size=2, nnodes=2, target_steps=12),
            ev.AttemptStarted(time=T0, host="h0", attempt=0, world_size=2, hosts=("h0", LINK)),
            *_steps(0, 1, 4, T0),
            ev.CheckpointSaveFinished(time=T0 + 4.5, host="h0", attempt=0, rank=0, step=4, blocking_seconds=0.1,
                                      total_seconds=0.2, ok=False, error=LINK),
            ev.FailureDetected(time=T0 + 6, host="h0", attempt=0, kind=LINK, ranks=(1,), hosts=(LINK,),
                               detection_latency_seconds=0.5, step=4),
            ev.AttemptEnded(time=T0 + 6.5, host="h0", attempt=0, reason="failure", exit_code=1),
            ev.AttemptStarted(time=T0 + 8, host="h0", attempt=1, world_size=2, hosts=("h0", LINK), resume_step=2),
            *_steps(1, 3, 8, T0 + 8),
            ev.StragglerDetected(time=T0 + 15, host="h0", attempt=1, rank=1, node=LINK, step=8, onset_step=3,
                                 slowdown=1.5, cost_seconds=2.0, signal="phases"),
            ev.PlannedInterruption(time=T0 + 16, host="h0", attempt=1, reason=LINK),
            ev.AttemptEnded(time=T0 + 16.5, host="h0", attempt=1, reason="planned", exit_code=0),
            ev.RunEnded(time=T0 + 17, host="h0", run_id="markup", status="completed", completed_steps=8),
        ])
    with rd.writer(f"telemetry-{'x'}") as w:
        w.write_all([ev.TelemetrySample(time=T0 + s, host=LINK, source="gpu", device=LINK, temperature_c=60.0 + s,
                                        clock_mhz=1900.0, power_watts=500.0) for s in range(0, 17, 2)])
    return rd.root


PLOT_LINKS = """link => {
  const plots = [...document.querySelectorAll('.js-plotly-plot')];
  return {
    plots: plots.length,
    svgLinks: plots.reduce((n, gd) => n + gd.querySelectorAll('svg a').length, 0),
    evilLinks: document.querySelectorAll('a[href*="evil"]').length,
    literal: plots.some(gd => [...gd.querySelectorAll('svg')].some(s => s.textContent.includes(link))),
  };
}"""

HOVER_ALL = """() => {
  const out = [];
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    gd.data.forEach((trace, i) => {
      const n = (trace.x || []).length;
      if (!n || trace.visible === false) return;
      // A heat map's point is [row, column].
      const subplot = (trace.xaxis || 'x') + (trace.yaxis || 'y');  // telemetry panels are on y2 and y3
      Plotly.Fx.hover(gd, [{curveNumber: i, pointNumber: trace.type === 'heatmap' ? [0, 0] : 0}], subplot);
      const layer = gd.querySelector('.hoverlayer');
      out.push({plot: gd.id, trace: trace.name, links: layer ? layer.querySelectorAll('a').length : 0,
                text: layer ? layer.textContent : ''});
      Plotly.Fx.unhover(gd);
    });
  }
  return out;
}"""


def _check_plots(page: Any) -> None:
    found = page.evaluate(PLOT_LINKS, LINK)
    assert found["plots"] >= 4, found  # timeline, throughput, waterfall, stragglers, telemetry
    assert found["svgLinks"] == 0 and found["evilLinks"] == 0, found
    assert found["literal"], found  # the legend shows the host/device name as text
    hovers = page.evaluate(HOVER_ALL)
    assert hovers and all(h["links"] == 0 for h in hovers), hovers
    texts = " ".join(h["text"] for h in hovers)
    assert LINK in texts, hovers  # a failure kind, an error or a stop reason in a hover label, drawn as text


def test_markup_in_run_data_is_drawn_as_text_on_the_dashboard(page: Any, markup_run: Path, tmp_path: Path,
                                                             artifacts: Path) -> None:
    server = Server(str(markup_run.parent), log=tmp_path / "serve.log")
    try:
        server.open(page, "/runs/markup")
        wait_for(page, "window.tgReady === true")
        assert page.locator("#telemetry-section").is_visible() and page.locator("#stragglers-section").is_visible()
        page.screenshot(path=str(artifacts / "markup-run.png"), full_page=True)
        _check_plots(page)
    finally:
        server.stop()


class _Counter(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on loopback that records every request it gets (none should come)."""
    hits: list[str] = []
    handler = type("Handler", (_Counter,), {"hits": hits})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", hits
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_html_report_opened_from_disk_makes_no_request(browser: Any, markup_run: Path, tmp_path: Path,
                                                          listener: tuple[str, list[str]], artifacts: Path) -> None:
    out = tmp_path / "report.html"
    res = trainguard("report", str(markup_run), "--html", str(out))
    assert res.returncode == 0, res.stderr
    base, hits = listener
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    requests: list[str] = []
    routed: list[str] = []
    failed: list[tuple[str, str | None]] = []
    errors: list[str] = []
    context.route("**/*", lambda route: (routed.append(route.request.url), route.continue_()))
    page = context.new_page()
    page.on("request", lambda r: requests.append(r.url))
    page.on("requestfailed", lambda r: failed.append((r.url, r.failure)))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(out.as_uri())
        wait_for(page, "window.tgReady === true")
        page.screenshot(path=str(artifacts / "markup-report-from-disk.png"))
        assert not errors, errors  # everything the page itself needs is allowed by its policy
        # Whatever tries to reach out (a script, an image, a style sheet, a frame, a beacon) is stopped.
        page.evaluate("""base => {
            fetch(base + '/fetch').catch(() => {});
            new Image().src = base + '/img';
            const link = document.createElement('link'); link.rel = 'stylesheet'; link.href = base + '/css';
            document.head.appendChild(link);
            const style = document.createElement('style');
            style.textContent = 'body { background: url(' + base + '/bg.png) }';
            document.head.appendChild(style);
            const frame = document.createElement('iframe'); frame.src = base + '/frame';
            document.body.appendChild(frame);
            navigator.sendBeacon(base + '/beacon', 'x');
        }""", base)
        page.wait_for_timeout(1500)

        def outside(urls: list[str]) -> list[str]:
            return [u for u in urls if u != out.as_uri() and not u.startswith(("data:", "blob:"))]

        assert hits == [], hits
        assert outside(routed) == [], routed  # nothing got as far as the network layer
        # Chromium names each attempt and says the policy stopped it (not an error or a missing server).
        attempts = outside(requests)
        assert attempts and all((u, "csp") in failed for u in attempts), (attempts, failed)
        assert any("Content Security Policy" in e for e in errors), errors
        _check_plots(page)  # and the plots are drawn, with the run's markup as text
    finally:
        context.close()


def test_the_html_report_carries_a_strict_policy_and_no_external_url(markup_run: Path, tmp_path: Path) -> None:
    from trainguard.report.html import render_html

    html = render_html(markup_run)
    head = html[: html.index("</head>")]
    assert '<meta http-equiv="Content-Security-Policy"' in head
    policy = unescape(head.split('<meta http-equiv="Content-Security-Policy" content="', 1)[1].split('"', 1)[0])
    assert policy.startswith("default-src 'none'")
    assert "'unsafe-eval'" not in policy and "http" not in policy
    assert "script-src 'sha256-" in policy and "'unsafe-inline'" not in policy.split("script-src", 1)[1].split(";")[0]
    for style in re.findall(r"<style>(.*?)</style>", html, re.S):
        assert not [u for u in re.findall(r"url\(\s*['\"]?([^'\")]+)", style) if not u.startswith(("data:", "#"))]
