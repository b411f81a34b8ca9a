"""An installed trainguard (not the checkout) runs ``trainguard demo`` from a directory outside the checkout.

The project is copied, built and installed with pip into a fresh virtual environment; its dependencies
come from this environment's site-packages through a ``.pth`` line (so nothing is downloaded), which
Python appends after the fresh environment's own site-packages: the installed copy wins over the
checkout's editable install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

from tests.e2e._run_helpers import TINY_DEMO

ROOT = Path(__file__).resolve().parents[2]


def _install(tmp: Path) -> Path:
    """Build and install a copy of the project into a fresh venv; returns the venv's bin directory."""
    source = tmp / "source"
    shutil.copytree(ROOT / "src", source / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    bin_dir = env_dir / "bin"
    ask = "import sysconfig; print(sysconfig.get_path('purelib'))"
    fresh_site = subprocess.run([str(bin_dir / "python"), "-c", ask], capture_output=True, text=True,
                                check=True).stdout.strip()
    # Only the dependencies come from here: a .pth line adds a directory but not the .pth files in it,
    # so this environment's editable install of the checkout stays out.
    Path(fresh_site, "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # pip and setuptools come through the .pth line too; run by the fresh interpreter, pip installs there
    # and writes that interpreter into the `trainguard` script.
    res = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--no-index", str(source)],
                         capture_output=True, text=True, timeout=300, check=False, cwd=tmp)
    assert res.returncode == 0, res.stderr[-3000:]
    return bin_dir


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_installed_package_runs_the_demo_outside_the_checkout(tmp_path: Path) -> None:
    bin_dir = _install(tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    where = subprocess.run([str(bin_dir / "python"), "-c", "import trainguard; print(trainguard.__file__)"],
                           capture_output=True, text=True, check=True, cwd=work, env=env).stdout.strip()
    assert Path(where).is_relative_to(tmp_path / "venv"), where
    # Every data file of the source tree (rules, failure models, the sample run, dashboard templates and
    # assets) made it into the installed package: the package-data globs miss none.
    package = Path(where).parent
    data = {p.relative_to(ROOT / "src" / "trainguard") for p in (ROOT / "src" / "trainguard").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert data and {d for d in data if not (package / d).is_file()} == set()
    res = subprocess.run([str(bin_dir / "trainguard"), "demo", "--steps", "20", "--ranks", "2", "--model", TINY_DEMO,
                          "--hang-floor", "3", "--json"],
                         capture_output=True, text=True, timeout=400, check=False, cwd=work, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["status"] == "completed"
    assert out["completed_steps"] == out["target_steps"] == 20
    assert [i["kind"] for i in out["interruptions"]] == ["crash", "hang"]
    # The run directory landed in the working directory, not in the checkout or the installed package.
    assert Path(out["run_dir"]).resolve().is_relative_to(work.resolve())
