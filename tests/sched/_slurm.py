"""A real Slurm cluster on this machine: munged, slurmctld and N slurmd "nodes", all state in one folder.

Debian's slurm-wlm 22.05 (installed by scripts/setup). Every node runs on this host (``NodeName=n[1-N]
NodeHostname=<host> Port=[...]``, one ``slurmd -N nK`` each); munged runs on its own socket and key in the
folder (``AuthInfo=socket=...``), ports are free ones picked at start, so the cluster touches nothing outside
its folder and several can run at once. Start is bounded (`SlurmCluster.start` raises `SlurmStartError` with
the daemons' log tails); stop kills every process of the cluster (pid files first, then any process whose
environment names this cluster's ``SLURM_CONF``: job steps, their tasks, trainguard agents and workers).

All nodes share one kernel, network namespace and file system: a node's "death" is its slurmd and the
processes of its job steps killed (`SlurmCluster.kill_node`); a shared run directory is a local folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")
START_TIMEOUT_SECONDS = 40.0


def missing_programs() -> list[str]:
    """The Slurm and munge programs this machine lacks (empty: the cluster can be started)."""
    return [p for p in DAEMONS if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


class SlurmStartError(RuntimeError):
    """Slurm is installed but the cluster did not come up; the message has the daemons' log tails."""


def _free_base(count: int) -> int:
    """A port p such that p .. p+count-1 are all free on this host now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("", 0))
            base = int(s.getsockname()[1])
        if base + count >= 65000:
            continue
        ok = True
        for port in range(base, base + count):
            with socket.socket() as t:
                try:
                    t.bind(("", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise SlurmStartError("no run of free ports found")


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class SlurmCluster:
    """``nodes`` slurmd nodes ``n1..nN`` with ``cpus`` CPUs each, state under ``root``."""

    def __init__(self, root: Path, *, nodes: int = 3, cpus: int = 2) -> None:
        self.root = Path(root)
        self.names = [f"n{i}" for i in range(1, nodes + 1)]
        self.cpus = cpus
        self.host = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.log = self.root / "log"
        self.munge_dir = self.root / "munge"
        self.socket = self.munge_dir / "munge.socket"
        self.started = False

    # --- environment -------------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment pointed at the cluster (and nothing of another Slurm job)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra)
        return env

    def run(self, *argv: str, timeout: float = 30, check: bool = True,
            **extra: str) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=self.env(**extra),
                           check=False)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} -> {p.returncode}: {p.stderr.strip()} {p.stdout.strip()}")
        return p

    # --- start and stop ----------------------------------------------------------------------------

    def _write_config(self) -> None:
        base = _free_base(2 + len(self.names))
        ctld, slurmd, first = base, base + 1, base + 2
        last = first + len(self.names) - 1
        r = self.root
        nodes = f"n[1-{len(self.names)}]"
        self.conf.write_text("\n".join([
            "ClusterName=tg", f"SlurmctldHost={self.host}", "SlurmUser=root",
            f"AuthInfo=socket={self.socket}",
            f"SlurmctldPort={ctld}", f"SlurmdPort={slurmd}",
            f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool/%n",
            f"SlurmctldPidFile={r}/ctld.pid", f"SlurmdPidFile={r}/d-%n.pid",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SchedulerType=sched/backfill",
            "ReturnToService=2",
            # A dead node is noticed in seconds, not Slurm's default 5 minutes.
            "SlurmdTimeout=10", "SlurmctldTimeout=10", "MessageTimeout=5", "KillWait=5", "MinJobAge=30",
            f"SlurmctldLogFile={self.log}/ctld.log", f"SlurmdLogFile={self.log}/d-%n.log",
            f"NodeName={nodes} NodeHostname={self.host} CPUs={self.cpus} RealMemory=2000 "
            f"Port=[{first}-{last}] State=UNKNOWN",
            f"PartitionName=main Nodes={nodes} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        # cgroup/v1 with IgnoreSystemd: this version refuses CgroupPlugin=disabled.
        (r / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n")

    def _start_munge(self) -> None:
        self.munge_dir.mkdir(mode=0o711)
        key_dir = self.root / "munge-key"
        key_dir.mkdir(mode=0o700)
        key = key_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn(_program("munged"), "--force", f"--socket={self.socket}", f"--key-file={key}",
                    f"--log-file={self.munge_dir}/munged.log", f"--pid-file={self.munge_dir}/munged.pid",
                    f"--seed-file={self.munge_dir}/munged.seed")

    def _spawn(self, *argv: str) -> None:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, env=self.env(), check=False)
        if p.returncode != 0:
            raise SlurmStartError(f"{Path(argv[0]).name} did not start (exit {p.returncode}): "
                                  f"{(p.stderr or p.stdout).strip()[-800:]}\n{self.log_tails()}")

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> SlurmCluster:
        """Start everything and wait (at most ``timeout`` s) until every node is idle."""
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self._write_config()
        self.started = True
        self._start_munge()
        self._spawn(_program("slurmctld"))
        for node in self.names:
            self._spawn(_program("slurmd"), "-N", node)
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if len(states) == len(self.names) and all(s == "idle" for s in states.values()):
                return self
            time.sleep(0.5)
        raise SlurmStartError(f"nodes not idle within {timeout:g} s: {states}\n{self.log_tails()}")

    def node_states(self) -> dict[str, str]:
        p = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=10)
        if p.returncode != 0:
            return {}
        return dict(line.split(None, 1) for line in p.stdout.splitlines() if len(line.split(None, 1)) == 2)

    def log_tails(self, lines: int = 15) -> str:
        out = []
        for path in sorted([*self.log.glob("*.log"), self.munge_dir / "munged.log"]):
            with contextlib.suppress(OSError):
                out.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def _pid(self, path: Path) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text().strip())
        return None

    def _processes(self) -> list[psutil.Process]:
        """Every process of this cluster but the daemons: job steps, their tasks, what those started."""
        wanted = str(self.conf)
        out = []
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error):
                if proc.pid != os.getpid() and proc.environ().get("SLURM_CONF") == wanted:
                    out.append(proc)
        return out

    def stop(self) -> None:
        """Kill the daemons (pid files), then whatever is left of the cluster's processes, then munged."""
        if not self.started:
            return
        self.started = False
        pids = [self._pid(self.root / f"d-{n}.pid") for n in self.names] + [self._pid(self.root / "ctld.pid")]
        for pid in pids:
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(p and psutil.pid_exists(p) for p in pids):
            time.sleep(0.2)
        for pid in pids:
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for proc in self._processes():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        munged = self._pid(self.munge_dir / "munged.pid")
        if munged:
            with contextlib.suppress(ProcessLookupError):
                os.kill(munged, signal.SIGTERM)

    def slurmd_alive(self, node: str) -> bool:
        pid = self._pid(self.root / f"d-{node}.pid")
        return bool(pid) and psutil.pid_exists(pid)

    def job_fields(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict of its space-free fields (JobState, Restarts, ExcNodeList, ...);
        empty once Slurm forgot the job."""
        p = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        if p.returncode != 0:
            return {}
        return dict(t.split("=", 1) for t in p.stdout.split() if "=" in t)

    # --- a node's death and repair -----------------------------------------------------------------

    def kill_node(self, node: str, job_id: str) -> list[int]:
        """The node dies: its slurmd, the slurmstepd of its part of the job and every process of that part
        (the trainguard agent, its workers) are SIGKILLed at once. Returns the pids killed."""
        tasks = []
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error):
                env = proc.environ()
                if env.get("SLURMD_NODENAME") == node and env.get("SLURM_JOB_ID") == job_id:
                    tasks.append(proc)
        steps = set()
        for proc in tasks:
            with contextlib.suppress(psutil.Error):
                parent = proc.parent()
                if parent is not None and parent.name().startswith("slurmstepd"):
                    steps.add(parent)
        victims = [self._pid(self.root / f"d-{node}.pid"), *(p.pid for p in steps), *(p.pid for p in tasks)]
        killed = []
        for pid in victims:
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        return killed

    def restart_node(self, node: str, timeout: float = 30) -> None:
        """The node comes back (repaired, rebooted): its slurmd starts and registers again."""
        self._spawn(_program("slurmd"), "-N", node)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.node_states().get(node, "")
            if state and not state.endswith("*") and not state.startswith("down"):
                return
            time.sleep(0.5)
        raise AssertionError(f"node {node} did not come back within {timeout:g} s: {self.node_states()}")
