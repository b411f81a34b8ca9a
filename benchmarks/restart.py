"""Restart latency of `trainguard run` against a bare `torchrun --max-restarts` restart, same workload, same run.

Every run trains the reference GPT (2 ranks by default) and faults rank 1 at the same step with the same
chaos injection (the in-rank library fires it everywhere: under torchrun it runs without an agent).
Measured from the events the ranks write:

* fault -> first new step: the injected fault's time to the first step completed by every rank in the
  next attempt (the same yardstick for all);
* for trainguard also detection -> first new step (FailureDetected.time to the same point), and the
  detection latency itself.

Sections, all in the same benchmark run, interleaved rep by rep:

* ``unmodified``: an unmodified plain DDP script (tests/e2e/unmodified/plain_ddp.py, which never imports
  trainguard), `trainguard run` with no recovery option at all against bare ``torchrun --max-restarts 1``;
  rank 1 SIGKILLs itself at ``--unmodified-crash-step`` of the first launch; fault -> first new step from the
  script's own step log (the same yardstick under both launchers); goal <= 0.5 x torchrun's. ``warm_starts``
  says how many ranks of the restart were warm (forks of the node's fork server, by default, or warm spares);
  ``trainguard_warm_spares_0`` is the same run with ``--no-fork-server --warm-spares 0`` (cold interpreters),
  for comparison; ``trainguard_spares_at_launch`` with ``--no-fork-server --warm-spares RANKS`` (a pool that
  starts with the job whatever the node's CPUs). Each run also gives ``launch_to_first_step_seconds`` (the
  launcher's start -> the first step every rank completed: what a pool started with the job costs the start).
  With ``--ranks 1`` rank 0 crashes; ``--unmodified-crash-step 2`` is a fault in the first steps;

* ``trainguard``: `trainguard run`, SIGKILL of rank 1, whole-process restart (trainguard/examples/train_gpt.py);
* ``torchrun_max_restarts``: bare torchrun, the same crash;
* ``inprocess_forked``: `trainguard run --in-process` with its defaults on the same model written as a
  restartable function (trainguard/examples/train_gpt_inprocess.py): rank 0 re-enters in its interpreter, rank
  1's new process is a fork of the node's fork server; goal <= 0.35 x torchrun's fault -> first new step;
* ``inprocess``: the same with ``--no-fork-server --warm-spares 1``: a warm spare takes rank 1's place;
* ``inprocess_cold``: the same with ``--no-fork-server --warm-spares 0`` (rank 1's new process imports torch);
* ``warm_restart``: a whole-process restart from warm spares (``--in-process --fresh-processes --no-fork-server
  --warm-spares RANKS``: every rank gets a new process, none imports torch); goal <= 0.6 x torchrun's;
* ``hang``: a hang of rank 1 (it stops before the step's collectives) under `trainguard run`: detection
  latency and detection -> first new step (goal <= 5 s: stopping the hung workers takes the
  SIGCONT/SIGTERM/--stop-grace/SIGKILL path, not torch's 30 s); ``hang_inprocess``: the same with
  ``--in-process --no-fork-server --warm-spares 1`` (the hung rank is killed at once and replaced).

Bare torchrun needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 to restart gloo workers at all (see
shared/reference/pytorch-2.13-cpu-facts.md); it gathers no evidence and runs no health checks.
Runs with warm spares train tests/e2e/userscripts/inprocess_after_spare.py: the same script, which starts
training only once the spares wait, so the fault never meets a spare still importing torch.

    .venv/bin/python benchmarks/restart.py [--reps 2] [--ranks 2] [--steps 50] [--crash-step 40]
        [--unmodified-crash-step 500] [--only-unmodified]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GPT = ROOT / "src" / "trainguard" / "examples" / "train_gpt.py"
GPT_INPROCESS = ROOT / "src" / "trainguard" / "examples" / "train_gpt_inprocess.py"
# train_gpt_inprocess that starts training once the warm spares wait (their start-up is not the restart's)
AFTER_SPARES = ROOT / "tests" / "e2e" / "userscripts" / "inprocess_after_spare.py"
MODEL = ["--d-model", "128", "--layers", "2", "--heads", "4", "--seq", "64", "--batch", "8"]
HANG_GOAL_SECONDS = 5.0
INPROCESS_GOAL_RATIO = 0.35
WARM_GOAL_RATIO = 0.6
UNMODIFIED_GOAL_RATIO = 0.5
PLAIN = ROOT / "tests" / "e2e" / "unmodified" / "plain_ddp.py"


def _events(run_dir: Path, prefix: str) -> list[dict[str, Any]]:
    out = []
    for p in sorted((run_dir / "events").glob(f"{prefix}*.jsonl")):
        out += [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    return out


def _first_new_step(run_dir: Path, attempt: int, ranks: int) -> float:
    firsts: dict[int, float] = {}
    for e in _events(run_dir, "rank-"):
        if e["type"] == "step_completed" and e["attempt"] == attempt:
            firsts[e["rank"]] = min(firsts.get(e["rank"], e["time"]), e["time"])
    if len(firsts) < ranks:
        raise RuntimeError(f"{run_dir}: attempt {attempt} completed no step on every rank")
    return max(firsts.values())


def _fault_time(run_dir: Path) -> float:
    return min(e["time"] for e in _events(run_dir, "rank-") if e["type"] == "fault_injected")


def _common(args: argparse.Namespace, run_dir: Path, script: Path = GPT) -> list[str]:
    return [str(script), "--steps", str(args.steps), "--ckpt-every", str(args.ckpt_every), "--seed", "1",
            "--ckpt-dir", str(run_dir / "checkpoints"), *MODEL]


def _supervised(args: argparse.Namespace, run_dir: Path, spec: str, options: list[str],
                script: Path, spares: int = 0) -> dict[str, float]:
    """One `trainguard run` with fault ``spec``; the common measurements plus the in-process record."""
    subprocess.run([sys.executable, "-m", "trainguard", "run", "--nproc-per-node", str(args.ranks),
                    "--run-dir", str(run_dir), "--max-restarts", "1", "--inject", spec, *options,
                    *(["--warm-spares", str(spares)] if spares else []), "--", *_common(args, run_dir, script)],
                   check=True, capture_output=True, timeout=600, env={**os.environ, "TEST_SPARES_READY": str(spares)})
    agent = _events(run_dir, "agent-")
    failure = next(e for e in agent if e["type"] == "failure_detected")
    first = _first_new_step(run_dir, 1, args.ranks)
    out = {"fault_to_first_new_step_seconds": first - _fault_time(run_dir),
           "detection_to_first_new_step_seconds": first - failure["time"],
           "detection_latency_seconds": failure["detection_latency_seconds"]}
    recovery = [e for e in agent if e["type"] == "inprocess_recovery"]
    if recovery:
        out["recovery_seconds"] = recovery[0]["seconds"]
        out["warm_spares_used"] = recovery[0].get("warm_spares_used", 0)
        out["recovered_in_process"] = recovery[0]["status"] == "recovered"
    return out


def trainguard_run(args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    return _supervised(args, run_dir, f"crash@step={args.crash_step},rank=1", [], GPT)


# Warm spares only start without the fork server (docs/decisions.md N16): the rows that measure them say so.
NO_FORKS = "--no-fork-server"


def inprocess_run(args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    return _supervised(args, run_dir, f"crash@step={args.crash_step},rank=1", ["--in-process", NO_FORKS],
                       AFTER_SPARES, 1)


def inprocess_forked_run(args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    return _supervised(args, run_dir, f"crash@step={args.crash_step},rank=1", ["--in-process"], GPT_INPROCESS)


def warm_restart_run(args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    return _supervised(args, run_dir, f"crash@step={args.crash_step},rank=1",
                       ["--in-process", "--fresh-processes", NO_FORKS], AFTER_SPARES, args.ranks)


def inprocess_cold_run(args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    return _supervised(args, run_dir, f"crash@step={args.crash_step},rank=1",
                       ["--in-process", NO_FORKS, "--warm-spares", "0"], GPT_INPROCESS)


def hang_run(args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    return _supervised(args, run_dir, f"hang@step={args.crash_step},rank=1", [], GPT)


def hang_inprocess_run(args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    return _supervised(args, run_dir, f"hang@step={args.crash_step},rank=1", ["--in-process", NO_FORKS],
                       AFTER_SPARES, 1)


def torchrun_run(args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1", TRAINGUARD_RUN_DIR=str(run_dir),
               TRAINGUARD_CHAOS=f"crash@step={args.crash_step},rank=1")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks),
                    "--max-restarts", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
                    *_common(args, run_dir)], env=env, check=True, capture_output=True, timeout=600)
    first = _first_new_step(run_dir, 1, args.ranks)
    return {"fault_to_first_new_step_seconds": first - _fault_time(run_dir)}


def _crash_rank(args: argparse.Namespace) -> int:
    return 1 if args.ranks > 1 else 0


def _plain_args(args: argparse.Namespace, run_dir: Path) -> list[str]:
    crash = args.unmodified_crash_step
    return [str(PLAIN), "--steps", str(crash + 20), "--ckpt-dir", str(run_dir / "ck"), "--ckpt-every", "5",
            "--step-seconds", "0.05", "--crash-rank", str(_crash_rank(args)), "--crash-step", str(crash),
            "--step-log", str(run_dir / "steps")]


def _plain_gap(run_dir: Path, args: argparse.Namespace, launched: float) -> dict[str, float]:
    """Fault (the crash rank's crash step ended: it kills itself right after logging it) -> the first step every
    rank completed after the restart; and launch -> the first step every rank completed (the start-up's cost),
    from the script's own step logs."""
    lines = [json.loads(x) for p in run_dir.glob("steps.*") for x in p.read_text().splitlines() if x.strip()]
    fault = min(x["time"] for x in lines if x["restart"] == 0 and x["rank"] == _crash_rank(args)
                and x["step"] == args.unmodified_crash_step)
    firsts: dict[int, dict[int, float]] = {0: {}, 1: {}}
    for x in lines:
        if x["restart"] in firsts:
            mine = firsts[x["restart"]]
            mine[x["rank"]] = min(mine.get(x["rank"], x["time"]), x["time"])
    if len(firsts[1]) < args.ranks:
        raise RuntimeError(f"{run_dir}: not every rank stepped after the restart")
    return {"fault_to_first_new_step_seconds": max(firsts[1].values()) - fault,
            "launch_to_first_step_seconds": max(firsts[0].values()) - launched}


def unmodified_run(args: argparse.Namespace, run_dir: Path, options: tuple[str, ...] = ()) -> dict[str, float]:
    run_dir.mkdir(parents=True)
    launched = time.time()
    subprocess.run([sys.executable, "-m", "trainguard", "run", "--nproc-per-node", str(args.ranks),
                    "--run-dir", str(run_dir / "run"), "--max-restarts", "1", *options, "--",
                    *_plain_args(args, run_dir)], check=True, capture_output=True, timeout=900)
    started = [e for e in _events(run_dir / "run", "agent-") if e["type"] == "attempt_started"]
    return {**_plain_gap(run_dir, args, launched),
            "warm_starts": sum(e.get("warm_starts", 0) for e in started if e["attempt"] == 1)}


def unmodified_torchrun_run(args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    run_dir.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1")
    launched = time.time()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.ranks),
                    "--max-restarts", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
                    *_plain_args(args, run_dir)], env=env, check=True, capture_output=True, timeout=900)
    return _plain_gap(run_dir, args, launched)


def unmodified_cold_run(args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    return unmodified_run(args, run_dir, ("--no-fork-server", "--warm-spares", "0"))


def unmodified_spares_at_launch_run(args: argparse.Namespace, run_dir: Path) -> dict[str, float]:
    """A count asked for: the pool starts with the job whatever the node's CPUs."""
    return unmodified_run(args, run_dir, ("--no-fork-server", "--warm-spares", str(args.ranks)))


UNMODIFIED: dict[str, Callable[[argparse.Namespace, Path], dict[str, float]]] = {
    "unmodified_tg": unmodified_run, "unmodified_bare": unmodified_torchrun_run,
    "unmodified_tg_cold": unmodified_cold_run, "unmodified_tg_spares_at_launch": unmodified_spares_at_launch_run,
}

RUNNERS: dict[str, Callable[[argparse.Namespace, Path], dict[str, float]]] = {
    "tg": trainguard_run, "bare": torchrun_run, "inprocess": inprocess_run, "inprocess_forked": inprocess_forked_run,
    "inprocess_cold": inprocess_cold_run,
    "warm_restart": warm_restart_run, "hang": hang_run, "hang_inprocess": hang_inprocess_run,
}


def _med(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return round(statistics.median(values), 3) if values else None


def _section(rows: list[dict[str, Any]], bare_fault: float, goal_ratio: float | None) -> dict[str, Any]:
    fault = _med(rows, "fault_to_first_new_step_seconds")
    out: dict[str, Any] = {
        "fault_to_first_new_step_seconds": fault,
        "detection_to_first_new_step_seconds": _med(rows, "detection_to_first_new_step_seconds"),
        "detection_latency_seconds": _med(rows, "detection_latency_seconds"),
        "recovery_seconds": _med(rows, "recovery_seconds"),
        "launch_to_first_step_seconds": _med(rows, "launch_to_first_step_seconds"),
        "ratio_over_torchrun": round(fault / bare_fault, 3) if fault is not None else None,
        "runs": rows,
    }
    if goal_ratio is not None and fault is not None:
        out["goal_ratio"] = goal_ratio
        out["goal_met"] = fault <= goal_ratio * bare_fault
    return out


def _multi_node(reps: int) -> dict[str, Any]:
    """The multi-node section: node death -> first step on the new set of nodes (c10d, etcd), next to the
    single-node restart, measured by the sibling script in its own processes."""
    script = Path(__file__).with_name("restart_nodes.py")
    done = subprocess.run([sys.executable, str(script), "--reps", str(reps)], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]}
    return dict(json.loads(done.stdout))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--crash-step", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--unmodified-crash-step", type=int, default=500,
                   help="the plain DDP script's crash step (0.05 s steps: about 25 s of training)")
    p.add_argument("--only-unmodified", action="store_true", help="run the unmodified section only")
    p.add_argument("--multi-node", action="store_true",
                   help="also run benchmarks/restart_nodes.py (node death with 3 agents, c10d and etcd) and include "
                        "its JSON as 'multi_node'")
    args = p.parse_args()
    runners = UNMODIFIED if args.only_unmodified else {**UNMODIFIED, **RUNNERS}
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in runners}
    with tempfile.TemporaryDirectory() as d:
        names = list(runners)
        for i in range(args.reps):
            for which in (names if i % 2 == 0 else names[::-1]):
                rows[which].append(runners[which](args, Path(d) / f"{which}-{i}"))
    plain_bare = _med(rows["unmodified_bare"], "fault_to_first_new_step_seconds")
    assert plain_bare is not None
    unmodified = {"trainguard_defaults": _section(rows["unmodified_tg"], plain_bare, UNMODIFIED_GOAL_RATIO),
                  "trainguard_warm_spares_0": _section(rows["unmodified_tg_cold"], plain_bare, None),
                  "trainguard_spares_at_launch": _section(rows["unmodified_tg_spares_at_launch"], plain_bare, None),
                  "torchrun_max_restarts": {"fault_to_first_new_step_seconds": plain_bare,
                                            "launch_to_first_step_seconds": _med(rows["unmodified_bare"],
                                                                                 "launch_to_first_step_seconds"),
                                            "runs": rows["unmodified_bare"]}}
    if args.only_unmodified:
        print(json.dumps({"benchmark": "restart latency of an unmodified DDP script after a rank crash (SIGKILL)",
                          "ranks": args.ranks, "reps": args.reps, "unmodified": unmodified}, indent=2))
        return 0

    tg_fault = _med(rows["tg"], "fault_to_first_new_step_seconds")
    bare_fault = _med(rows["bare"], "fault_to_first_new_step_seconds")
    assert tg_fault is not None and bare_fault is not None
    hang = _section(rows["hang"], bare_fault, None)
    hang_inprocess = _section(rows["hang_inprocess"], bare_fault, None)
    for section in (hang, hang_inprocess):
        after = section["detection_to_first_new_step_seconds"]
        section["goal_detection_to_first_new_step_seconds"] = HANG_GOAL_SECONDS
        section["goal_met"] = after is not None and after <= HANG_GOAL_SECONDS
    print(json.dumps({
        "benchmark": "restart latency after a rank crash (SIGKILL) and after a hang",
        "ranks": args.ranks, "reps": args.reps, "crash_step": args.crash_step,
        "unmodified": unmodified,
        "trainguard": {
            "fault_to_first_new_step_seconds": tg_fault,
            "detection_to_first_new_step_seconds": _med(rows["tg"], "detection_to_first_new_step_seconds"),
            "detection_latency_seconds": _med(rows["tg"], "detection_latency_seconds"),
            "runs": rows["tg"],
        },
        "torchrun_max_restarts": {"fault_to_first_new_step_seconds": bare_fault, "runs": rows["bare"]},
        "ratio_trainguard_over_torchrun": round(tg_fault / bare_fault, 3),
        "inprocess": _section(rows["inprocess"], bare_fault, INPROCESS_GOAL_RATIO),
        "inprocess_forked": _section(rows["inprocess_forked"], bare_fault, INPROCESS_GOAL_RATIO),
        "inprocess_cold": _section(rows["inprocess_cold"], bare_fault, None),
        "warm_restart": _section(rows["warm_restart"], bare_fault, WARM_GOAL_RATIO),
        "hang": hang,
        "hang_inprocess": hang_inprocess,
        **({"multi_node": _multi_node(args.reps)} if args.multi_node else {}),
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
