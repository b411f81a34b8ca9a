"""The product as users install it: an sdist and the wheel built from it, installed into a fresh virtual
environment that holds only the pinned torch, every verb run from a directory outside the checkout; then the
extras on top.

Nothing here imports the checkout: the fresh environment gets its packages from the package index the way a
user's ``pip install`` does (torch pinned to this environment's version first, so pip never swaps it), so an
import the core path needs but the project does not declare fails here (numpy, missing from a torch-only
environment, once made every rank of the demo die in ``broadcast_object_list``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import venv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e._run_helpers import TINY_DEMO

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "trainguard"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass(frozen=True)
class Installed:
    """A fresh environment with the built wheel installed, and a working directory outside the checkout."""

    bin: Path
    """The environment's ``bin``: its ``python``, ``pip`` and the ``trainguard`` entry point."""
    work: Path
    """Where every command runs (run folders land here)."""
    dist: Path
    """The built sdist and wheel."""

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return env

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([str(self.bin / "trainguard"), *args], capture_output=True, text=True,
                             timeout=timeout, check=False, cwd=self.work, env=self.env())
        if check:
            assert res.returncode == 0, (args, res.returncode, res.stderr[-3000:])
        return res

    def pip(self, *args: str) -> None:
        res = subprocess.run([str(self.bin / "python"), "-m", "pip", "install", "-q", *args], capture_output=True,
                             text=True, timeout=600, check=False, cwd=self.work, env=self.env())
        assert res.returncode == 0, res.stderr[-3000:]


def _torch_pin() -> str:
    import torch

    return f"torch=={torch.__version__.split('+')[0]}"


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("installed")
    source = tmp / "source"
    shutil.copytree(PACKAGE.parent, source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    dist = tmp / "dist"
    # `python -m build` makes the sdist, then the wheel from the unpacked sdist: a file missing from the sdist
    # is missing from the wheel too.
    res = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    work = tmp / "elsewhere"
    work.mkdir()
    installed = Installed(env_dir / "bin", work, dist)
    installed.pip(_torch_pin())
    wheel = next(dist.glob("trainguard-*.whl"))
    installed.pip(str(wheel))
    return installed


def test_the_package_holds_its_data_and_only_its_declared_dependencies(product: Installed) -> None:
    (sdist,) = product.dist.glob("trainguard-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    assert any(n.endswith("src/trainguard/classify/rules.toml") for n in names), names[:20]
    assert product.run("--version").stdout.strip().endswith("0.1.0")
    ask = ("import importlib.util as u, trainguard; print(trainguard.__file__); "
           "print(*[m for m in ('numpy', 'starlette', 'pynvml', 'etcd', 'kubernetes') if u.find_spec(m)])")
    out = subprocess.run([str(product.bin / "python"), "-c", ask], capture_output=True, text=True, check=True,
                         cwd=product.work, env=product.env()).stdout.splitlines()
    where = Path(out[0])
    assert where.is_relative_to(product.bin.parent), where
    # numpy is core (decision P6); nothing of the extras came along with the core.
    assert out[1].split() == ["numpy"]
    # Every data file of the source tree (rules, failure models, the sample run, dashboard templates and
    # assets) made it into the installed package: the package-data globs miss none.
    data = {p.relative_to(PACKAGE) for p in PACKAGE.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert data and {d for d in data if not (where.parent / d).is_file()} == set()


@pytest.fixture(scope="module")
def demo(product: Installed) -> Iterator[tuple[dict, dict, str]]:
    """The demo from the wheel: its default crash-and-hang schedule, and the same run without faults."""
    common = ("demo", "--ranks", "2", "--steps", "16", "--ckpt-every", "3", "--seed", "7", "--model", TINY_DEMO,
              "--hang-floor", "3", "--json")
    faulty = product.run(*common, "--run-dir", "faulty")
    clean = product.run(*common, "--run-dir", "clean", "--inject", "none")
    yield json.loads(faulty.stdout), json.loads(clean.stdout), faulty.stderr


def _records(run_dir: Path, writer: str) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events" / f"{writer}.jsonl").read_text().splitlines()]


def test_the_demo_recovers_from_a_crash_and_a_hang_with_the_fault_free_loss(
        product: Installed, demo: tuple[dict, dict, str]) -> None:
    faulty, clean, console = demo
    # The console says what happened: one line per detection, diagnosis and restart, then a summary;
    # rank 0's own progress lines come through with its prefix.
    lines = console.splitlines()
    for word, count in ((" detected in attempt ", 2), ("diagnosis of attempt", 2), ("restart: attempt", 2),
                        ("summary: completed", 1)):
        assert sum(line.startswith("demo: ") and word in line for line in lines) == count, (word, console)
    assert any(line.startswith("[rank0]: train_gpt: step 10/16") for line in lines), console
    assert faulty["unfired_faults"] == []
    assert faulty["status"] == "completed"
    assert faulty["completed_steps"] == faulty["target_steps"] == 16
    assert [(i["kind"], i["culprit_ranks"]) for i in faulty["interruptions"]] == [("crash", [1]), ("hang", [0])]
    assert faulty["interruptions"][1]["detection_latency_seconds"] > 0
    assert 0 < faulty["ettr"] < 1
    # The run folder landed in the working directory, not in the checkout or the installed package.
    assert Path(faulty["run_dir"]).resolve().is_relative_to(product.work.resolve())
    # Steps re-executed after the restarts really ran again (nothing skipped, nothing applied twice).
    steps = [r for r in _records(product.work / "faulty", "rank-0") if r["type"] == "step_completed"]
    assert len({s["attempt"] for s in steps}) == 3
    assert clean["interruptions"] == [] and clean["completed_steps"] == 16
    assert faulty["final_loss"] is not None and clean["final_loss"] is not None
    assert abs(faulty["final_loss"] - clean["final_loss"]) <= 1e-6
    # The loss really moved (training happened), so the equality above is not a constant's.
    first = [r for r in _records(product.work / "clean", "rank-0") if r["type"] == "step_completed"
             and r["step"] == 1]
    assert first[0]["loss"] - clean["final_loss"] > 0.1


def test_report_diagnose_and_classify_read_the_demos_run(product: Installed, demo: tuple[dict, dict, str]) -> None:
    report = json.loads(product.run("report", "faulty", "--json").stdout)
    assert [i["kind"] for i in report["interruptions"]] == ["crash", "hang"]
    assert abs(report["wall_seconds"] - report["productive_seconds"] - sum(report["badput_seconds"].values())) < 0.5
    # The hang's flight-recorder dumps, as the agent gathered them: diagnose names the stopped rank.
    hang_attempt = report["interruptions"][1]["attempt"]
    diag = product.run("diagnose", f"faulty/diagnostics/attempt-{hang_attempt}", "--json", check=False)
    assert diag.returncode in (0, 1), diag.stderr[-2000:]
    assert json.loads(diag.stdout)["culprit_ranks"] == [0]
    # The crash attempt's logs: the killed rank (SIGKILL) leaves no signature of its own, its peer's log holds the
    # broken connection as evidence.
    crash_logs = product.work / "faulty" / "logs" / f"attempt-{report['interruptions'][0]['attempt']}"
    out = json.loads(product.run("classify", str(crash_logs / "rank-0.log"), str(crash_logs / "rank-1.log"),
                                 "--json").stdout)
    by_file = {Path(c["source"]).name: c for c in out}
    assert by_file["rank-1.log"]["lines"] > 0
    assert by_file["rank-0.log"]["evidence"], by_file["rank-0.log"]


def test_run_supervises_an_unmodified_script_through_a_crash(product: Installed) -> None:
    script = product.work / "plain_ddp.py"
    shutil.copy2(ROOT / "tests" / "e2e" / "unmodified" / "plain_ddp.py", script)
    res = product.run("run", "--nproc-per-node", "2", "--max-restarts", "2", "--run-dir", "plain", "--json",
                      "--", str(script), "--steps", "8", "--ckpt-dir", str(product.work / "plain-ckpt"),
                      "--ckpt-every", "2", "--crash-rank", "1", "--crash-step", "5")
    out = json.loads(res.stdout)
    assert out["status"] == "completed", out
    assert [f["kind"] for f in out["failures"]] == ["crash"]


def test_health_and_simulate_run_from_the_core_install(product: Installed) -> None:
    health = product.run("health", "--json", check=False)
    assert health.returncode in (0, 1), health.stderr[-2000:]  # 1: a check failed on this machine
    checks = {c["name"]: c for c in json.loads(health.stdout)}
    assert checks["torch_collective"]["ok"] and checks["memory"]["ok"], checks
    # Without the gpu extra the GPU checks say which extra would run them.
    assert checks["gpu_count"]["skipped"] and "trainguard[gpu]" in checks["gpu_count"]["detail"]
    sim = json.loads(product.run("simulate", "--gpus", "1024", "--days", "1", "--trials", "2", "--json").stdout)
    assert sim["trials"] == 2


def test_the_extras_install_on_top_and_their_verbs_run(product: Installed, demo: tuple[dict, dict, str]) -> None:
    wheel = next(product.dist.glob("trainguard-*.whl"))
    product.pip(f"{wheel}[web,gpu,etcd]")
    html = product.work / "faulty.html"
    product.run("report", "faulty", "--html", str(html))
    assert "<html" in html.read_text()[:2000].lower() and "plotly" in html.read_text()
    # gpu: NVML's bindings are there now; without a GPU the check says so instead of failing the verb.
    checks = {c["name"]: c for c in json.loads(product.run("health", "--json", check=False).stdout)}
    assert "NVML" in checks["gpu_count"]["detail"] and "trainguard[gpu]" not in checks["gpu_count"]["detail"]
    # web: the dashboard serves the run folder it is given.
    serve = subprocess.Popen([str(product.bin / "trainguard"), "serve", "--port", "0", "faulty"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=product.work,
                             env=product.env())
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()  # printed once it listens
        url = line[line.index("http://"):].strip()
        # the link's token is swapped for a session cookie by a redirect
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with browser.open(url, timeout=60) as page:
            assert page.status == 200 and "faulty" in page.read().decode()
    finally:
        serve.terminate()
        serve.wait(timeout=60)
