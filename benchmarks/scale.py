"""The control plane as the job grows: N hosts made on this machine (network namespaces on a bridge,
tests/e2e/_netns.py), one agent and 1 rank of the tiny GPT example each, faults one after another in one job.

Per N (default 4, 8, 16, 32) one job runs with its c10d rendezvous store on a host of its own (a bare TCPStore
server, so the bytes through that host's link are the control plane's alone), spares off (memory: see
``per_host_rss_mb``), product defaults for every timeout. Faults, each once training has gone on after the last:

* ``crash``: SIGKILL of host1's rank;
* ``crash-slow-host``: the same while the last host has 10% of one core (a host late to the restart's rendezvous);
* ``host-death``: every process of the last host SIGKILLed at once;
* ``agent-kill``: the agent of the last surviving host SIGKILLed;
* ``partition``: the link of the next host cut;
* ``store-lost``: the store's host dies (the job is expected to end: say how long it takes and how).

Per fault, from the run's own events: fault -> detection (first ``failure_detected``), -> rendezvous complete (the
last surviving agent's ``attempt_started``), -> first new step; whether every agent numbered the new attempt
the same; bytes and packets through the store host's link from the fault to the first new step; evidence bytes
written under the run folder meanwhile. Per N: each agent's CPU per second at rest, the store link's bytes per
second at rest, memory per host. Then each
figure is fitted against N (least squares line, and the log-log slope: above 1.2 grows faster than linearly) and
projected to 2,048 and 12,500 hosts (docs/operations.md, "The control plane at scale").

    sudo .venv/bin/python benchmarks/scale.py [--hosts 4,8,16,32] [--faults crash,...] [--out FILE]

Needs root (namespaces, cgroups), iproute2 and tc. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.scale_fit import fit_and_project  # noqa: E402
from tests.e2e._netns import Host, HostNet  # noqa: E402

GPT = ROOT / "src" / "trainguard" / "examples" / "train_gpt.py"
MODEL = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "16", "--batch", "4", "--vocab", "64"]
STORE_PORT = 29400
WAIT_SECONDS = 420.0
REST_SECONDS = 10.0
"""The window at rest over which each agent's CPU and the store link's bytes are measured."""
CKPT_EVERY = 5
FAULTS = ("crash", "crash-slow-host", "host-death", "agent-kill", "partition", "store-lost")


class EventTail:
    """New records of every event file of a run, read incrementally (files appear as ranks start)."""

    def __init__(self, run_dir: Path) -> None:
        self.folder = run_dir / "events"
        self.offsets: dict[Path, int] = {}
        self.records: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        for path in sorted(self.folder.glob("*.jsonl")) if self.folder.is_dir() else []:
            with path.open("rb") as fh:
                fh.seek(self.offsets.get(path, 0))
                data = fh.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            for line in data[:end].splitlines():
                with contextlib.suppress(ValueError):
                    self.records.append(json.loads(line))
        return self.records


def _store_command() -> list[str]:
    code = ("import time\nfrom torch.distributed import TCPStore\n"
            f"s = TCPStore('0.0.0.0', {STORE_PORT}, is_master=True, wait_for_workers=False)\n"
            "print('store up', flush=True)\nwhile True: time.sleep(60)\n")
    return [sys.executable, "-c", code]


def _agent_command(net: HostNet, host: Host, store: Host, run_dir: Path, n: int) -> list[str]:
    return [sys.executable, "-m", "trainguard", "run", "--nnodes", f"{max(1, n - 3)}:{n}", "--nproc-per-node", "1",
            "--rdzv-endpoint", f"{store.address}:{STORE_PORT}", "--rdzv-id", "scale", "--node-id", host.name,
            "--local-addr", host.address, "--run-dir", str(run_dir), "--warm-spares", "0", "--quiet",
            "--max-restarts", str(len(FAULTS)),  # one job takes every fault: the default budget (3) ends it early
            "--", str(GPT), "--steps", "1000000", "--ckpt-every", str(CKPT_EVERY), *MODEL]


class Job:
    """One job of ``n`` hosts: its agents, the store host, the event tail."""

    def __init__(self, net: HostNet, n: int, folder: Path) -> None:
        self.net, self.n, self.folder = net, n, folder
        self.run_dir = folder / "run"
        self.store = net["store"]
        self.tail = EventTail(self.run_dir)
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.alive = [h for h in net.hosts if h.name != "store"]
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "PYTHONPATH": str(ROOT / "src")}
        self.store_proc = subprocess.Popen(net.command(self.store, _store_command()), env=env,
                                           stdout=(folder / "store.log").open("wb"), stderr=subprocess.STDOUT)
        for host in self.alive:
            self.agents[host.name] = subprocess.Popen(
                net.command(host, _agent_command(net, host, self.store, self.run_dir, n)), env=env,
                stdout=(folder / f"{host.name}.log").open("wb"), stderr=subprocess.STDOUT)

    def steps_of(self, attempt_after: float) -> dict[str, int]:
        """Each host's highest step completed after ``attempt_after``."""
        out: dict[str, int] = {}
        for r in self.tail.poll():
            if r["type"] == "step_completed" and r["time"] > attempt_after:
                out[r["host"]] = max(out.get(r["host"], 0), int(r["step"]))
        return out

    def wait_steady(self, since: float, steps: int = 3) -> bool:
        """Every host still in the job completed ``steps`` steps after ``since``, one of them past the checkpoint
        after the highest step before ``since``: the job made new progress. Faults closer together than that are a
        crash loop to the job (its no-progress rule ends it after three such attempts), not the faults measured."""
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            done = [r for r in self.tail.poll() if r["type"] == "step_completed"]
            before = max((int(r["step"]) for r in done if r["time"] <= since), default=-CKPT_EVERY)
            counts: dict[str, int] = {}
            highest: dict[str, int] = {}
            for r in done:
                if r["time"] > since:
                    counts[r["host"]] = counts.get(r["host"], 0) + 1
                    highest[r["host"]] = max(highest.get(r["host"], 0), int(r["step"]))
            if all(counts.get(h.name, 0) >= steps and highest.get(h.name, 0) > before + CKPT_EVERY
                   for h in self.alive):
                return True
            time.sleep(0.5)
        return False

    def rank_pid(self, host: Host) -> int | None:
        """The host's rank: the agent's child running the script (not the agent, whose command names it too)."""
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.agents[host.name].pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    argv = child.cmdline()
                    if str(GPT) in argv and "trainguard" not in argv[1:3]:
                        return int(child.pid)
        return None

    def evidence_bytes(self) -> int:
        total = 0
        for sub in ("diagnostics", "nodes", "logs"):
            for path in (self.run_dir / sub).rglob("*"):
                with contextlib.suppress(OSError):
                    if path.is_file():
                        total += path.stat().st_size
        return total

    def agent_cpu_per_second(self, window: float = 10.0) -> float:
        procs = [psutil.Process(p.pid) for p in self.agents.values() if p.poll() is None]
        before = [sum(p.cpu_times()[:2]) for p in procs]
        time.sleep(window)
        after = [sum(p.cpu_times()[:2]) for p in procs]
        return statistics.median((a - b) / window for a, b in zip(after, before, strict=True))

    def rss_per_host_mb(self) -> float:
        sizes = []
        for host in self.alive:
            rss = 0
            for pid in self.net.pids(host):
                with contextlib.suppress(psutil.Error):
                    rss += psutil.Process(pid).memory_info().rss
            sizes.append(rss / 2**20)
        return statistics.median(sizes)

    def stop(self) -> None:
        for proc in [*self.agents.values(), self.store_proc]:
            if proc.poll() is None:
                proc.kill()
        for host in self.net.hosts:
            self.net.kill(host)


def _measure(job: Job, fault: str, t_fault: float, survivors: list[Host]) -> dict[str, Any]:
    """Wait for the job's answer to a fault fired at ``t_fault``."""
    names = {h.name for h in survivors}
    deadline = time.monotonic() + WAIT_SECONDS
    out: dict[str, Any] = {"fault": fault}
    while time.monotonic() < deadline:
        records = job.tail.poll()
        detected = [r["time"] for r in records if r["type"] == "failure_detected" and r["time"] >= t_fault]
        started = {r["host"]: r for r in records if r["type"] == "attempt_started" and r["time"] >= t_fault
                   and r["host"] in names}
        if detected and set(started) >= names:
            complete = max(r["time"] for r in started.values())
            steps = [r["time"] for r in records if r["type"] == "step_completed" and r["time"] > complete]
            if steps:
                out.update(detection_seconds=min(detected) - t_fault, rendezvous_seconds=complete - t_fault,
                           first_step_seconds=min(steps) - t_fault,
                           attempts=sorted({int(r["attempt"]) for r in started.values()}))
                out["attempts_agree"] = len(out["attempts"]) == 1
                return out
        time.sleep(0.3)
    out["timed_out_seconds"] = WAIT_SECONDS
    return out


def _fire(job: Job, fault: str) -> tuple[float, list[Host]]:
    """Fire ``fault``; the time it fired and the hosts expected to go on."""
    net = job.net
    if fault in ("crash", "crash-slow-host"):
        if fault == "crash-slow-host":
            net.starve_cpu(job.alive[-1], percent=10)
        pid = job.rank_pid(job.alive[1])
        if pid is None:
            raise RuntimeError(f"no rank process found on {job.alive[1].name}")
        t = time.time()
        os.kill(pid, signal.SIGKILL)
        return t, list(job.alive)
    victim = job.alive.pop()
    t = time.time()
    if fault == "host-death":
        net.kill(victim)
    elif fault == "agent-kill":
        os.kill(job.agents[victim.name].pid, signal.SIGKILL)
    elif fault == "partition":
        net.set_link(victim, up=False)
    return t, list(job.alive)


def run_n(n: int, folder: Path, faults: tuple[str, ...] = FAULTS[:-1]) -> dict[str, Any]:
    result: dict[str, Any] = {"hosts": n, "faults": []}
    with HostNet(n, extra=["store"]) as net:
        job = Job(net, n, folder)
        try:
            started = time.time()
            if not job.wait_steady(0.0, steps=5):
                result["error"] = "the job never trained on every host"
                return result
            result["start_to_steady_seconds"] = time.time() - started
            rest = net.link_counters(job.store)
            result["agent_cpu_per_second_at_rest"] = job.agent_cpu_per_second(REST_SECONDS)
            after_rest = net.link_counters(job.store)
            # between restarts: each agent's reads of the wait-list count (trainguard's store link) and torch's
            # keep-alives are all that crosses the store's link
            result["store_bytes_per_second_at_rest"] = (after_rest["rx_bytes"] + after_rest["tx_bytes"]
                                                        - rest["rx_bytes"] - rest["tx_bytes"]) / REST_SECONDS
            result["per_host_rss_mb"] = job.rss_per_host_mb()
            for fault in faults:
                counters, evidence = net.link_counters(job.store), job.evidence_bytes()
                t_fault, survivors = _fire(job, fault)
                m = _measure(job, fault, t_fault, survivors)
                after = net.link_counters(job.store)
                m["store_bytes"] = after["rx_bytes"] + after["tx_bytes"] - counters["rx_bytes"] - counters["tx_bytes"]
                m["store_packets"] = (after["rx_packets"] + after["tx_packets"] - counters["rx_packets"]
                                      - counters["tx_packets"])
                m["evidence_bytes"] = job.evidence_bytes() - evidence
                result["faults"].append(m)
                if fault == "crash-slow-host":
                    net.starve_cpu(job.alive[-1], percent=100)
                if "timed_out_seconds" in m or not job.wait_steady(time.time(), steps=3):
                    result["error"] = f"the job did not train on after {fault}"
                    return result
            t = time.time()
            net.kill(job.store)
            codes = {name: p.wait(timeout=WAIT_SECONDS) if p.poll() is None else p.returncode
                     for name, p in job.agents.items() if name in {h.name for h in job.alive}}
            result["faults"].append({"fault": "store-lost", "all_agents_exited_seconds": time.time() - t,
                                     "exit_codes": sorted(set(codes.values()))})
        except subprocess.TimeoutExpired:
            result["faults"].append({"fault": "store-lost", "timed_out_seconds": WAIT_SECONDS})
        finally:
            job.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="4,8,16,32", help="comma-separated host counts")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("--keep", type=Path, help="keep every run folder and log under this folder")
    parser.add_argument("--faults", default=",".join(FAULTS[:-1]),
                        help="comma-separated faults to fire (the store's loss always ends the job)")
    args = parser.parse_args()
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = sorted(set(faults) - set(FAULTS[:-1]))
    if unknown:
        parser.error(f"unknown faults: {', '.join(unknown)}")
    counts = [int(x) for x in args.hosts.split(",")]
    load = os.getloadavg()[0]
    runs = []
    with tempfile.TemporaryDirectory(prefix="tg-scale-") as scratch:
        tmp = args.keep or Path(scratch)
        for n in counts:
            folder = Path(tmp) / f"n{n}"
            folder.mkdir(parents=True)
            runs.append(run_n(n, folder, faults))
            print(json.dumps({"progress": runs[-1]}), file=sys.stderr, flush=True)
    report = {"benchmark": "scale", "load_at_start": load, "load_at_end": os.getloadavg()[0],
              "cpu_count": os.cpu_count(), "runs": runs, "fits": fit_and_project(runs, targets=(2048, 12500))}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
