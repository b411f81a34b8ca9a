"""Multi-node restart latency: a node dies (its agent and workers, chaos ``node-crash``) in a job of 3 agents x 2
ranks on loopback, and the other two re-form and train on; next to it, the single-node restart after a rank crash.

Sections, interleaved rep by rep, all measured from the events the run writes:

* ``single_node``: 1 agent x 2 ranks, ``crash`` of rank 1 (whole-process restart on the same node);
* ``c10d``: 3 agents x 2 ranks on a c10d rendezvous hosted by node0, ``node-crash`` of node2;
* ``etcd``: the same on an etcd-v2 rendezvous (a real etcd server started here), ``node-crash`` of node0, the
  node that started the job (with c10d that would end the job).

Per section: fault -> detection (``FaultInjected`` to ``FailureDetected``), detection -> new attempt
(``AttemptStarted`` of the next attempt: re-forming the rendezvous and starting workers), and fault -> first new
step (the first ``StepCompleted`` of the next attempt), medians over the reps. The node sections use the
product's defaults (``--node-lost-timeout`` 10 s, torch's rendezvous keep-alive 5 s x 3) unless told otherwise.

    .venv/bin/python benchmarks/restart_nodes.py [--reps 1] [--steps 12] [--fault-step 5]
        [--node-lost-timeout 10] [--keep-alive-interval 5]

Needs the ``etcd`` binary (scripts/setup installs Debian's etcd-server) for the etcd section; prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GPT = ROOT / "src" / "trainguard" / "examples" / "train_gpt.py"
MODEL = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "16", "--batch", "4", "--vocab", "64"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _events(run_dir: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted((run_dir / "events").glob("*.jsonl")):
        out += [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
    return out


def _agent(args: argparse.Namespace, run_dir: Path, node: str, nnodes: str, rdzv: list[str], inject: str,
           extra: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "trainguard", "run", "--nnodes", nnodes, "--nproc-per-node", "2", *rdzv,
           "--rdzv-id", "bench", "--node-id", node, "--run-dir", str(run_dir), "--quiet", "--inject", inject, *extra,
           "--", str(GPT), "--steps", str(args.steps), "--ckpt-every", "2", *MODEL]
    log = (run_dir.parent / f"{node}.log").open("wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def _wait_port(endpoint: str, proc: subprocess.Popen[bytes]) -> None:
    host, port = endpoint.rsplit(":", 1)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on {endpoint}")


def _measure(run_dir: Path) -> dict[str, float]:
    records = _events(run_dir)
    fault = min(r["time"] for r in records if r["type"] == "fault_injected")
    failure = min((r["time"] for r in records if r["type"] == "failure_detected"), default=float("nan"))
    nxt = min((r["time"] for r in records if r["type"] == "attempt_started" and r["attempt"] == 1),
              default=float("nan"))
    step = min((r["time"] for r in records if r["type"] == "step_completed" and r["attempt"] == 1),
               default=float("nan"))
    kinds = sorted({r["kind"] for r in records if r["type"] == "failure_detected"})
    return {"fault_to_detection_seconds": failure - fault, "detection_to_new_attempt_seconds": nxt - failure,
            "fault_to_first_new_step_seconds": step - fault, "kinds": kinds}  # type: ignore[dict-item]


def _run(args: argparse.Namespace, section: str, work: Path, etcd: str | None) -> dict[str, Any]:
    run_dir = work / "run"
    node_opts = ["--node-lost-timeout", str(args.node_lost_timeout),
                 "--rdzv-conf", f"keep_alive_interval={args.keep_alive_interval}"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if section == "single_node":
            endpoint = f"127.0.0.1:{_free_port()}"
            procs.append(_agent(args, run_dir, "node0", "1", ["--rdzv-endpoint", endpoint],
                                f"crash@step={args.fault_step},rank=1", []))
        else:
            if section == "c10d":
                endpoint = f"127.0.0.1:{_free_port()}"
                rdzv, victim = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint], "node2"
            else:
                assert etcd is not None
                rdzv, victim = ["--rdzv-backend", "etcd-v2", "--rdzv-endpoint", etcd], "node0"
            inject = f"node-crash@step={args.fault_step},node={victim}"
            for i in range(3):
                procs.append(_agent(args, run_dir, f"node{i}", "2:3", rdzv, inject, node_opts))
                if i == 0 and section == "c10d":
                    _wait_port(endpoint, procs[0])
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    out = _measure(run_dir)
    out["exit_codes"] = codes
    return out


def _etcd(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("etcd")
    if binary is None:
        raise SystemExit("restart_nodes: etcd is not installed (scripts/setup installs it)")
    client, peer = _free_port(), _free_port()
    proc = subprocess.Popen([
        binary, "--enable-v2", "--name", "b", "--data-dir", str(work / "etcd"), "--log-level", "warn",
        "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"b=http://127.0.0.1:{peer}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{client}/v2/keys/", timeout=1):
                return proc, f"127.0.0.1:{client}"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("restart_nodes: etcd did not start")


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] == r[key]]  # NaN when the event is missing
    return round(statistics.median(values), 3) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--fault-step", type=int, default=5)
    parser.add_argument("--node-lost-timeout", type=float, default=10.0)
    parser.add_argument("--keep-alive-interval", type=int, default=5)
    parser.add_argument("--sections", default="single_node,c10d,etcd")
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep the run directories in DIR")
    args = parser.parse_args()
    sections = [s for s in args.sections.split(",") if s]
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in sections}
    with tempfile.TemporaryDirectory(prefix="tg-restart-nodes-") as scratch:
        tmp = args.keep or scratch
        etcd_proc, etcd = _etcd(Path(tmp)) if "etcd" in sections else (None, None)
        try:
            for rep in range(args.reps):
                for section in sections:
                    work = Path(tmp) / f"{section}-{rep}"
                    work.mkdir()
                    rows[section].append(_run(args, section, work, etcd))
        finally:
            if etcd_proc is not None:
                etcd_proc.terminate()
                etcd_proc.wait(timeout=10)
    keys = ("fault_to_detection_seconds", "detection_to_new_attempt_seconds", "fault_to_first_new_step_seconds")
    print(json.dumps({
        "config": {"agents": 3, "ranks_per_node": 2, "steps": args.steps, "fault_step": args.fault_step,
                   "node_lost_timeout_seconds": args.node_lost_timeout,
                   "keep_alive_interval_seconds": args.keep_alive_interval, "reps": args.reps},
        "sections": {s: {**{k: _median(r, k) for k in keys}, "runs": r} for s, r in rows.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
