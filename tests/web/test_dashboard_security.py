"""Who may see the dashboard: loopback by default, a token on every address (generated when none is given),
401 without it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.web.conftest import Server, get, trainguard, wait_for
from trainguard.core.rundir import RunDir
from trainguard.samples import SAMPLE_RUN

TOKEN = "test-token-0123456789abcdef"


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("token-runs")
    shutil.copytree(SAMPLE_RUN, root / "sample-run")
    s = Server(str(root), env={"TRAINGUARD_TOKEN": TOKEN}, log=root.parent / "token-serve.log")
    yield s
    s.stop()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "dashboard.example"])
def test_non_loopback_bind_without_a_token_is_refused(host: str) -> None:
    res = trainguard("serve", str(SAMPLE_RUN), "--host", host, env={"TRAINGUARD_TOKEN": ""}, timeout=60)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "token" in lines[0] and host in lines[0], res.stderr


def test_a_short_token_is_refused() -> None:
    res = trainguard("serve", str(SAMPLE_RUN), "--host", "0.0.0.0", "--token", "short", timeout=60)
    assert res.returncode == 2 and "at least 16 characters" in res.stderr


def test_missing_run_directory_is_an_input_error(tmp_path: Path) -> None:
    res = trainguard("serve", str(tmp_path / "nope"), timeout=60)
    assert res.returncode == 3 and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_requests_without_the_token_get_401(token_server: Server) -> None:
    for path in ("/", "/api/runs", "/api/runs/sample-run", "/runs/sample-run", "/static/trainguard.js"):
        status, headers, _ = get(token_server.url + path)
        assert status == 401, path
        assert headers["www-authenticate"].startswith("Bearer")
    assert get(token_server.url + "/api/runs", {"Authorization": "Bearer wrong-token-0123456789"})[0] == 401
    assert get(token_server.url + "/api/runs?token=wrong-token-0123456789")[0] == 401
    status, _, body = get(token_server.url + "/api/runs/sample-run", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and json.loads(body)["run_id"] == "sample-run"


def test_a_browser_opens_it_once_with_the_token_then_by_cookie(page: Any, token_server: Server,
                                                                artifacts: Path) -> None:
    page.goto(f"{token_server.url}/runs/sample-run?token={TOKEN}")
    wait_for(page, "window.tgReady === true", timeout=30)
    assert "token" not in page.url  # traded for a cookie: not left in the address bar or history
    page.screenshot(path=str(artifacts / "token-run-page.png"))
    port = token_server.url.rsplit(":", 1)[1]
    # Named after the port: browsers share cookies between the ports of a host, and two dashboards must not
    # overwrite each other's.
    cookie = next(c for c in page.context.cookies() if c["name"] == f"trainguard_token_{port}")
    assert cookie["httpOnly"] and TOKEN not in cookie["value"]
    page.goto(token_server.url + "/")  # no token in the URL now
    wait_for(page, "window.tgReady === true", timeout=30)
    assert page.locator("#runs tr[data-run='sample-run']").count() == 1


@pytest.fixture(scope="module")
def private_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with a 0640 rank log, as trainguard writes them: the job's user and group read it, nobody else."""
    rd = RunDir(tmp_path_factory.mktemp("private-runs") / "private").create()
    shutil.copytree(SAMPLE_RUN / "events", rd.root / "events", dirs_exist_ok=True)
    log = rd.root / "logs" / "attempt-0" / "rank-0.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("secret rank output\n")
    log.chmod(0o640)
    return rd.root


@pytest.fixture(scope="module")
def loopback_server(private_run: Path) -> Any:
    s = Server(str(private_run.parent), log=private_run.parent / "serve.log")
    yield s
    s.stop()


def test_a_loopback_dashboard_without_a_token_generates_one_and_requires_it(loopback_server: Server) -> None:
    """127.0.0.1 is reachable by every local user: without --token the dashboard makes one up and asks for it."""
    lines = loopback_server.log.read_text().strip().splitlines()
    assert len(loopback_server.token) >= 32, lines
    assert sum(loopback_server.token in line for line in lines) == 1, lines  # printed once, in the address
    assert f"{loopback_server.url}/?token={loopback_server.token}" in lines[0]
    for path in ("/", "/api/runs", "/api/runs/private", "/runs/private/files/logs/attempt-0/rank-0.log"):
        status, _, body = get(loopback_server.url + path)
        assert status == 401, path
        assert b"secret rank output" not in body
    status, _, body = loopback_server.get("/runs/private/files/logs/attempt-0/rank-0.log")
    assert status == 200 and body == b"secret rank output\n"


def test_each_start_without_a_token_gets_a_new_one(loopback_server: Server, private_run: Path,
                                                    tmp_path: Path) -> None:
    other = Server(str(private_run.parent), log=tmp_path / "serve-2.log")
    try:
        assert other.token and other.token != loopback_server.token
        assert get(other.url + "/api/runs", {"Authorization": f"Bearer {loopback_server.token}"})[0] == 401
    finally:
        other.stop()


def test_another_local_user_cannot_read_a_rank_log_through_the_dashboard(loopback_server: Server,
                                                                        private_run: Path) -> None:
    """A real second uid (65534) on the same machine: the log is not readable to it directly, and the dashboard
    (running as the log's owner) must not read it on its behalf; the token is not in the process list either."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another user (uid 65534)")
    log = private_run / "logs" / "attempt-0" / "rank-0.log"
    script = (
        "import sys, urllib.request, urllib.error\n"
        "log, url, pid = sys.argv[1:4]\n"
        "try:\n    open(log).read(); print('direct: read')\n"
        "except OSError: print('direct: refused')\n"
        "try:\n    body = urllib.request.urlopen(url, timeout=30).read(); print('dashboard:', body.decode())\n"
        "except urllib.error.HTTPError as exc: print('dashboard:', exc.code)\n"
        "print('cmdline:', open(f'/proc/{pid}/cmdline').read().replace(chr(0), ' '))\n"
    )
    res = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script,
                          str(log), f"{loopback_server.url}/runs/private/files/logs/attempt-0/rank-0.log",
                          str(loopback_server.proc.pid)], capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    assert out[0] == "direct: refused" and out[1] == "dashboard: 401", res.stdout
    assert "serve" in out[2] and loopback_server.token not in out[2]
