"""Restarts of the framework scripts in the tests (Lightning Fabric, Accelerate, Lightning Trainer, Hugging Face
Trainer), unmodified, under `trainguard run` with its defaults against bare ``torchrun --max-restarts 1``.

Each run starts 2 ranks of one script (tests/e2e/userscripts/: fabric_loop.py, accelerate_loop.py,
lightning_fit.py, hf_clm.py; each checkpoints itself every 5 steps in its framework's documented way and appends
when the first step of each of its processes ended to a timing log). ``--fault-after`` seconds after both ranks'
first step, the benchmark SIGKILLs rank 1's process (the same outside fault under both launchers); measured:
fault -> the first step every rank completed in the restarted job, from the scripts' own timing logs. For
trainguard also how many ranks the restart gave to warm spares (``warm_starts``). Runs interleave (each rep runs
every script under both launchers, the order reversed every other rep).

    .venv/bin/python benchmarks/restart_frameworks.py [--reps 2] [--only fabric,hf] [--fault-after 20]

Prints one JSON object: per script, each launcher's median and runs, and trainguard's ratio to torchrun.
Goal (issue 37): never slower than a cold restart; <= 0.5x torchrun where the script allows a warm start.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
USER = ROOT / "tests" / "e2e" / "userscripts"
SCRIPTS = ("fabric", "accelerate", "lightning", "hf")
STEP_SECONDS = 0.1


def _script(name: str, work: Path) -> list[str]:
    timing = str(work / "timing")
    if name == "fabric":
        return [str(USER / "fabric_loop.py"), "--steps", "100000", "--ckpt-dir", str(work / "ckpt"), "--ckpt-every",
                "5", "--width", "256", "--step-seconds", str(STEP_SECONDS), "--export", "", "--timing-log", timing]
    if name == "accelerate":
        return [str(USER / "accelerate_loop.py"), "--steps", "100000", "--ckpt-dir", str(work / "ckpt"),
                "--ckpt-every", "5", "--width", "256", "--step-seconds", str(STEP_SECONDS), "--timing-log", timing]
    if name == "lightning":
        return [str(USER / "lightning_fit.py"), "--steps", "100000", "--ckpt-dir", str(work / "ckpt"),
                "--ckpt-every", "5", "--step-seconds", str(STEP_SECONDS), "--timing-log", timing]
    data = work / "data.txt"
    rng = random.Random(0)
    data.write_text(" ".join(rng.choice(("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"))
                             for _ in range(200_000)))
    return [str(USER / "hf_clm.py"), "--train_file", str(data), "--output_dir", str(work / "out"), "--do_train",
            "--max_steps", "100000", "--save_steps", "5", "--use_cpu", "--ddp_backend", "gloo", "--report_to",
            "none", "--per_device_train_batch_size", "4", "--batch_delay", str(STEP_SECONDS), "--disable_tqdm", "true",
            "--seed", "0", "--timing_log", timing]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINGUARD_", "TORCHELASTIC_"))}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    return env


def _firsts(work: Path) -> list[tuple[int, float]]:
    """(rank, end) of every process's first step, from the timing logs."""
    out = []
    for path in work.glob("timing.*"):
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                if rec.get("what") == "first_step":
                    out.append((int(path.name.rsplit(".", 1)[1]), float(rec["end"])))
    return out


def _rank1_pid(work: Path) -> int | None:
    """Rank 1's training process: the environment says RANK=1 and the command line names this run's folder."""
    marker = str(work).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "cmdline").read_bytes() and \
                    b"RANK=1" in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:
            continue
    return None


def _wait(what: str, check: Any, proc: subprocess.Popen[bytes], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended (exit {proc.returncode}) while waiting for {what}")
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def one_run(name: str, launcher: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    work.mkdir(parents=True)
    script = _script(name, work)
    if launcher == "trainguard":
        cmd = [sys.executable, "-m", "trainguard", "run", "--nproc-per-node", "2", "--run-dir", str(work / "run"),
               "--max-restarts", "1", "--", *script]
        env = _env()
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", *script]
        env = {**_env(), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # bare torchelastic restarts gloo only so
    with open(work / "console.log", "wb") as console:
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=console, stderr=subprocess.STDOUT,
                                start_new_session=True)
    out: dict[str, Any] = {"load_1min": round(os.getloadavg()[0], 2)}
    try:
        _wait("both ranks' first step", lambda: len({r for r, _ in _firsts(work)}) == 2, proc, 300)
        time.sleep(args.fault_after)
        pid = _wait("rank 1's process", lambda: _rank1_pid(work), proc, 30)
        fault = time.time()
        os.kill(pid, signal.SIGKILL)

        def restarted() -> float | None:
            after: dict[int, float] = {}
            for rank, end in _firsts(work):
                if end > fault:
                    after[rank] = min(after.get(rank, end), end)
            return max(after.values()) if len(after) == 2 else None

        out["fault_to_first_new_step_seconds"] = round(_wait("the restart's first steps", restarted, proc, 300)
                                                       - fault, 3)
        if launcher == "trainguard":
            started = [json.loads(x) for p in (work / "run" / "events").glob("agent-*.jsonl")
                       for x in p.read_text().splitlines() if '"attempt_started"' in x]
            out["warm_starts"] = sum(e.get("warm_starts", 0) for e in started if e["attempt"] == 1)
    except RuntimeError as exc:
        out["error"] = str(exc)
        out["console_tail"] = (work / "console.log").read_text(errors="replace")[-1500:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return out


def _median(runs: list[dict[str, Any]]) -> float | None:
    values = [r["fault_to_first_new_step_seconds"] for r in runs if "fault_to_first_new_step_seconds" in r]
    return round(statistics.median(values), 3) if values else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--only", default=",".join(SCRIPTS), help=f"comma-separated scripts of {', '.join(SCRIPTS)}")
    p.add_argument("--fault-after", type=float, default=20.0,
                   help="seconds after both ranks' first step that rank 1 is killed (default 20)")
    args = p.parse_args()
    names = [n for n in args.only.split(",") if n]
    if set(names) - set(SCRIPTS):
        p.error(f"unknown script(s): {', '.join(sorted(set(names) - set(SCRIPTS)))}")
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {n: {"trainguard": [], "torchrun": []} for n in names}
    uptime_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        order = [(n, launcher) for n in names for launcher in ("trainguard", "torchrun")]
        for rep in range(args.reps):
            for n, launcher in (order if rep % 2 == 0 else order[::-1]):
                rows[n][launcher].append(one_run(n, launcher, args, Path(d) / f"{n}-{launcher}-{rep}"))
    summary: dict[str, Any] = {}
    for n, by in rows.items():
        tg, bare = _median(by["trainguard"]), _median(by["torchrun"])
        summary[n] = {"trainguard_seconds": tg, "torchrun_seconds": bare,
                      "ratio": round(tg / bare, 3) if tg is not None and bare else None,
                      "warm_starts": [r.get("warm_starts") for r in by["trainguard"]],
                      "errors": sum("error" in r for r in by["trainguard"] + by["torchrun"])}
    print(json.dumps({"benchmark": "framework scripts: fault (SIGKILL of rank 1) -> first new step, trainguard "
                                   "defaults vs torchrun", "reps": args.reps, "fault_after_seconds": args.fault_after,
                      "load_average_start": [round(x, 2) for x in uptime_start],
                      "load_average_end": [round(x, 2) for x in os.getloadavg()],
                      "summary": summary, "runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
