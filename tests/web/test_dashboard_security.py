"""Who may see the dashboard: loopback by default, a token for anything else, 401 without it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.web.conftest import Server, trainguard, wait_for
from tests.web.test_dashboard import get
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
    cookie = next(c for c in page.context.cookies() if c["name"] == "trainguard_token")
    assert cookie["httpOnly"] and TOKEN not in cookie["value"]
    page.goto(token_server.url + "/")  # no token in the URL now
    wait_for(page, "window.tgReady === true", timeout=30)
    assert page.locator("#runs tr[data-run='sample-run']").count() == 1
