"""The in-script API from the top level: listed by dir(), typed for mypy --strict, light to import, wired."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trainguard
from trainguard.core.eventlog import read_events
from trainguard.core.events import CheckpointLoaded, CheckpointSaveFinished, StepCompleted

ROOT = Path(__file__).resolve().parents[2]
TYPING = ROOT / "tests" / "typing"
IN_SCRIPT = {"attach", "Checkpointer", "CheckpointConfig", "IntervalPolicy", "pg_timeout", "Worker", "restartable",
             "Replica"}


def _python(code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    for key in [k for k in env if k.startswith("TRAINGUARD_") or k in ("RANK", "TORCHELASTIC_RUN_ID")]:
        del env[key]  # a plain run, not under an agent
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=240
    )


def test_dir_lists_the_in_script_api_and_every_listed_name_resolves() -> None:
    names = set(dir(trainguard))
    assert names >= IN_SCRIPT and set(trainguard.__all__) >= IN_SCRIPT
    for name in trainguard.__all__:
        assert getattr(trainguard, name) is not None, name


def test_import_is_light_and_dir_needs_no_torch() -> None:
    done = _python("import json, sys, trainguard; print(json.dumps(['torch' in sys.modules, dir(trainguard)]))")
    assert done.returncode == 0, done.stderr
    torch_loaded, names = json.loads(done.stdout)
    assert not torch_loaded and set(names) >= IN_SCRIPT


def _mypy(script: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(TYPING / "mypy-strict.ini"), "--cache-dir", str(cache),
         str(script)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )


def test_readme_script_type_checks_strictly_with_real_types(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    done = _mypy(TYPING / "readme_example.py", tmp_path / "cache")
    assert done.returncode == 0, done.stdout + done.stderr
    # The same checker must see real types, not Any: misuse of the API is an error.
    bad = tmp_path / "misuse.py"
    bad.write_text(
        "import trainguard\n"
        "worker = trainguard.attach()\n"
        "ckpt = trainguard.Checkpointer(worker, 'every 50 steps')\n"
        "trainguard.IntervalPolicy.every_steps('5')\n"
    )
    done = _mypy(bad, tmp_path / "cache")
    assert done.returncode == 1
    assert 'Argument 2 to "Checkpointer"' in done.stdout and '"every_steps"' in done.stdout, done.stdout


_WIRED = """
import json, sys, torch, trainguard
run = sys.argv[1]
state = {"w": torch.zeros(4)}
with trainguard.attach(run) as worker:
    config = trainguard.CheckpointConfig(interval=trainguard.IntervalPolicy.every_steps(2), async_save=False)
    with trainguard.Checkpointer(worker, config) as ckpt:
        start = ckpt.restore(state) or 0
        for step in range(start + 1, 5):
            with worker.step(step) as s:
                with s.phase("compute"):
                    state["w"] += 1
                if ckpt.should_save(step):
                    ckpt.save(step, state)
print(json.dumps({"start": start, "attempt": worker.attempt, "closed": worker._rt.closed}))
"""


def test_checkpointer_built_from_a_worker_uses_its_run_dir_events_and_phase(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = _python(_WIRED, str(run), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    second = _python(_WIRED, str(run), cwd=tmp_path)  # a restart: resumes from the worker's own checkpoints
    assert second.returncode == 0, second.stderr
    assert json.loads(first.stdout)["start"] == 0 and json.loads(second.stdout)["start"] == 4
    assert json.loads(first.stdout)["closed"]  # leaving the `with` closed the worker
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-2", "step-4"]
    records = [r for f in sorted((run / "events").glob("*.jsonl")) for r in read_events(f)]
    saved = [r for r in records if isinstance(r, CheckpointSaveFinished)]
    assert [r.step for r in saved] == [2, 4] and all(r.ok for r in saved)
    assert [r.step for r in records if isinstance(r, CheckpointLoaded)] == [4]
    steps = {r.step: r for r in records if isinstance(r, StepCompleted)}
    # The checkpointer marks its own phase: saving steps account for it, the others do not.
    assert steps[2].phases.get("checkpoint", 0) > 0 and steps[4].phases.get("checkpoint", 0) > 0
    assert "checkpoint" not in steps[1].phases and "compute" in steps[1].phases


def test_checkpointer_refuses_what_is_neither_worker_nor_directory() -> None:
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="Worker or a directory"):
        trainguard.Checkpointer(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"CheckpointConfig\.keep_last"):
        trainguard.CheckpointConfig(keep_last=0)
    with pytest.raises(ValueError, match=r"IntervalPolicy\.steps"):
        trainguard.IntervalPolicy(policy="steps")


def test_errors_carry_no_exit_code_only_the_cli_maps_them() -> None:
    from trainguard import errors
    from trainguard.cli import exit_code_for

    cases = {
        errors.UsageError("x"): errors.EXIT_USAGE,
        errors.InputError("x"): errors.EXIT_INPUT,
        errors.SchemaVersionError("f", 1, 9, 1): errors.EXIT_INPUT,  # a subclass maps like its base
        errors.StorageError("x"): errors.EXIT_STORAGE,
        errors.CheckpointError("x"): errors.EXIT_STORAGE,
        errors.TrainguardError("x"): errors.EXIT_FAILURE,
    }
    for exc, code in cases.items():
        assert not hasattr(exc, "exit_code") and exit_code_for(exc) == code, exc
    assert trainguard.CheckpointError is errors.CheckpointError
