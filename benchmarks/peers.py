"""trainguard beside its peers: bare torchrun, NVRx's ``ft_launcher`` and torchft, same script, same faults.

Every system trains tests/e2e/unmodified/plain_ddp.py (2 ranks, gloo, 0.05 s steps) or a copy of it that a peer
needs (benchmarks/peers_scripts/), and every figure comes from the script's own step log, never from a
launcher's account. Systems (``--only``):

* ``torchrun``: ``torch.distributed.run --max-restarts 1``, the unmodified script;
* ``nvrx``: nvidia-resiliency-ext's ``ft_launcher --max-restarts 1``, the unmodified script;
* ``nvrx_heartbeats``: ``ft_launcher`` with the script's copy that sends NVRx heartbeats and keeps the computed
  timeouts in its checkpoint (NVRx's documented usage; its example's config: no preset timeouts);
* ``torchft``: the script's copy rewritten for torchft, 2 replica groups of one process each, each under its
  own ``torchrun --nproc-per-node 1 --max-restarts 1``, beside a ``torchft_lighthouse``;
* ``trainguard``: ``trainguard run --max-restarts 1`` with its defaults, the unmodified script.

Faults (``--faults``), each at the same step for every system:

* ``crash_early`` / ``crash_mid``: rank 1 (replica group 1 for torchft) SIGKILLs itself right after logging
  step 2 / ``--mid-step`` of its first launch; measured: fault -> the first step every rank has completed
  after it (a restarted process's step; for torchft the survivor's own steps count, and its stall is given);
* ``hang``: once rank 1 has logged ``--hang-step``, the benchmark SIGSTOPs its process at a random point of a
  step; measured: fault -> detection, which is trainguard's ``failure_detected`` event, the first hang line
  of NVRx's rank monitors, torchft's survivor's first step in a quorum without group 1, and for torchrun
  the stopped process being killed; each run waits at most ``--hang-cap`` seconds. Culprit: trainguard's
  failure and diagnosis name rank 1 alone; NVRx's first hang line is rank 1's; torchrun and torchft name no
  rank. Also, for every system, fault -> the stopped process killed (polled at 10 Hz; none when nobody
  kills it).

Repetitions are interleaved (each rep runs every fault on every system, the order reversed every other rep).
Peers are optional installs (docs/peers.md); run it with the interpreter that has them:

    /work/peers-venv/bin/python benchmarks/peers.py [--reps 3] [--only trainguard,torchft] [--faults hang]

Prints one JSON object and writes it to ``--out``; by default a run of every system and fault writes
benchmarks/results/peers.json, and a partial one (``--only``, ``--faults``) writes nothing, so that it never
replaces the full table there.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.hang import _events, _failure, culprit_right  # noqa: E402
from benchmarks.peers_summary import crash_gap, nvrx_detections, spread, table  # noqa: E402

PLAIN = ROOT / "tests" / "e2e" / "unmodified" / "plain_ddp.py"
NVRX_SCRIPT = ROOT / "benchmarks" / "peers_scripts" / "plain_ddp_nvrx_heartbeats.py"
TORCHFT_SCRIPT = ROOT / "benchmarks" / "peers_scripts" / "plain_ddp_torchft.py"
REPLICA_SCRIPT = ROOT / "benchmarks" / "peers_scripts" / "plain_ddp_replica.py"
BIN = Path(sys.executable).parent
SYSTEMS = ("torchrun", "nvrx", "nvrx_heartbeats", "torchft", "trainguard", "trainguard_heal")
FAULTS = ("crash_early", "crash_mid", "hang")
LABELS = {"torchrun": "torchrun {torch}", "nvrx": "nvidia-resiliency-ext {nvrx} `ft_launcher`, unmodified script",
          "nvrx_heartbeats": "nvidia-resiliency-ext {nvrx}, heartbeat client in the script",
          "torchft": "torchft {torchft} (script rewritten for it, 2 replica groups)",
          "trainguard": "trainguard {trainguard} `run` defaults, unmodified script",
          "trainguard_heal": "trainguard {trainguard} `run --in-process`, script rewritten for `Replica` (live heal)"}
# NVRx's heartbeat example config: no preset timeouts, so the script's computed ones are the only ones
NVRX_CFG = "fault_tolerance:\n  initial_rank_heartbeat_timeout: null\n  rank_heartbeat_timeout: null\n"


@dataclass
class Job:
    """The processes of one run and where their output goes."""

    run_dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    services: list[subprocess.Popen[bytes]] = field(default_factory=list)
    """Processes that never end by themselves (torchft's lighthouse)."""
    stopped: int | None = None
    """The SIGSTOPped worker, killed at the end whatever the system did."""

    def start(self, name: str, cmd: list[str], env: dict[str, str], service: bool = False) -> None:
        log = (self.run_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.run_dir,
                                start_new_session=True)
        (self.services if service else self.procs).append(proc)

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.run_dir.glob("*.log")))

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for p in self.procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))

    def end(self) -> None:
        if self.stopped is not None:
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(self.stopped, sig)
                except OSError:
                    break
        for p in [*self.procs, *self.services]:  # launchers first, the lighthouse last
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in [*self.procs, *self.services]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINGUARD_", "TORCHELASTIC_"))}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _script_args(job: Job, steps: int, crash_step: int, script: Path) -> list[str]:
    out = [str(script), "--steps", str(steps), "--step-log", str(job.run_dir / "steps")]
    if script != TORCHFT_SCRIPT:  # torchft's groups heal from a live peer, not from storage
        out += ["--ckpt-dir", str(job.run_dir / "ck"), "--ckpt-every", "5"]
    if crash_step:
        out += ["--crash-rank", "1", "--crash-step", str(crash_step)]
    return out


def launch(system: str, job: Job, steps: int, crash_step: int) -> None:
    """Start ``system`` on the plain script (or the copy it needs) in ``job``."""
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]
    # bare torchelastic restarts gloo workers only without the shared rendezvous store (see restart.py)
    elastic = _env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    if system == "torchrun":
        job.start("torchrun", [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               "--max-restarts", "1", *rdzv, *_script_args(job, steps, crash_step, PLAIN)], elastic)
    elif system in ("nvrx", "nvrx_heartbeats"):
        script, cfg = PLAIN, []
        if system == "nvrx_heartbeats":
            (job.run_dir / "ft.yaml").write_text(NVRX_CFG)
            script, cfg = NVRX_SCRIPT, ["--ft-cfg-path", str(job.run_dir / "ft.yaml")]
        job.start("ft_launcher", [str(BIN / "ft_launcher"), "--nproc-per-node", "2", "--max-restarts", "1", *rdzv,
                                  *cfg, *_script_args(job, steps, crash_step, script)], elastic)
    elif system == "torchft":
        port = _free_port()
        job.start("lighthouse", [str(BIN / "torchft_lighthouse"), "--min_replicas", "1", "--quorum_tick_ms", "100",
                                 "--join_timeout_ms", "10000", "--bind", f"127.0.0.1:{port}"], _env(), service=True)
        for group in (0, 1):
            env = _env(TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{port}", REPLICA_GROUP_ID=str(group),
                       NUM_REPLICA_GROUPS="2")
            job.start(f"group{group}", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                        "--nproc-per-node", "1", "--max-restarts", "1",
                                        *_script_args(job, steps, crash_step, TORCHFT_SCRIPT)], env)
    elif system == "trainguard_heal":
        job.start("trainguard", [sys.executable, "-m", "trainguard", "run", "--nproc-per-node", "2", "--run-dir",
                                 str(job.run_dir / "run"), "--max-restarts", "1", "--in-process", "--",
                                 *_script_args(job, steps, crash_step, REPLICA_SCRIPT)], _env())
    elif system == "trainguard":
        job.start("trainguard", [sys.executable, "-m", "trainguard", "run", "--nproc-per-node", "2", "--run-dir",
                                 str(job.run_dir / "run"), "--max-restarts", "1", "--",
                                 *_script_args(job, steps, crash_step, PLAIN)], _env())
    else:
        raise ValueError(system)


def _step_lines(job: Job) -> list[dict[str, Any]]:
    return [json.loads(x) for p in sorted(job.run_dir.glob("steps.*")) for x in p.read_text().splitlines()
            if x.strip()]


def crash_run(system: str, job: Job, step: int) -> dict[str, Any]:
    # 100 steps (5 s) after the fault: a replacement has joined the job before the survivors finish it
    launch(system, job, step + 100, step)
    job.wait(600)
    # torchft's survivor and trainguard_heal's keep their processes through the fault
    gap = crash_gap(_step_lines(job), 1, step, (0,) if system in ("torchft", "trainguard_heal") else ())
    out: dict[str, Any] = {"first_new_step_seconds": round(gap.first_new_step_seconds, 3),
                           "exit_codes": [p.returncode for p in job.procs]}
    if gap.survivor_stall_seconds is not None:
        out["survivor_stall_seconds"] = round(gap.survivor_stall_seconds, 3)
    if system.startswith("trainguard"):
        started = [e for e in _events(job.run_dir / "run", "agent-") if e["type"] == "attempt_started"]
        out["warm_starts"] = sum(e.get("warm_starts", 0) for e in started if e["attempt"] == 1)
    return out


def _worker_pid(job: Job, system: str) -> int | None:
    """Rank 1's training process (replica group 1's for torchft): the oldest with that rank and our step log."""
    want = {b"REPLICA_GROUP_ID=1", b"RANK=0"} if system == "torchft" else {b"RANK=1"}
    marker = str(job.run_dir / "steps").encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = set((entry / "environ").read_bytes().split(b"\0"))
            if marker in (entry / "cmdline").read_bytes() and want <= env:
                found.append((int((entry / "stat").read_text().rsplit(")", 1)[1].split()[19]), int(entry.name)))
        except (OSError, IndexError, ValueError):
            continue
    return min(found)[1] if found else None


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _detection(system: str, job: Job, fault: float) -> tuple[float | None, bool | None]:
    """(when the system detected the hang, whether it named rank 1 first); (None, None) while it has not."""
    if system.startswith("trainguard"):
        failure = _failure(job.run_dir / "run")
        return (failure["time"], culprit_right(job.run_dir / "run", failure, 1)) if failure else (None, None)
    if system.startswith("nvrx"):
        found = [d for d in nvrx_detections(job.log_text()) if d[0] >= fault - 0.001]
        return (found[0][0], found[0][1] == 1) if found else (None, None)
    if system == "torchft":  # the survivor's first step in a quorum without group 1 (its collective timed out)
        after = [x["time"] for x in _step_lines(job) if x["rank"] == 0 and x["time"] > fault and x["participants"] < 2]
        return (min(after), None) if after else (None, None)
    return None, None  # torchrun: only the stopped process's death below


def hang_run(system: str, job: Job, step: int, cap: float) -> dict[str, Any]:
    launch(system, job, 100000, 0)
    deadline = time.monotonic() + 300
    while not any(x["rank"] == 1 and x["step"] >= step for x in _step_lines(job)):
        if time.monotonic() > deadline or any(p.poll() is not None for p in job.procs):
            raise RuntimeError(f"rank 1 never reached step {step}")
        time.sleep(0.05)
    pid = _worker_pid(job, system)
    if pid is None:
        raise RuntimeError("rank 1's process not found")
    time.sleep(random.uniform(0.0, 0.06))  # anywhere in a step (0.05 s of sleep plus compute)
    fault = time.time()
    os.kill(pid, signal.SIGSTOP)
    job.stopped = pid
    detected: float | None = None
    right: bool | None = None
    killed: float | None = None
    end = time.monotonic() + cap
    while time.monotonic() < end:
        if detected is None:
            detected, right = _detection(system, job, fault)
            if detected is not None:
                end = min(end, time.monotonic() + 3.0)  # time for the system to kill what it detected
        if killed is None and _gone(pid):
            killed = time.time()
        if killed is not None and (detected is not None or system == "torchrun"):
            break
        time.sleep(0.1)
    if system == "torchrun" and killed is not None:
        detected = killed
    return {"detection_seconds": None if detected is None else round(detected - fault, 3),
            "culprit_right": right,
            "stopped_rank_killed_seconds": None if killed is None else round(killed - fault, 3)}


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for dist, key in (("torch", "torch"), ("torchft", "torchft"), ("nvidia-resiliency-ext", "nvrx"),
                      ("trainguard", "trainguard")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = "not installed"
    return out


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def run_one(system: str, fault: str, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    run_dir.mkdir(parents=True)
    job = Job(run_dir)
    load = os.getloadavg()[0]
    try:
        if fault == "hang":
            row = hang_run(system, job, args.hang_step, args.hang_cap)
        else:
            row = crash_run(system, job, 2 if fault == "crash_early" else args.mid_step)
    except Exception as e:  # a system that fails a run is a result, not the benchmark's end
        row = {"error": f"{type(e).__name__}: {e}"[:400], "log_tail": job.log_text()[-1500:]}
    finally:
        job.end()
    row["load_1min"] = round(load, 2)
    return row


def summarise(rows: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for system, faults in rows.items():
        out[system] = {}
        for fault, runs in faults.items():
            if fault == "hang":
                rights = [r.get("culprit_right") for r in runs]
                out[system][fault] = {
                    "detection": spread(r.get("detection_seconds") for r in runs),
                    "stopped_rank_killed": spread(r.get("stopped_rank_killed_seconds") for r in runs),
                    "culprit_right": sum(x is True for x in rights),
                    "culprit_named": sum(x is not None for x in rights)}
            else:
                out[system][fault] = {"first_new_step": spread(r.get("first_new_step_seconds") for r in runs)}
                stalls = [r["survivor_stall_seconds"] for r in runs if "survivor_stall_seconds" in r]
                if stalls:
                    out[system][fault]["survivor_stall"] = spread(stalls)
            out[system][fault]["errors"] = sum("error" in r for r in runs)
    return out


def default_out(systems: list[str], faults: list[str]) -> str:
    """Where a run writes its JSON without ``--out``: the project's peers table for a run of every system and
    fault, nowhere for a partial run (it would replace the full table with a few rows)."""
    full = set(systems) == set(SYSTEMS) and set(faults) == set(FAULTS)
    return str(ROOT / "benchmarks" / "results" / "peers.json") if full else ""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--only", default=",".join(SYSTEMS), help=f"comma-separated systems of {', '.join(SYSTEMS)}")
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated faults of {', '.join(FAULTS)}")
    p.add_argument("--mid-step", type=int, default=300, help="the mid-run crash step (0.05 s steps)")
    p.add_argument("--hang-step", type=int, default=60, help="rank 1 is stopped once it logged this step")
    p.add_argument("--hang-cap", type=float, default=30.0, help="a hang run waits at most this long, seconds")
    p.add_argument("--out", help="write the JSON here too (default: see default_out; '' to not write)")
    p.add_argument("--keep", type=Path, help="keep every run's folder under this folder (to read a wrong culprit's "
                                             "evidence afterwards); default: a temporary folder, removed")
    args = p.parse_args()
    systems = [s for s in args.only.split(",") if s]
    faults = [f for f in args.faults.split(",") if f]
    for name, bad in (("system", set(systems) - set(SYSTEMS)), ("fault", set(faults) - set(FAULTS))):
        if bad:
            p.error(f"unknown {name}: {', '.join(sorted(bad))}")
    versions = _versions()
    started, t0 = _uptime(), time.time()
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {s: {f: [] for f in faults} for s in systems}
    with tempfile.TemporaryDirectory(prefix="tg-peers-") as scratch:
        tmp = args.keep or Path(scratch)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
        for rep in range(args.reps):
            for fault in faults:
                for system in (systems if rep % 2 == 0 else systems[::-1]):
                    row = run_one(system, fault, args, Path(tmp) / f"{system}-{fault}-{rep}")
                    print(f"rep {rep} {fault} {system}: {json.dumps(row)[:300]}", file=sys.stderr, flush=True)
                    rows[system][fault].append(row)
    summary = summarise(rows)
    labels = {k: v.format(**versions) for k, v in LABELS.items()}
    doc = {"benchmark": "trainguard beside torchrun, NVRx ft_launcher and torchft: crash recovery and hang detection",
           "command": " ".join([sys.executable, *sys.argv]), "niceness": os.nice(0),
           "versions": versions, "reps": args.reps, "ranks": 2,
           "mid_step": args.mid_step, "hang_step": args.hang_step, "hang_cap_seconds": args.hang_cap,
           "uptime_start": started, "uptime_end": _uptime(), "wall_seconds": round(time.time() - t0, 1),
           "summary": summary, "table_markdown": table(summary, labels, args.hang_cap), "runs": rows}
    text = json.dumps(doc, indent=2)
    out = args.out if args.out is not None else default_out(systems, faults)
    if out:
        Path(out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
