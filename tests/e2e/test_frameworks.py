"""`trainguard run` on unmodified Hugging Face ``Trainer`` and Lightning ``Trainer`` scripts: the framework adapters.

Each script (tests/e2e/userscripts/hf_clm.py in run_clm.py's shape, lightning_fit.py) checkpoints itself and
resumes from its own last checkpoint; a chaos crash of rank 1 lands a few steps after a checkpoint. What the
user reads in ``trainguard report --json`` must then be the framework's truth: completed steps equal to the
framework's global step, one interruption, the resume point at the checkpoint, lost progress equal to the
steps run since it (within one step's time), the framework's saves and loads in the checkpoint buckets, and
buckets that add up to the wall time. Offline: tiny models from configs, local synthetic data.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e._run_helpers import events, of_type, trainguard

pytest.importorskip("transformers")
pytest.importorskip("lightning")

USER = Path(__file__).resolve().parent / "userscripts"
HF = USER / "hf_clm.py"
LIGHTNING = USER / "lightning_fit.py"

pytestmark = pytest.mark.timeout(300)


def _data(tmp_path: Path) -> Path:
    words = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "trainer", "saves")
    rng = random.Random(0)
    path = tmp_path / "data.txt"
    path.write_text(" ".join(rng.choice(words) for _ in range(20_000)))
    return path


def _hf_args(tmp_path: Path, *, steps: int, save_every: int, optim: str = "adamw_torch",
             save_only_model: bool = False) -> list[str]:
    args = [str(HF), "--train_file", str(_data(tmp_path)), "--output_dir", str(tmp_path / "out"), "--do_train",
            "--max_steps", str(steps), "--save_steps", str(save_every), "--logging_steps", "5", "--use_cpu",
            "--ddp_backend", "gloo", "--report_to", "none", "--per_device_train_batch_size", "4",
            "--batch_delay", "0.1", "--disable_tqdm", "true", "--optim", optim, "--seed", "0"]
    return [*args, "--save_only_model"] if save_only_model else args


def _lightning_args(tmp_path: Path, *, steps: int, save_every: int, optimizer: str) -> list[str]:
    return [str(LIGHTNING), "--steps", str(steps), "--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every",
            str(save_every), "--optimizer", optimizer, "--step-seconds", "0.1"]


def _run(tmp_path: Path, script: list[str], inject: str, *, max_restarts: int = 3,
         extra: tuple[str, ...] = ()) -> tuple[Path, str]:
    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "trainguard", "run", "--standalone", "--nproc-per-node", "2", "--max-restarts",
           str(max_restarts), "--run-dir", str(run_dir), "--no-health-checks", "--straggler-probe-seconds", "0",
           "--telemetry-seconds", "0", "--inject", inject, *extra, *script]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280, check=False)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"trainguard run exited {proc.returncode}:\n{console[-6000:]}"
    return run_dir, console


def _report(run_dir: Path) -> dict[str, Any]:
    res = trainguard("report", str(run_dir), "--json", timeout=60)
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(spans):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def _redone(ranks: list[dict[str, Any]], attempt: int, after: int, detected: float) -> tuple[float, float]:
    """(time, then to the failure) of the steps an attempt ran beyond step ``after``: first start to last end on any
    rank, less what a checkpoint save took meanwhile (a rank that waits for a saving peer starts its step early);
    then the time from that last end to the failure's detection (``detected``), which bounds the step the attempt
    was in when it failed (on a loaded host longer than any step it completed)."""
    steps = [r for r in of_type(ranks, "step_completed") if r["attempt"] == attempt and r["step"] > after]
    if not steps:
        return 0.0, 0.0
    lo, hi = min(r["time"] - r["duration_seconds"] for r in steps), max(r["time"] for r in steps)
    saves = [(max(lo, s["time"] - s["total_seconds"]), min(hi, s["time"]))
             for s in of_type(ranks, "checkpoint_save_finished")]
    return hi - lo - _union([(a, b) for a, b in saves if b > a]), max(0.0, detected - hi)


def _check(run_dir: Path, rep: dict[str, Any], *, steps: int, resumes: list[int], lost_steps: list[int],
           adapter: bool = True) -> None:
    """What the report must say of a run that resumed at ``resumes`` (one crash before each) and finished,
    having run ``lost_steps`` steps past the checkpoint before each crash."""
    ranks = events(run_dir, "rank-")
    if not adapter:  # the optimizer counted from 1 again: number the last attempt's steps from its resume point
        ranks = [{**r, "step": r["step"] + resumes[r["attempt"] - 1]} if r["type"] == "step_completed"
                 and r["attempt"] else r for r in ranks]
    step_records = of_type(ranks, "step_completed")
    assert max(r["step"] for r in step_records if r["attempt"] == len(resumes)) == steps
    assert rep["completed_steps"] == steps
    assert rep["attempts"] == len(resumes) + 1
    assert [i["kind"] for i in rep["interruptions"]] == ["crash"] * len(resumes)
    assert [(p["attempt"], p["step"]) for p in rep["resume_points"]] == list(enumerate(resumes, start=1))
    assert rep["lost_progress_unknown"] is None
    assert not [w for w in rep["warnings"] if "unknown" in w]
    # Lost progress: the steps each failed attempt ran past the checkpoint it was resumed from, and the step it
    # was in when it crashed (at most until the crash was detected); ranks end a step milliseconds apart, and the
    # overlap of one rank's last kept step with another's first redone one is productive.
    detected = {f["attempt"]: f["time"] for f in of_type(events(run_dir, "agent-"), "failure_detected")}
    redone = [_redone(ranks, attempt, after, detected[attempt]) for attempt, after in enumerate(resumes)]
    assert [len({r["step"] for r in of_type(ranks, "step_completed") if r["attempt"] == a and r["step"] > after})
            for a, after in enumerate(resumes)] == lost_steps
    lost = rep["badput_seconds"]["lost_progress"]
    expected = sum(span for span, _ in redone)
    assert expected - 0.05 <= lost <= expected + sum(to_failure for _, to_failure in redone) + 0.05, (lost, redone)
    saves = of_type(ranks, "checkpoint_save_finished")
    loads = of_type(ranks, "checkpoint_loaded")
    if adapter:
        assert saves and all(s["framework"] for s in saves)
        assert sorted({(s["attempt"], s["step"]) for s in saves})[0][1] > 0
        assert rep["badput_seconds"]["checkpoint_save"] > 0
        assert rep["badput_seconds"]["checkpoint_save"] == pytest.approx(
            _union([(s["time"] - s["total_seconds"], s["time"]) for s in saves]), rel=0.02, abs=1e-3)
        assert sorted({(r["attempt"], r["step"]) for r in loads}) == list(enumerate(resumes, start=1))
        assert rep["badput_seconds"]["checkpoint_restore"] > 0
        assert rep["badput_seconds"]["checkpoint_restore"] == pytest.approx(
            _union([(r["time"] - r["seconds"], r["time"]) for r in loads]), rel=0.02, abs=1e-3)
    total = rep["productive_seconds"] + sum(rep["badput_seconds"].values())
    assert total == pytest.approx(rep["wall_seconds"], rel=1e-6, abs=1e-6)
    assert rep["ettr"] == pytest.approx(rep["productive_seconds"] / rep["wall_seconds"], rel=1e-6)


def _one_prefix(console: str, run_dir: Path | None = None) -> None:
    """No console line carries its rank prefix twice; with ``run_dir``: some worker line did bring its own."""
    doubled = re.findall(r"^\[rank(\d+)\]: ?\[rank\1\]:.*$", console, re.MULTILINE)
    assert not doubled, doubled[:3]
    if run_dir is not None:  # torch's own prefix (C++ warnings, tracebacks) is in the worker's log
        own = [m for log in (run_dir / "logs").glob("attempt-*/rank-*.log")
               for m in re.finditer(r"^\[rank(\d+)\]: ?(.+)$", log.read_text(errors="replace"), re.MULTILINE)]
        assert own
        assert any(f"[rank{m[1]}]: {m[2]}"[:60] in console for m in own)


@pytest.mark.parametrize(("optim", "save_only_model"), [pytest.param("adamw_torch", False, id="adamw"),
                                                        pytest.param("sgd", True, id="sgd-save-only-model")])
def test_hf_trainer_crash_after_a_checkpoint(tmp_path: Path, optim: str, save_only_model: bool) -> None:
    # Checkpoints at 10 and 20; rank 1 dies at the start of step 24: steps 21-23 are redone after the resume at 20.
    # With --save_only_model (and SGD, which keeps no step count) the optimizer restarts from nothing: only the
    # Trainer's global step says where training is.
    script = _hf_args(tmp_path, steps=30, save_every=10, optim=optim, save_only_model=save_only_model)
    run_dir, console = _run(tmp_path, script, "crash@step=24,rank=1")
    _check(run_dir, _report(run_dir), steps=30, resumes=[20], lost_steps=[3])
    assert "done at global step 30" in console
    _one_prefix(console, run_dir)  # the DDP reducer's C++ warning comes with torch's "[rankN]:"


def test_hf_trainer_resuming_further_each_attempt_is_not_stopped_for_no_progress(tmp_path: Path) -> None:
    # The run, scaled down: a crash at step 10, then a few steps past the next checkpoint in each of three
    # more attempts (the optimizer restarts each time: --save_only_model). Counted by the optimizer, attempts 1-3
    # each made 8 steps, never beyond attempt 0's 9, and the no-progress rule (3 attempts) stopped the job.
    script = _hf_args(tmp_path, steps=25, save_every=5, save_only_model=True)
    inject = ";".join(f"crash@step={s},rank=1,attempt={a}" for a, s in enumerate((10, 14, 19, 24)))
    run_dir, _ = _run(tmp_path, script, inject, max_restarts=5)
    _check(run_dir, _report(run_dir), steps=25, resumes=[5, 10, 15, 20], lost_steps=[4, 3, 3, 3])


def test_hf_trainer_without_its_adapter_resumes_from_the_checkpoint_it_loaded(tmp_path: Path) -> None:
    # --no-framework-adapters: steps come from the optimizer hooks, whose count restarts at 1 (--save_only_model).
    # The Trainer's load of checkpoint-20/model.safetensors, seen at safetensors' call, gives the resume point
    # (before the log line "Resuming training from checkpoint ... global step 20", which says the same).
    script = _hf_args(tmp_path, steps=30, save_every=10, save_only_model=True)
    run_dir, _ = _run(tmp_path, script, "crash@step=24,rank=1", extra=("--no-framework-adapters",))
    ranks = events(run_dir, "rank-")
    assert {r["numbering"] for r in of_type(ranks, "step_completed")} == {"optimizer"}
    rep = _report(run_dir)
    assert [p["source"] for p in rep["resume_points"]] == ["checkpoint_name"]
    _check(run_dir, rep, steps=30, resumes=[20], lost_steps=[3], adapter=False)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_lightning_trainer_crash_after_a_checkpoint(tmp_path: Path, optimizer: str) -> None:
    script = _lightning_args(tmp_path, steps=30, save_every=10, optimizer=optimizer)
    run_dir, console = _run(tmp_path, script, "crash@step=24,rank=1")
    _check(run_dir, _report(run_dir), steps=30, resumes=[20], lost_steps=[3])
    assert "done at global step 30" in console
    _one_prefix(console)
    # `import lightning` reads RANK and LOCAL_RANK at import: it is loaded ahead by the fork server all the same
    # (trainguard.worker.import_ranks; tests/dist/test_fork_server.py checks each rank's kept value), and the
    # Trainer's rank-zero messages still come from rank 0 alone, once per attempt.
    assert "now load after the fork" not in console
    assert "(2 warm)" in console
    said = re.findall(r"^\[rank(\d+)\]: GPU available", console, re.MULTILINE)
    assert said == ["0", "0"], said
