"""Warm spare workers kept by the agent: started ahead, torch and the script's imports loaded, handed a rank.

Each spare runs `trainguard.worker.warm` with the job's command and waits on its stdin; it dies with the
agent, by SIGKILL too, whatever phase it is in (`die_with_parent_command`). A whole-process
restart gives each local rank's environment and log files to a waiting spare instead of starting a cold
interpreter (`GuardAgent.on_start_workers`); an in-process restart (`trainguard.launch.inprocess`) does the
same for the failed ranks. The pool is topped up once the new attempt is training. See docs/run.md
("Warm spares").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from trainguard.core.protocol import SPARE_UNFIT
from trainguard.health.host import available_memory_bytes, cpu_ticks, idle_cpus
from trainguard.launch.fork_server import ForkServer, preloader_command, preloader_environ
from trainguard.launch.stop import stop_processes
from trainguard.torch_api.elastic import Adopt, can_adopt

log = logging.getLogger(__name__)

AUTO = -1
"""``warm_spares`` value that sizes the pool from the node (`auto_count`): the default."""
SPARE_BUDGET_BYTES = 1 << 30
"""Memory set aside per spare when sizing the pool: a spare with torch 2.13's CPU build imported measured
0.30 GB resident (0.22 GB of it private); the budget leaves room for a CUDA build's larger import and the
script's own imports."""
MEMORY_SHARE = 0.25
"""At most this share of the node's available memory goes to spares."""
FILL_AFTER_SECONDS = 5.0
FIRST_START_WAIT_SECONDS = 300.0
"""The first start waits this long at most for the fork server's imports (a cold rank would spend the same time
importing them), then starts its ranks cold: a script whose top-level imports block until the job runs."""
HOLD_AT_MOST_SECONDS = 30.0
"""A spare held during a cold restart (`WarmSpares.claim`) goes on importing after this long even if the restarted
ranks have not completed a step by then."""
"""On a node without a CPU for every worker and every spare (`starts_with_the_job`), an automatically sized
pool is filled once the attempt has completed a step and run this long: spares importing torch while the
workers start would slow that start on every job, and a job failing in its first seconds is usually failing
on its own code (a restart cannot help it)."""


def auto_count(local_ranks: int, available_bytes: int | None) -> int:
    """Spares for a node of ``local_ranks`` workers: one per local rank (a whole-process restart needs one
    each), at most `MEMORY_SHARE` of the available memory at `SPARE_BUDGET_BYTES` apiece; 0 when the
    available memory is unknown."""
    if available_bytes is None or local_ranks <= 0:
        return 0
    return max(0, min(local_ranks, int(available_bytes * MEMORY_SHARE) // SPARE_BUDGET_BYTES))


FORKS_UNBOUNDED = 1 << 16
"""`WarmSpares.ready` while the fork server serves: it makes a rank for every request."""

IDLE_SLACK = 0.5
"""CPUs `starts_with_the_job` lets be busy anyway: a quiet node's daemons keep a few percent busy (1.96-1.99
of 2 CPUs idle measured here between runs)."""


def starts_with_the_job(local_ranks: int, count: int, idle: float | None) -> bool:
    """Whether an automatically sized pool of ``count`` starts with the job (ahead of the workers, so that a
    fault in their first steps finds it ready): when the node has an idle CPU for every worker and every spare,
    the spares' imports take no CPU the workers' start needs. A GPU node (8 ranks, tens of CPUs) is such a
    node. Measured where it is not (2 ranks and 2 spares on 2 CPUs, `benchmarks/restart.py`): launch -> first
    step 5.7 s instead of 3.4 s, on every start."""
    return idle is not None and local_ranks > 0 and idle + IDLE_SLACK >= local_ranks + count


class WarmSpares:
    """A pool of ``count`` waiting spare processes for one agent."""

    def __init__(self, count: int, args: tuple[str, ...], log_dir: Path, grace_seconds: float,
                 eager: bool = True, name: str = "spare", local_ranks: int = 0, forks: bool = False,
                 server_tag: dict[str, str] | None = None) -> None:
        self.count = count
        self.local_ranks = local_ranks
        """Workers on this node (with ``count``, the CPUs a pool that starts with the job needs)."""
        self.since: tuple[int, int] | None = None
        """CPU ticks when an automatically sized pool was built: `start_with_job` judges the CPUs' idleness
        from then on."""
        self._since_cpu = 0.0  # this process's CPU time then: the agent's own start-up is no competitor
        self.args = args
        """The worker's arguments after the interpreter (``-u script.py ...`` or ``-u -m module ...``)."""
        self.log_dir = log_dir
        self.grace_seconds = grace_seconds
        self.eager = eager
        """Fill as soon as an attempt runs (a count the user asked for, or a node with CPUs to spare:
        `starts_with_the_job`), not after `FILL_AFTER_SECONDS`."""
        self.name = name
        """Prefix of the spares' log files: ``spare-<node>`` (nodes of one job may share the run folder)."""
        self.spares: list[subprocess.Popen[bytes]] = []
        self._logs: dict[int, Path] = {}
        self._started = 0
        self.skip: tuple[str, ...] = ()
        """The script's top-level imports that spares leave for after their takeover: an earlier spare found that
        loading them ahead reads a rank's variables (one probe per job)."""
        self.unfit: str | None = None
        """Why spares cannot take a rank warm even without those imports: the pool is not refilled."""
        self.held: list[subprocess.Popen[bytes]] = []
        """Spares stopped (SIGSTOP) while they import, so that a cold restart's ranks have the CPUs (`claim`)."""
        self.forks = ForkServer(args, log_dir, tag=server_tag) if forks else None
        """The node's fork server (`trainguard.launch.fork_server`): while it serves, every rank is forked from it,
        at the first start too, and no spare interpreter is kept; None: off, or it could not serve."""

    @classmethod
    def build(cls, requested: int, local_ranks: int, python_worker: bool, args: tuple[str, ...], log_dir: Path,
              grace_seconds: float, node: str, fork_server: bool = False,
              server_tag: dict[str, str] | None = None) -> WarmSpares | None:
        """The pool ``requested`` asks for (`AUTO`: sized by `auto_count`; whether it starts with the job is
        decided by `start_with_job`), with a fork server when ``fork_server`` (started at once, from the calling
        thread: the main thread); None when it would be empty or the workers are not Python (``--no-python``:
        nothing to load ahead)."""
        if not python_worker:
            return None
        count = auto_count(local_ranks, available_memory_bytes()) if requested == AUTO else requested
        if count <= 0 and not fork_server:
            return None
        pool = cls(max(0, count), args, log_dir, grace_seconds, eager=requested != AUTO, name=f"spare-{node}",
                   local_ranks=local_ranks, forks=fork_server, server_tag=server_tag)
        if requested == AUTO:
            pool.since, pool._since_cpu = cpu_ticks(), time.process_time()
        if pool.forks is not None:
            pool.forks.start()
        return pool

    def _forks_serve(self) -> bool:
        """Whether the fork server is loading or serving (then no spare interpreter is started). A server that
        cannot serve (it already left out the imports that read a rank's variables, once) is turned off, and the
        spares take over, leaving out what it named."""
        forks = self.forks
        if forks is None:
            return False
        if forks.ready() or forks.starting():
            return True
        hello = forks.hello or {}
        forks.close(self.grace_seconds)
        log.warning("fork server: %s; warm spares instead", hello.get("unfit") or "it ended")
        self.skip = (*self.skip, *(m for m in hello.get("skip") or () if m not in self.skip))
        self.forks = None
        return False

    def claim_first(self, local_ranks: list[int]) -> list[int]:
        """The local ranks the fork server takes at the first start: all of them once it has loaded (waiting for
        it costs nothing a cold rank would not spend importing the same modules), none without a server."""
        if self.forks is None or not can_adopt():
            return []
        if not self.forks.wait_ready(FIRST_START_WAIT_SECONDS):
            if self.forks.starting():
                log.warning("fork server: not loaded after %.0fs; the first ranks start cold", FIRST_START_WAIT_SECONDS)
            return []
        return list(local_ranks)

    def start_with_job(self) -> bool:
        """Whether the pool fills now, ahead of the first workers: a count asked for always; an automatic pool
        when the node had an idle CPU for every worker and spare since it was built (over the agent's start
        and rendezvous: `starts_with_the_job`). Asked once, before the first workers start."""
        if not self.eager and self.since is not None:
            idle = idle_cpus(self.since, own_seconds=time.process_time() - self._since_cpu)
            self.since = None
            if starts_with_the_job(self.local_ranks, self.count, idle):
                self.eager = True
                log.info("warm spares: %.1f idle CPUs, the pool starts with the job", idle)
        return self.eager

    def _command(self) -> list[str]:
        # ``-c`` bootstrap rather than ``-m``: the parent-death signal is set before torch and the script load.
        return preloader_command("trainguard.worker.warm", self.args)

    def alive(self) -> int:
        """Spares that are still running (loading or waiting)."""
        self.spares = [p for p in self.spares if p.poll() is None]
        return len(self.spares)

    def _log_tail(self, proc: subprocess.Popen[bytes]) -> bytes:
        try:
            return self._logs[proc.pid].read_bytes()[-4096:]
        except (OSError, KeyError):
            return b""

    def _importing(self, proc: subprocess.Popen[bytes]) -> bool:
        """Whether ``proc`` is still importing (its log has no ``waiting`` line yet)."""
        return b"waiting" not in self._log_tail(proc)

    def _loading(self) -> bool:
        """Whether a spare is still importing."""
        return any(self._importing(p) for p in self.spares)

    def ready(self) -> int:
        """Spares that wait for a rank and can take it warm: a restart hands ranks only to these, never to one
        still importing (that rank starts cold at once; the spare serves the next restart). A serving fork server
        makes as many as asked for."""
        if self.forks is not None and self.forks.ready():
            return FORKS_UNBOUNDED
        return sum(self._fit(p) for p in self.spares if p.poll() is None)

    def _fit(self, proc: subprocess.Popen[bytes]) -> bool:
        tail = self._log_tail(proc)
        return b"waiting" in tail and SPARE_UNFIT.encode() not in tail

    def _probe(self) -> None:
        """Learn from spares that found themselves unfit: leave the imports they name out of the next spares (and
        stop these, which would only start cold), or, when nothing can be left out, stop refilling the pool."""
        for proc in list(self.spares):
            tail = self._log_tail(proc).decode(errors="replace")
            mark = tail.find(SPARE_UNFIT)
            if mark < 0:
                continue
            why, _, skip = tail[mark + len(SPARE_UNFIT):].partition("; skip=")
            culprits = tuple(m for m in skip.split("\n", 1)[0].strip().split(",") if m and m not in self.skip)
            self.spares.remove(proc)
            stop_processes([proc], self.grace_seconds, signal.SIGTERM)
            if culprits:
                self.skip = (*self.skip, *culprits)
                log.warning("warm spares: %s: %s now load after a spare takes its rank (torch stays loaded ahead)",
                            why.strip(), ", ".join(culprits))
            elif self.unfit is None:
                self.unfit = why.strip()
                log.warning("warm spares: %s: restarts start cold; no more spares for this job", self.unfit)

    def fill(self) -> None:
        """Start spares until ``count`` are alive (with trainguard's automatic hooks off until they get a rank).

        An eager pool starts them all at once; an automatic one starts the next only once the previous
        waits, so the node's CPUs see one import of torch at a time beside the training.

        Call it from the main thread (the agent's monitor loop): a spare's parent-death signal fires when the
        thread that started it ends."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("warm spares started off the main thread die when that thread ends")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self._forks_serve():
            return
        self._probe()
        while self.unfit is None and self.alive() < self.count:
            if not self.eager and self._loading():
                return
            # Untagged: a spare outlives the attempt it was started in, so the end-of-attempt sweep must not
            # take it for a worker's leftover (`trainguard.launch.lifetime`). It is tagged when it takes a rank.
            env = preloader_environ(self.skip)
            path = self.log_dir / f"{self.name}-{self._started}.log"
            with open(path, "ab") as out:
                proc = subprocess.Popen(self._command(), stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True)
            self._started += 1
            self.spares.append(proc)
            self._logs[proc.pid] = path
            log.info("warm spare started: pid %d", proc.pid)

    def claim(self, local_ranks: list[int]) -> list[int]:
        """The local ranks spares take at a restart: one per rank while ready ones last (a spare still importing
        is left for the next restart: its rank starts cold now rather than wait for it). When some rank starts
        cold, the spares still importing are held (SIGSTOP) until the restarted ranks have stepped (`top_up`):
        their imports competed with the cold ranks' own for the CPUs, and the restart was slower than without a
        pool (Lightning Fabric at load 12: 21 s cold against torchrun's 14 s)."""
        warm = local_ranks[:self.ready()] if can_adopt() else []
        if len(warm) < len(local_ranks):
            self._hold_loading()
        return warm

    def _hold_loading(self) -> None:
        server = self.forks.proc if self.forks is not None and self.forks.starting() else None
        for proc in [*self.spares, *([server] if server is not None else [])]:
            if proc.poll() is None and proc not in self.held and self._importing(proc):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGSTOP)  # its group: the server loads in a child (spares: alone)
                    self.held.append(proc)
        if self.held:
            log.info("warm spares: %d still importing, held while the restart's cold ranks start", len(self.held))

    def release(self) -> None:
        """Let the held spares go on importing."""
        for proc in self.held:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
        self.held = []

    def adopter(self, ranks: list[int]) -> Adopt:
        """What torch's process start asks for each local rank: a spare for ``ranks``, else None (cold)."""

        def adopt(local_rank: int, env: dict[str, str], stdout: str | None, stderr: str | None
                  ) -> subprocess.Popen[bytes] | None:
            if local_rank not in ranks:
                return None
            proc = self.take(env, stdout, stderr)
            if proc is not None:
                log.info("restart: warm spare pid %d takes local rank %d", proc.pid, local_rank)
            return proc

        return adopt

    def top_up(self, trained: bool, running_seconds: float) -> None:
        """Release the spares held for a cold restart once the attempt has ``trained`` (completed a step), or after
        `HOLD_AT_MOST_SECONDS`; `fill`: an automatically sized pool only once the attempt has trained and run
        `FILL_AFTER_SECONDS`."""
        if self.held and (trained or running_seconds >= HOLD_AT_MOST_SECONDS):
            self.release()
        if self.eager or (trained and running_seconds >= FILL_AFTER_SECONDS):
            self.fill()

    def take(self, env: dict[str, str], stdout: str | None, stderr: str | None) -> subprocess.Popen[bytes] | None:
        """Hand a rank to a spare that waits and is fit (`ready`): the environment a cold worker would get (this
        process's, then ``env``) and its log files. None when none is ready."""
        full = {**os.environ, **env}
        if self.forks is not None and self.forks.ready():
            forked = self.forks.spawn(full, stdout, stderr)
            if forked is not None:
                return forked
        for proc in list(self.spares):
            if proc.poll() is not None or proc.stdin is None or not self._fit(proc):
                continue
            self.spares.remove(proc)
            line = json.dumps({"env": full, "stdout": stdout, "stderr": stderr}) + "\n"
            try:
                proc.stdin.write(line.encode())
                proc.stdin.close()
            except OSError:  # it died between the poll and the write
                continue
            return proc
        return None

    def close(self) -> None:
        """Stop every waiting spare (end of the run)."""
        self.release()  # a stopped process would not act on the SIGTERM before the grace ran out
        if self.forks is not None:
            self.forks.close(self.grace_seconds)
        alive = [p for p in self.spares if p.poll() is None]
        if alive:
            stop_processes(alive, self.grace_seconds, signal.SIGTERM)
        self.spares = []
