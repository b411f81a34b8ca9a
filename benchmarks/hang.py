"""Hang detection on an unmodified script, and false hangs of the learned timeout on healthy runs under load.

Sections, in one benchmark run:

* ``detection``: `trainguard run` (defaults) on tests/e2e/unmodified/plain_ddp.py (2 ranks, gloo; it never
  imports trainguard); once rank 1 has done ``--stop-step`` steps the benchmark SIGSTOPs it at a random
  point of a step. Per run: fault -> detection (``FailureDetected.time`` less the SIGSTOP's own time, both
  wall clock on this host), the latency the event reports and what it counts from, whether the culprit is
  rank 1. Interleaved rep by rep with the anchor ``floor_4s`` (the same with ``--hang-floor 4``, the
  previous default floor) and ``chaos_hang`` (``--inject hang@step=...,rank=1``: rank 1 sleeps in Python, its
  heartbeat thread alive, so the busy allowance applies; its latency counts from the fault's record).
* ``false_hangs_replay``: the recorded healthy step series (tests/unit/recorded/stragglers-contended-*.json,
  real 2-rank runs on a loaded 2-core host) replayed through the default timeout model
  (`trainguard.launch.hang_timeout.replay`, strictest reading: every interval as if the others waited).
* ``false_hangs_real``: unmodified scripts (plain DDP with evaluation pauses, Lightning) run to the end with
  defaults beside a CPU burner (``--burners`` busy processes); any ``FailureDetected`` is a false hang. Also
  the longest step interval of each run, and the longest silence of a heartbeat thread seen by polling the
  heartbeat files (what ``alive_stale_seconds`` must exceed).

    .venv/bin/python benchmarks/hang.py [--reps 3] [--stop-step 30] [--healthy-steps 200] [--burners 2]

Prints one JSON object (docs/run.md, "Hang detection latency").
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from trainguard.core.protocol import RunLayout, read_heartbeat  # noqa: E402
from trainguard.launch.hang_timeout import replay  # noqa: E402
from trainguard.launch.watchdog import WatchdogConfig  # noqa: E402

PLAIN = ROOT / "tests" / "e2e" / "unmodified" / "plain_ddp.py"
LIGHTNING = ROOT / "tests" / "e2e" / "unmodified" / "lightning_ddp.py"
RECORDED = ROOT / "tests" / "unit" / "recorded"
BURN = "import os\nos.nice(0)\nwhile True:\n    pass\n"


def _events(run_dir: Path, prefix: str) -> list[dict[str, Any]]:
    out = []
    for p in sorted((run_dir / "events").glob(f"{prefix}*.jsonl")):
        out += [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    return out


def _start(run_dir: Path, script: Path, script_args: list[str], options: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "trainguard", "run", "--standalone", "--nproc-per-node", "2", "--max-restarts",
           "0", "--run-dir", str(run_dir), "--no-health-checks", *options, str(script), *script_args]
    log = (run_dir.parent / f"{run_dir.name}.log").open("wb")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def _steps_done(run_dir: Path, rank: int) -> int:
    beats = [read_heartbeat(p) for p in RunLayout(run_dir).heartbeats_root.glob(f"*/attempt-0/rank-{rank}")]
    return max((b.steps_done for b in beats if b is not None), default=0)


def _worker_pid(run_dir: Path, rank: int) -> int | None:
    want = {f"TRAINGUARD_RUN_DIR={run_dir.resolve()}".encode(), f"RANK={rank}".encode(), b"TRAINGUARD_ATTEMPT=0"}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if want <= set((entry / "environ").read_bytes().split(b"\0")):
                    return int(entry.name)
            except OSError:
                continue
    return None


def _end(proc: subprocess.Popen[bytes], stopped: int | None = None) -> None:
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if stopped is not None:  # the agent kills it; should it not, it must not outlive the benchmark
        for sig in (signal.SIGKILL, signal.SIGCONT):
            try:
                os.kill(stopped, sig)
            except OSError:
                break


def _wait(what: str, ready: Any, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"no {what}")
        time.sleep(0.05)


def _failure(run_dir: Path) -> dict[str, Any] | None:
    found = [e for e in _events(run_dir, "agent-") if e["type"] == "failure_detected"]
    return found[0] if found else None


def culprit_right(run_dir: Path, failure: dict[str, Any], rank: int, wait_seconds: float = 10.0) -> bool:
    """The failure names ``rank`` alone, and so does the first diagnosis. The agent writes the diagnosis after the
    failure record (0.1 s later on this machine): it is waited for, up to ``wait_seconds``, else a failure read
    the moment it appeared counted as a wrong culprit."""
    deadline = time.monotonic() + wait_seconds
    while True:
        diagnosis = [e for e in _events(run_dir, "agent-") if e["type"] == "diagnosis"]
        if diagnosis or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return bool(failure["ranks"] == [rank] and diagnosis and diagnosis[0]["culprit_ranks"] == [rank])


def detection_run(run_dir: Path, args: argparse.Namespace, options: list[str], chaos: bool) -> dict[str, Any]:
    script_args = ["--steps", "100000", "--ckpt-dir", str(run_dir.parent / f"{run_dir.name}-ckpt")]
    inject = ["--inject", f"hang@step={args.stop_step},rank=1"] if chaos else []
    proc = _start(run_dir, PLAIN, script_args, [*options, *inject])
    pid = None
    try:
        if chaos:
            _wait("failure", lambda: _failure(run_dir) is not None, proc, 300)
            fault = min(e["time"] for e in _events(run_dir, "rank-") if e["type"] == "fault_injected")
        else:
            _wait(f"step {args.stop_step}", lambda: _steps_done(run_dir, 1) >= args.stop_step, proc, 300)
            pid = _worker_pid(run_dir, 1)
            if pid is None:
                raise RuntimeError("rank 1's process not found")
            time.sleep(random.uniform(0.0, 0.06))  # anywhere in a step (0.05 s of sleep plus compute)
            fault = time.time()
            os.kill(pid, signal.SIGSTOP)
            _wait("failure", lambda: _failure(run_dir) is not None, proc, 120)
        failure = _failure(run_dir)
        assert failure is not None
    finally:
        proc.terminate()
        _end(proc, pid)
    return {"fault_to_detection_seconds": round(failure["time"] - fault, 3),
            "reported_latency_seconds": round(failure["detection_latency_seconds"], 3),
            "latency_from": failure.get("latency_from", ""),
            "culprit_right": culprit_right(run_dir, failure, 1),
            "detail": failure["detail"][:240]}


def _replay_corpus() -> dict[str, Any]:
    model = WatchdogConfig().timeout_model()
    out: dict[str, Any] = {"model": {"floor_seconds": model.floor_seconds, "multiplier": model.multiplier,
                                     "samples": model.samples, "warmup_samples": model.warmup_samples,
                                     "warmup_seconds": model.warmup_seconds}, "series": []}
    for path in sorted(RECORDED.glob("stragglers-contended-*.json")):
        doc = json.loads(path.read_text())
        for rank in sorted({r[0] for r in doc["rows"]}):
            ends = sorted(r[2] for r in doc["rows"] if r[0] == rank)
            found, margin = replay(ends, model)
            gaps = [b - a for a, b in itertools.pairwise(ends)]
            out["series"].append({"file": path.name, "rank": rank, "intervals": len(gaps),
                                  "longest_interval_seconds": round(max(gaps), 3),
                                  "median_interval_seconds": round(statistics.median(gaps), 4),
                                  "false_hangs": len(found), "smallest_margin": round(margin, 2)})
    out["false_hangs"] = sum(s["false_hangs"] for s in out["series"])
    return out


class _HeartbeatWatch:
    """Polls every heartbeat file of a run at 20 Hz; the longest gap between successive writes per rank."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.longest = 0.0
        self._last: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            for path in RunLayout(self.run_dir).heartbeats_root.glob("*/attempt-*/rank-*"):
                beat = read_heartbeat(path)
                if beat is None or beat.alive_mono <= 0 or beat.phase == "done":
                    continue
                last = self._last.get(str(path))
                if last is not None and beat.alive_mono > last:
                    self.longest = max(self.longest, beat.alive_mono - last)
                self._last[str(path)] = beat.alive_mono

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.longest


def healthy_run(run_dir: Path, script: Path, steps: int) -> dict[str, Any]:
    extra = ["--eval-every", "40", "--eval-seconds", "6"] if script == PLAIN else []
    proc = _start(run_dir, script, ["--steps", str(steps), "--ckpt-dir", str(run_dir.parent / f"{run_dir.name}-ck"),
                                    *extra], ["--quiet"])
    watch = _HeartbeatWatch(run_dir)
    load = [os.getloadavg()[0]]
    try:
        code = proc.wait(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    silence = watch.stop()
    load.append(os.getloadavg()[0])
    steps_seen = [e for e in _events(run_dir, "rank-") if e["type"] == "step_completed"]
    longest = 0.0
    for rank in (0, 1):
        ends = sorted(e["time"] for e in steps_seen if e["rank"] == rank)
        longest = max([longest, *(b - a for a, b in itertools.pairwise(ends))])
    failures = [e for e in _events(run_dir, "agent-") if e["type"] == "failure_detected"]
    return {"script": script.name, "exit_code": code, "steps": len(steps_seen) // 2, "false_hangs": len(failures),
            "failures": [f"{f['kind']}: {f['detail'][:160]}" for f in failures],
            "longest_step_interval_seconds": round(longest, 3),
            "longest_heartbeat_silence_seconds": round(silence, 3), "load_1min": [round(x, 1) for x in load]}


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    lat = [r["fault_to_detection_seconds"] for r in rows]
    return {"median_fault_to_detection_seconds": round(statistics.median(lat), 3) if lat else None,
            "max_fault_to_detection_seconds": max(lat, default=None),
            "culprit_right": sum(r["culprit_right"] for r in rows), "runs": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--stop-step", type=int, default=30)
    p.add_argument("--healthy-steps", type=int, default=200)
    p.add_argument("--burners", type=int, default=2, help="busy processes beside the healthy runs")
    p.add_argument("--skip-real", action="store_true", help="replay only, no real runs")
    args = p.parse_args()
    out: dict[str, Any] = {"benchmark": "hang detection on an unmodified script, false hangs under load",
                           "false_hangs_replay": _replay_corpus()}
    if args.skip_real:
        print(json.dumps(out, indent=2))
        return 0
    configs = {"defaults": ([], False), "floor_4s": (["--hang-floor", "4"], False), "chaos_hang": ([], True)}
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in configs}
    with tempfile.TemporaryDirectory(prefix="tg-hang-bench-") as tmp:
        base = Path(tmp)
        for rep in range(args.reps):
            for name, (options, chaos) in configs.items():
                rows[name].append(detection_run(base / f"{name}-{rep}", args, options, chaos))
        burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(args.burners)]
        try:
            time.sleep(5)  # let the load average see them
            real = [healthy_run(base / f"healthy-{s.stem}", s, args.healthy_steps) for s in (PLAIN, LIGHTNING)]
        finally:
            for b in burners:
                b.kill()
                b.wait()
    anchor = _summary(rows["floor_4s"])["median_fault_to_detection_seconds"]
    detection = {name: _summary(r) for name, r in rows.items()}
    defaults = detection["defaults"]["median_fault_to_detection_seconds"]
    detection["defaults_vs_floor_4s"] = round(defaults / anchor, 3) if defaults and anchor else None
    out["detection"] = detection
    out["false_hangs_real"] = {"burners": args.burners, "runs": real,
                               "false_hangs": sum(r["false_hangs"] for r in real)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
