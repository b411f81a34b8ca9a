"""The start-up half of automatic instrumentation: the sitecustomize folder and the post-import finder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from trainguard.worker import bootstrap

PROBE = r'''
import json, sys, os
print(json.dumps({
    "bootstrap": "_trainguard_bootstrap" in sys.modules,
    "trainguard": any(m == "trainguard" or m.startswith("trainguard.") for m in sys.modules),
    "finder": any(getattr(f, "_trainguard_post_import", False) for f in sys.meta_path),
    "owner": os.environ.get("TRAINGUARD_AUTO_OWNER_PID"),
    "user_site": getattr(sys.modules.get("sitecustomize"), "USER_MARK", None),
    "pid": os.getpid(),
}))
'''


def _probe(env_extra: dict[str, str], extra_path: list[Path] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(bootstrap.site_dir()), *map(str, extra_path)])
    res = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60, check=True)
    assert res.stderr == "", res.stderr
    return dict(json.loads(res.stdout))


def test_site_dir_holds_the_sitecustomize() -> None:
    assert (bootstrap.site_dir() / "sitecustomize.py").is_file()


def test_start_up_installs_the_finder_without_importing_trainguard(tmp_path: Path) -> None:
    user = tmp_path / "usersite"
    user.mkdir()
    (user / "sitecustomize.py").write_text("USER_MARK = 'ran'\n")
    on = _probe({"TRAINGUARD_AUTO": "1", "TRAINGUARD_AGENT_PID": "1"}, [user])
    assert on["bootstrap"] and on["finder"] and not on["trainguard"]
    assert on["owner"] == str(on["pid"]) and on["user_site"] == "ran"  # the shadowed sitecustomize still ran
    off = _probe({"TRAINGUARD_AUTO": "0", "TRAINGUARD_AGENT_PID": "1"}, [user])
    assert not off["bootstrap"] and not off["finder"] and off["user_site"] == "ran"
    assert not _probe({"TRAINGUARD_AUTO": "1"})["finder"]  # no agent, nothing to report to
    # A process started by an instrumented rank (data loader worker, compile worker) inherits the
    # environment but is not a rank: it stays untouched.
    child = _probe({"TRAINGUARD_AUTO": "1", "TRAINGUARD_AGENT_PID": "1", "TRAINGUARD_AUTO_OWNER_PID": "999999999"})
    assert not child["finder"]


def test_enabled_reads_the_flag_the_agent_pid_and_the_owner() -> None:
    me = str(os.getpid())
    assert bootstrap.enabled({"TRAINGUARD_AUTO": "1", "TRAINGUARD_AGENT_PID": "7"})
    assert bootstrap.enabled({"TRAINGUARD_AUTO": "1", "TRAINGUARD_AGENT_PID": "7", bootstrap.OWNER_ENV: me})
    assert not bootstrap.enabled({"TRAINGUARD_AUTO": "1", "TRAINGUARD_AGENT_PID": "7", bootstrap.OWNER_ENV: "1"})
    assert not bootstrap.enabled({"TRAINGUARD_AUTO": "0", "TRAINGUARD_AGENT_PID": "7"})
    assert not bootstrap.enabled({"TRAINGUARD_AUTO": "1", "TRAINGUARD_AGENT_PID": "x"})


@pytest.fixture
def fake_package(tmp_path: Path) -> Any:
    pkg = tmp_path / "tgfakepkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("VALUE = 41\nVALUE += 1\n")
    (pkg / "other.py").write_text("X = 1\n")
    sys.path.insert(0, str(tmp_path))
    yield pkg
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("tgfakepkg")]:
        del sys.modules[name]


def test_the_finder_calls_the_hook_after_the_module_ran_and_leaves_no_trace(fake_package: Path) -> None:
    seen: list[tuple[str, int]] = []

    def hook(name: str, module: ModuleType) -> None:
        seen.append((name, module.VALUE))

    finder = bootstrap.PostImportFinder(("tgfakepkg.sub",), hook)
    sys.meta_path.insert(0, finder)
    try:
        import tgfakepkg.other
        import tgfakepkg.sub

        assert seen == [("tgfakepkg.sub", 42)] and tgfakepkg.other.X == 1
        mod = sys.modules["tgfakepkg.sub"]
        assert type(mod.__loader__).__name__ == "SourceFileLoader" and mod.__spec__.loader is mod.__loader__
        assert mod.__spec__.submodule_search_locations  # still a package
    finally:
        sys.meta_path.remove(finder)


def test_a_failing_hook_never_breaks_the_import(fake_package: Path) -> None:
    def hook(name: str, module: ModuleType) -> None:
        raise RuntimeError("boom")

    finder = bootstrap.PostImportFinder(("tgfakepkg.sub",), hook)
    sys.meta_path.insert(0, finder)
    try:
        import tgfakepkg.sub

        assert tgfakepkg.sub.VALUE == 42
    finally:
        sys.meta_path.remove(finder)
