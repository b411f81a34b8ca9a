"""Fixtures of the browser tests: real runs (sample, simulated, demo), a dashboard server, headless Chromium.

Chromium is Debian's package (scripts/setup installs it), driven by Playwright with ``executable_path``;
Playwright's own browser download is never used. Screenshots go to one folder, printed at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from trainguard.samples import SAMPLE_RUN

ROOT = Path(__file__).resolve().parents[2]
TINY_DEMO = "d_model=32,layers=1,heads=2,seq=16,batch=4,vocab=64"
_ARTIFACTS: list[Path] = []


def trainguard(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh interpreter, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, check=False, cwd=ROOT)


def wait_for(page: Any, expression: str, timeout: float = 30.0) -> None:
    """Poll a JavaScript expression until it is true. (Playwright's wait_for_function polls with eval() in the
    page, which the dashboard's Content-Security-Policy forbids; page.evaluate goes through the debugger.)"""
    deadline = time.monotonic() + timeout
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout} s: {expression}")
        time.sleep(0.05)


def get(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request, with exactly the headers given (no token unless given)."""
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


class Server:
    """``trainguard serve`` in a subprocess; ``url`` (scheme, host and port) once it listens, and ``token``: the
    one it printed in its address (generated, as without --token), else the one it was given."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, log: Path) -> None:
        self.log = log
        self._fh = log.open("wb")
        full_env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_TOKEN"} | (env or {})
        self.proc = subprocess.Popen([sys.executable, "-m", "trainguard", "serve", "--port", "0", *args],
                                     stdout=self._fh, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            if "http://" in text:
                address = urlsplit("http://" + text.split("http://", 1)[1].split()[0])
                self.url = f"{address.scheme}://{address.netloc}"
                printed = parse_qs(address.query).get("token", [""])[0]
                self.token = printed or full_env.get("TRAINGUARD_TOKEN", "")
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {text}")
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"serve did not start: {log.read_text(errors='replace')}")

    def get(self, path: str, headers: dict[str, str] | None = None,
            method: str = "GET") -> tuple[int, dict[str, str], bytes]:
        """A request to ``path`` with the token (as a script sends it: a bearer header)."""
        return get(self.url + path, {"Authorization": f"Bearer {self.token}", **(headers or {})}, method)

    def open(self, page: Any, path: str) -> None:
        """Open ``path`` in the browser as its owner does: with ``?token=`` (the dashboard trades it for a cookie)."""
        page.goto(f"{self.url}{path}{'&' if '?' in path else '?'}token={self.token}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._fh.close()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder of the screenshots ($TRAINGUARD_WEB_ARTIFACTS, else one under pytest's temporary folder)."""
    chosen = os.environ.get("TRAINGUARD_WEB_ARTIFACTS")
    path = Path(chosen) if chosen else tmp_path_factory.getbasetemp() / "web-artifacts"
    path.mkdir(parents=True, exist_ok=True)
    _ARTIFACTS.append(path)
    print(f"\nweb test screenshots: {path}")
    return path


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for path in _ARTIFACTS:
        terminalreporter.write_line(f"web test screenshots: {path}")


@pytest.fixture(scope="session")
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Debian's chromium is not installed: run scripts/setup (it installs it with apt-get)")
    return path


@pytest.fixture(scope="session")
def browser(chromium: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page; JavaScript errors and CSP violations fail the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    pg.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    pg.errors = errors
    yield pg
    context.close()
    assert not errors, errors


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with three real runs: the bundled sample, a simulated 54-day Llama 3 run, a demo run."""
    root = tmp_path_factory.mktemp("runs")
    shutil.copytree(SAMPLE_RUN, root / "sample-run")
    sim = trainguard("simulate", "--trials", "2", "--seed", "0", "--events", str(root / "sim54"), "--json")
    assert sim.returncode == 0, sim.stderr
    demo = trainguard("demo", "--ranks", "2", "--steps", "20", "--ckpt-every", "5", "--seed", "7",
                      "--model", TINY_DEMO, "--hang-floor", "3", "--run-dir", str(root / "demo"), "--json", "-q")
    assert demo.returncode == 0, demo.stderr[-3000:]
    return root


@pytest.fixture(scope="session")
def server(runs_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    s = Server(str(runs_root), "--poll", "0.5", log=log)
    yield s
    s.stop()
