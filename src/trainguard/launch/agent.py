"""The node agent: torch.distributed.elastic's agent plus trainguard's watch, evidence and policy.

A thin adapter over `trainguard.torch_api.elastic.ElasticAgentBase` (torch's LocalElasticAgent with its
private hooks as named methods): the elastic agent keeps doing what it does well (c10d rendezvous across
nodes, starting and restarting the local workers); the decisions live in pure modules (`attempts`: what
happens next after each event, with the attempt number, the restart budget and the no-progress rule;
`watchdog`: is the job hung, `blame`: who caused it, `stop`: how workers end) and the work in helper
modules (`admission`: may this node join, `failures`: evidence, classification and the failure records,
`corruption`: silent data corruption, `nodes`: lost peers, `inprocess`: in-process restarts). Hooks:

* `on_rendezvous`: before every (re)start, applies node-level chaos, runs health checks and leaves the job
  (`NodeExcludedExit`) when a high-severity check fails or the host is a known lemon (`admission`);
* `on_start_workers`: the worker environment (`trainguard.core.protocol.WorkerEnv`) and ``AttemptStarted``;
* `on_monitor`: sees crashes (a process exited) and hangs (`Watchdog` over the heartbeats), and on either
  gathers evidence from every live rank *before* returning the failure, since the base agent SIGTERMs the
  workers as soon as it sees one;
* `on_restart_workers`: charges the budget and closes the attempt's records when a peer node forced it;

Each failure, hand-over and health-gate result becomes an `attempts` event; the agent carries out the
decision `Attempts.decide` returns (an `InProcess` one through `InProcessRestarts`): the failure paths are
`trainguard.launch.failure_response.FailureResponse`, a base of this class.
* `on_shutdown` (on restarts and at the end): SIGCONT, SIGTERM, our short grace, SIGKILL
  (`trainguard.launch.stop`) instead of torch's 30 s wait.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState

from trainguard.chaos import faults as chaos
from trainguard.chaos import node_faults
from trainguard.core.eventlog import EventWriter
from trainguard.core.events import AttemptEnded, AttemptStarted, Event, RunStarted
from trainguard.core.protocol import MEMORY_GB_ENV, MEMORY_PLACEMENT_ENV, Heartbeat, WorkerEnv, read_heartbeat
from trainguard.core.safefs import make_dirs
from trainguard.launch import admission, attempts, evidence, nodes, teardown
from trainguard.launch import frozen as frozen_ranks
from trainguard.launch.admission import NodeExcludedExit
from trainguard.launch.attempts import Attempts
from trainguard.launch.config import SupervisorConfig
from trainguard.launch.failure_response import FailureResponse
from trainguard.launch.failures import (
    FailureRecorder,
    latest_checkpoint,
    live_ranks,
    preload_failure_path,
    rank_logs,
)
from trainguard.launch.fork_server import WORKER_ENV_DEFAULTS
from trainguard.launch.framework_progress import FrameworkCheckpoints
from trainguard.launch.inprocess import InProcessRestarts
from trainguard.launch.lifetime import ProcessTracker
from trainguard.launch.logs import RunDirLogs
from trainguard.launch.numbering import JobNumbering
from trainguard.launch.signals import StopSignals
from trainguard.launch.stop import stop_processes
from trainguard.launch.store_auth import job_signer
from trainguard.launch.store_link import LinkedHandover, RendezvousLostError, StoreLink
from trainguard.launch.store_watch import StoreWatch
from trainguard.launch.warm import WarmSpares
from trainguard.launch.watchdog import Watchdog
from trainguard.sdc import verdict as sdc
from trainguard.sdc.response import CorruptionResponse
from trainguard.torch_api.elastic import ElasticAgentBase
from trainguard.torch_api.features import probe
from trainguard.torch_api.rendezvous import remember_joined_rounds
from trainguard.worker.bootstrap import site_dir

if TYPE_CHECKING:
    from trainguard.stragglers.watch import AgentWatch

__all__ = ["GuardAgent", "NodeExcludedExit", "latest_checkpoint"]

log = logging.getLogger(__name__)

TORCH_ROUND_SLEEP_SECONDS = 0.005
"""What torch's monitor loop sleeps before each round (its ``monitor_interval``); the agent waits out the rest of
``--monitor-interval`` at the start of the round, woken early by a rank's exit (`GuardAgent._between_rounds`)."""


STORE_CONFIRM_SECONDS = 3.0
"""How long a hang verdict waits for the store to answer a fresh read (milliseconds when it is up)."""
STORE_SILENCE_FLOOR_SECONDS = 30.0
"""A node counts itself cut off after max(this, 3 x --node-lost-timeout) without an answer from the store: well
after the other nodes have let it go (--node-lost-timeout, torch's keep-alive 3 x 5 s), never on a busy store."""


class GuardAgent(FailureResponse, ElasticAgentBase):
    """One per node. Build with `trainguard.launch.supervisor.supervise`."""

    def __init__(self, spec: Any, cfg: SupervisorConfig, signals: StopSignals | None = None,
                 lifetime: ProcessTracker | None = None) -> None:
        self.cfg = cfg
        self.signals = signals or StopSignals.from_setting(cfg.signals_to_handle)
        """The run's stop signals: one swallowed by a guard is raised again at the next phase (`check`)."""
        self.lifetime = lifetime or ProcessTracker()
        """The marker in the workers' environment, and the sweeps of processes that outlive their worker."""
        self.layout = cfg.layout
        self.ledger = Attempts(cfg.max_restarts, cfg.max_no_progress_attempts, in_process=cfg.in_process)
        """The attempt number, the restart budget and every decision after a failure (`trainguard.launch.attempts`)."""
        self.numbering = JobNumbering(cfg.run_id, lambda: admission.attempts_ended(self.layout))
        """The attempt number from the rendezvous round (`trainguard.launch.numbering`)."""
        remember_joined_rounds(spec.rdzv_handler)  # the round as joined, not as a later keep-alive read it
        self.run_logs = RunDirLogs(cfg, lambda: self.attempt)
        """Where the workers' output goes; its pump tails the console and caps the files (`finish` at each stop)."""
        super().__init__(spec, logs_specs=self.run_logs, exit_barrier_timeout=120,
                         shutdown_timeout=max(1, round(cfg.stop_grace_seconds)),
                         log_line_prefix=getattr(cfg, "log_line_prefix", None))
        self.events = EventWriter(self.layout.agent_events(cfg.node_id))
        self.signer = job_signer(cfg.run_dir)
        """Signs trainguard's keys in the rendezvous store (`trainguard.launch.store_auth`)."""
        self.watch = self._straggler_watch(spec)
        self.store_watch = StoreWatch(self.rendezvous_store, self._job_world_size)
        self.watchdog = Watchdog(cfg.watchdog)
        self.framework_checkpoints = FrameworkCheckpoints(self.layout)
        """The script's framework's own saves (its adapter's records): progress for the no-progress rule."""
        self.faults = chaos.parse_spec(cfg.chaos)
        self.start_time = time.time()
        self.leader = False
        self.run_started_written = False
        self.excluded_reason: str | None = None
        self._init_failure_path(cfg, tuple(spec.args))
        self._attempt_closed = True
        self._last_alive_mono = time.monotonic()
        self._attempt_mono = self._last_alive_mono
        self._early: tuple[dict[int, int], evidence.GatheredEvidence, float, float] | None = None
        self._ended_in_teardown: set[int] = set()
        """Global ranks of this attempt ended by the agent, frozen after their training was over (`teardown`)."""
        self._idle = teardown.IdleWatch()
        self._still = frozen_ranks.FrozenWatch()
        self._base_pythonpath = os.environ.get("PYTHONPATH", "")
        self.beat = nodes.BeatWriter(cfg.run_dir, cfg.node_id)
        """This agent's beat in the shared run directory: how peers know it is alive."""
        self.peers = nodes.AttemptPeers(self.layout, cfg.run_dir, cfg.node_id, cfg.node_lost_timeout_seconds)
        self.beat.start()
        self.store_link = StoreLink.attach(spec.rdzv_handler, cfg.rdzv_endpoint,
                                           max(STORE_SILENCE_FLOOR_SECONDS, 3 * cfg.node_lost_timeout_seconds))
        """Reads the rendezvous state off the monitor loop; ends the run when this node is cut off (None: static)."""
        if self.store_link is not None and self.watch.handover is not None:
            self.watch.handover = LinkedHandover(self.watch.handover, self.store_link, lambda: self.attempt)

    def _init_failure_path(self, cfg: SupervisorConfig, worker_args: tuple[str, ...]) -> None:
        """What a failure goes through: its records, the corruption response, in-process restarts."""
        self.recorder = FailureRecorder(cfg, self.emit, self.rendezvous_store, self.signer)
        self.failures = self.recorder.failures
        """The ``FailureDetected`` records this node wrote (`trainguard.launch.failures`)."""
        self.corruption = CorruptionResponse(cfg, self.emit, self.recorder)
        """Silent data corruption found, rolled back and excluded at the restart (`trainguard.sdc.response`)."""
        preload_failure_path()
        self.spares = WarmSpares.build(cfg.warm_spares, cfg.nproc_per_node, not cfg.no_python, worker_args,
                                       cfg.layout.logs_base / "spares", cfg.stop_grace_seconds, cfg.node_id,
                                       fork_server=cfg.fork_server and cfg.warm_spares != 0,
                                       server_tag=self.lifetime.server_environ())
        """Interpreters with torch and the script's imports loaded, ready to take restarted ranks
        (`trainguard.launch.warm`); None: off."""
        self.inprocess = InProcessRestarts.build(cfg, self.spares)
        """In-process restarts (``--in-process``, `trainguard.launch.inprocess`); None: whole-process restarts."""

    def _straggler_watch(self, spec: Any) -> AgentWatch:
        """Telemetry and the straggler policy (`trainguard.stragglers.watch.AgentWatch`)."""
        from trainguard.stragglers.handover import StoreHandover
        from trainguard.stragglers.watch import AgentWatch, WatchSettings

        cfg = self.cfg
        settings = WatchSettings.resolve(cfg.straggler_policy, cfg.straggler_probe_seconds, cfg.telemetry_seconds)
        return AgentWatch(self.layout, cfg.node_id, self.emit, settings,
                          handover=StoreHandover(self.rendezvous_store, cfg.run_id, spec.rdzv_handler, self.signer))

    # --- helpers --------------------------------------------------------------------------------

    @property
    def attempt(self) -> int:
        """The current attempt (`Attempts.number`; -1 before the first rendezvous)."""
        return self.ledger.number

    @property
    def stop_reason(self) -> str | None:
        """Why restarts stopped before the budget was spent (the no-progress rule, torch), or None."""
        return self.ledger.stop_reason

    def restarts_left(self) -> int:
        return self.ledger.restarts_left()

    def on_torch_stopped_restarts(self) -> None:
        self.ledger.torch_stopped()

    def emit(self, record: Event) -> None:
        self.events.write(record)

    def hb_dir(self) -> Path:
        """This node's heartbeat folder of the current attempt."""
        return self.layout.heartbeat_dir(self.cfg.node_id, self.attempt)

    def diag_dir(self) -> Path:
        return self.layout.diagnostics_dir(self.attempt)

    def _read_beats(self, wg: WorkerGroup) -> dict[int, Heartbeat | None]:
        return {w.global_rank: read_heartbeat(self.layout.heartbeat_file(self.cfg.node_id, self.attempt,
                                                                         w.global_rank))
                for w in wg.workers}

    def _job_world_size(self) -> int:
        workers = self.get_worker_group().workers
        return workers[0].world_size if workers else 0

    def _gather(self, wg: WorkerGroup, exclude: set[int]) -> evidence.GatheredEvidence:
        """Every live local rank's dump and stacks, and every local rank's log tail (`trainguard.launch.evidence`)."""
        return evidence.gather(self.cfg.run_dir, self.diag_dir(), live_ranks(wg, exclude),
                               rank_logs(self.layout, self.attempt, wg))

    # --- before every (re)start (`trainguard.launch.admission`) ------------------------------------

    def _health_gate(self) -> None:
        bad = admission.exclusion_reasons(self.cfg, self.attempt, self.emit)
        bad.extend(self.watch.exclusion_reasons(self.attempt))
        bad.extend(self.corruption.exclusion_reasons(self.attempt))
        decision = self.ledger.decide(attempts.HealthGate(tuple(bad)))
        if isinstance(decision, attempts.Exclude):
            self.excluded_reason = decision.reason
            admission.exclude(self.cfg.node_id, self.attempt, decision.reason,
                              self.get_worker_group().spec.rdzv_handler, self.emit)

    def on_rendezvous(self, worker_group: WorkerGroup) -> None:
        self.signals.check()
        self.ledger.rendezvous()
        node_faults.apply_node_chaos(self.faults, self.cfg.node_id, self.cfg.layout, self.attempt, self.emit)
        self._health_gate()
        self.signals.check()  # health checks guard themselves with `except Exception`
        first = self.attempt == 0
        if self.store_link is not None:
            self.store_link.pause()
        self.torch_rendezvous(worker_group)
        # Read while the store link is paused: the handler's store is this thread's until it resumes.
        job_attempt = self.numbering.after_rendezvous(worker_group.spec.rdzv_handler)
        if self.store_link is not None:
            self.store_link.resume()
            self.store_link.start()
        if job_attempt is not None:
            self.ledger.numbered(job_attempt)
        elif first:  # no shared round: a spare joining a running job continues from the run dir's records
            self.ledger.joined(admission.attempts_ended(self.layout))
        self.beat.set_attempt(self.attempt)
        self.leader = worker_group.group_rank == 0
        if self.store_link is not None:
            self.store_link.share(lead=self.leader)
        # Only the first attempt's leader starts the run: one that took over from a lost leader must not.
        if self.leader and self.attempt == 0 and not self.run_started_written:
            self._write_run_started(worker_group)

    def _write_run_started(self, worker_group: WorkerGroup) -> None:
        self.run_started_written = True
        ws = worker_group.workers[0].world_size if worker_group.workers else 0
        config = self.cfg.to_json()
        # Readers of the run (reports, the lead's console) must know whether hangs can be detected at all:
        # without automatic instrumentation only scripts calling trainguard.attach() send progress.
        config["progress_signals_expected"] = self.cfg.auto_instrument
        config["torch"] = probe().to_json()  # what this torch offers (docs/compatibility.md)
        self.emit(RunStarted(time=self.start_time, host=self.cfg.node_id, run_id=self.cfg.run_id,
                             world_size=ws, nnodes=worker_group.group_world_size or 1,
                             target_steps=self.cfg.target_steps, config=config))

    def worker_environ(self) -> dict[str, str]:
        env = WorkerEnv(
            run_dir=self.cfg.run_dir, attempt=self.attempt, node=self.cfg.node_id,
            heartbeat_dir=self.hb_dir(), evidence_dir=self.diag_dir(), agent_pid=os.getpid(),
            chaos=self.cfg.chaos, pg_timeout_seconds=self.cfg.pg_timeout_seconds(), auto=self.cfg.auto_instrument,
        ).to_environ()
        env[sdc.ENV_CHECK_EVERY] = str(self.cfg.sdc_check_every)
        if self.cfg.memory_checkpoint_gb > 0:
            env[MEMORY_GB_ENV] = f"{self.cfg.memory_checkpoint_gb:g}"
        if self.cfg.memory_checkpoint_placement != "ring":
            env[MEMORY_PLACEMENT_ENV] = self.cfg.memory_checkpoint_placement
        env.update(self.lifetime.environ(self.attempt))
        if self.inprocess is not None:
            env.update(self.inprocess.environ())
        paths = [self._base_pythonpath] if self._base_pythonpath else []
        if self.cfg.auto_instrument:  # its sitecustomize loads trainguard's worker side into every worker
            paths.insert(0, str(site_dir()))
        env["PYTHONPATH"] = os.pathsep.join(paths)
        return env

    def on_start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        # The base agent starts workers with a copy of this process's environment plus its own variables.
        os.environ.update(self.worker_environ())
        if not os.environ["PYTHONPATH"]:
            del os.environ["PYTHONPATH"]
        for name, value in WORKER_ENV_DEFAULTS.items():
            os.environ.setdefault(name, value)
        self.corruption.rollback()
        if self.attempt == 0 and self.spares is not None and self.spares.start_with_job():
            # Ahead of the workers: a spare that starts loading with them is ready before a fault in their
            # first steps (the worker has the same imports and more to do before its first step).
            self.spares.fill()
        warm = self._claim_spares(worker_group)
        self.open_attempt(worker_group, recovery="restart" if self.attempt > 0 else "", warm_starts=len(warm))
        self.signals.check()
        pids = self.torch_start_workers(worker_group, self.spares.adopter(warm) if warm and self.spares else None)
        self.signals.install()  # torch's process context registered its own handlers, which forget a signal
        return pids

    def _claim_spares(self, wg: WorkerGroup) -> list[int]:
        """Local ranks a warm spare or the fork server will take at this (re)start (`WarmSpares.claim`); at the
        first start only the fork server's (`WarmSpares.claim_first`)."""
        if self.spares is None:
            return []
        ranks = [w.local_rank for w in wg.workers]
        return self.spares.claim_first(ranks) if self.attempt == 0 else self.spares.claim(ranks)

    def _fill_spares(self, beats: dict[int, Heartbeat | None], mono: float) -> None:
        """Top the warm spares up, not while an in-process recovery is under way (a starting spare competes
        for the CPUs)."""
        if self.spares is None or (self.inprocess is not None and self.inprocess.pending is not None):
            return
        self.spares.top_up(any(b is not None and b.steps_done > 0 for b in beats.values()), mono - self._attempt_mono)

    def open_attempt(self, worker_group: WorkerGroup, recovery: str, warm_starts: int = 0) -> None:
        """Folders, watchdog and ``AttemptStarted`` of ``self.attempt`` (a launch or an in-process restart)."""
        make_dirs(self.diag_dir())
        mono = time.monotonic()
        self._attempt_mono = mono
        self.watchdog.new_attempt(mono)
        self._last_alive_mono = mono
        resume = latest_checkpoint(self.cfg.checkpoint_dir)
        ws = worker_group.workers[0].world_size if worker_group.workers else 0
        self.emit(AttemptStarted(time=time.time(), host=self.cfg.node_id, attempt=self.attempt, world_size=ws,
                                 hosts=(self.cfg.node_id,), resume_step=resume, recovery=recovery,
                                 warm_starts=warm_starts))
        self._attempt_closed = False
        self._early = None
        self._ended_in_teardown = set()
        self._idle = teardown.IdleWatch()
        self._still = frozen_ranks.FrozenWatch()
        self.watch.on_attempt(self.attempt)

    # --- watching -------------------------------------------------------------------------------

    def _exited_early(self, wg: WorkerGroup) -> dict[int, int]:
        """Global rank -> exit code of workers that failed, read before the base agent reacts to them.

        The base agent's poll SIGTERMs every other worker the moment it sees one fail, so the
        evidence of the survivors has to be gathered first.
        """
        procs = self._procs()
        failed = {}
        for local_rank, proc in procs.items():
            code = proc.poll()
            rank = wg.workers[local_rank].global_rank
            if code not in (None, 0) and rank not in self._ended_in_teardown:
                failed[rank] = int(code)
        return failed

    def _without_teardown_crashes(self, wg: WorkerGroup, failed: dict[int, int]) -> dict[int, int]:
        """``failed`` less the ranks that crashed in their teardown after their training was over (`teardown`),
        which are counted as finished from now on."""
        beats = self._read_beats(wg)
        crashed = teardown.crashed_after_done(failed, beats)
        if not crashed:
            return failed
        self._ended_in_teardown |= teardown.note_crashed(crashed, beats, time.monotonic(), self.diag_dir())
        return {r: c for r, c in failed.items() if r not in crashed}

    def _finished(self, wg: WorkerGroup) -> set[int]:
        """Global ranks whose process already ended with exit code 0.

        Their heartbeat thread ended with them, so to the watchdog they would look frozen: a rank that finished
        while a slower peer still tears down is not a hang. (A peer left waiting in a collective for a finished
        rank is still found: it is a waiting rank.)
        """
        return {wg.workers[local_rank].global_rank for local_rank, p in self._procs().items()
                if p.poll() == 0} | self._ended_in_teardown

    def _procs(self) -> dict[int, Any]:
        """Local rank -> worker process (empty before the first start)."""
        workers = self.worker_processes()
        return workers.procs() if workers is not None else {}

    def _rank_pids(self, wg: WorkerGroup) -> dict[int, int]:
        """Global rank -> pid of this node's worker processes."""
        return {wg.workers[local].global_rank: proc.pid for local, proc in self._procs().items()}

    def on_monitor(self, worker_group: WorkerGroup) -> RunResult:
        self._between_rounds()
        self.signals.check()
        marker = self.corruption.found(self.attempt)
        if marker is not None:
            return self._on_sdc(worker_group, marker)
        early = self._exited_early(worker_group)
        if early:
            early = self._without_teardown_crashes(worker_group, early)
        if early and self._early is None:
            wall, mono = time.time(), time.monotonic()
            self._early = (early, self._gather(worker_group, set(early)), wall, mono)
            if self.inprocess is not None:  # only the failed ranks get new processes, if it can be done
                return self._on_exit_in_process(worker_group)
            # The base poll below would close the survivors with torch's 30 s SIGTERM wait (and never resume
            # a stopped one): end them our way first, now that their evidence is in. A worker failing between
            # our poll and the base's (microseconds) still gets torch's close.
            self.stop_local_workers(signal.SIGTERM)
        if self._ended_in_teardown and any(p.poll() is None for p in self._procs().values()):
            # A rank counted as finished died (`teardown`): torch's poll would end the others at once, as for any
            # failed exit. They go on ending (or training) under our watch until they are done too.
            result = RunResult(state=WorkerState.HEALTHY)
        else:
            result = self.torch_monitor(worker_group)
        if result.state == WorkerState.FAILED and result.failures and set(result.failures) <= self._ended_in_teardown:
            result = RunResult(state=WorkerState.SUCCEEDED,
                               return_values={w.global_rank: None for w in worker_group.workers})
        if result.state == WorkerState.HEALTHY:
            return self._watch_healthy(worker_group, result)
        if result.state == WorkerState.FAILED:
            return self._on_exit(worker_group, result)
        if result.state == WorkerState.SUCCEEDED:
            self.watch.finish(self.leader)  # a run shorter than the check interval is judged once too
            self.close_attempt("completed", 0)
        return result

    def _between_rounds(self) -> None:
        """The rest of the monitor period (torch's loop sleeps only `TORCH_ROUND_SLEEP_SECONDS`): a rank's exit that
        the fork server reports ends the wait, so a crash is seen within milliseconds, not up to a period later."""
        left = self.cfg.monitor_interval_seconds - TORCH_ROUND_SLEEP_SECONDS
        if left <= 0:
            return
        forks = self.spares.forks if self.spares is not None else None
        if forks is not None and forks.running():
            forks.wait_exit(left)
        else:
            time.sleep(left)

    def _watch_healthy(self, wg: WorkerGroup, result: RunResult) -> RunResult:
        """A round in which no worker failed: the pending in-process restart, lost peers, the watchdog and the
        straggler policy, in that order."""
        if self.inprocess is not None:
            done = self.inprocess.poll(self, wg)
            if done is not None:
                self.ledger.decide(done)  # a fallback gives the in-process try's restart back
                if not done.recovered:
                    return self.inprocess.fall_back(self, done.why)
        link_fresh = self._check_store_link()  # quiet: no store reads below (they would hang on a cut link)
        if link_fresh:
            self.store_watch.poll()  # every few seconds: a key count, warned once when past a job's needs
        mono = time.monotonic()
        beats = self._read_beats(wg)
        lost = self._node_watch(wg, beats, mono)
        if lost:  # not made to wait on the store: with c10d the lost peer may be the store's host
            return self._on_node_lost(wg, lost, time.time())
        finished = self._finished(wg)
        if self._end_idle_in_teardown(wg, beats, finished, mono):
            return result
        verdict = self.watchdog.check({r: b for r, b in beats.items() if r not in finished}, mono,
                                      finished=len(finished), frozen=self._frozen(wg, beats, finished, mono))
        if verdict is not None:
            frozen = teardown.stuck_in_teardown(verdict.ranks, beats, (w.global_rank for w in wg.workers), finished)
            if frozen:  # their exits count as finished
                procs = self._rank_pids(wg)
                self._ended_in_teardown |= teardown.end_frozen(frozen, procs, beats, mono, self.diag_dir())
                return result
        if verdict is not None and self._store_answers():
            return self._on_hang(wg, verdict, time.time(), mono)
        self._last_alive_mono = mono
        self._fill_spares(beats, mono)
        if not link_fresh:
            return result
        leave = self.watch.poll(lambda: live_ranks(wg, set()), self.leader)
        return result if leave is None else self._leave_for_spare(leave)

    def _end_idle_in_teardown(self, wg: WorkerGroup, beats: dict[int, Heartbeat | None], finished: set[int],
                              mono: float) -> bool:
        """End the ranks done with training, all of whose node peers finished, that went silent and use no CPU (a
        teardown deadlock, `teardown.IdleWatch`) without waiting out the allowance a rank writing its last files
        gets; True when some were ended."""
        local = [w.global_rank for w in wg.workers]
        done = [r for r in local if r not in finished and (b := beats.get(r)) is not None and b.phase == "done"]
        procs = self._rank_pids(wg)
        watched = teardown.stuck_in_teardown(done, beats, local, finished)
        idle = self._idle.since({r: procs[r] for r in watched if r in procs}, mono)
        silent = self.watchdog.config.alive_stale_seconds
        frozen = [r for r in sorted(idle) if (b := beats.get(r)) is not None and mono - b.alive_mono > silent]
        if not frozen:
            return False
        self._ended_in_teardown |= teardown.end_frozen(frozen, procs, beats, mono, self.diag_dir(), idle)
        return True

    def _frozen(self, wg: WorkerGroup, beats: dict[int, Heartbeat | None], finished: set[int],
                mono: float) -> list[int]:
        """This node's ranks that the kernel shows frozen (`trainguard.launch.frozen`); only those whose heartbeat
        missed a write are looked at."""
        procs = self._rank_pids(wg)
        silent = {r: pid for r, pid in procs.items() if r not in finished and (b := beats.get(r)) is not None
                  and b.alive_mono > 0 and mono - b.alive_mono > frozen_ranks.SILENT_SECONDS}
        return sorted(self._still.since(silent, mono))

    def _store_answers(self) -> bool:
        """Before acting on a hang: the store answers now (else this node's own link is the likely cause, the next
        rounds wait, and a long silence ends the run: `_check_store_link`)."""
        return self.store_link is None or self.store_link.confirm(STORE_CONFIRM_SECONDS)

    def _check_store_link(self) -> bool:
        """Whether a store read now will not hang; this node's workers stopped and the run ended
        (`RendezvousLostError`) once the store has been silent past the limit."""
        if self.store_link is None:
            return True
        try:
            self.store_link.check()
        except RendezvousLostError:
            self.stop_local_workers(signal.SIGTERM)
            raise
        return self.store_link.fresh()

    # --- lost nodes and node-level chaos (`trainguard.launch.nodes`) ---------------------------------

    def _node_watch(self, wg: WorkerGroup, beats: dict[int, Heartbeat | None], mono: float) -> list[nodes.LostNode]:
        """Fire this node's due node faults; twice a second, the peers that stopped beating."""
        if self.faults and all(b is not None for b in beats.values()):
            steps = [b.step for b in beats.values() if b]
            pids = [int(w.id) for w in wg.workers if w.id is not None]
            node_faults.fire_due_faults(self.faults, self.cfg.node_id, self.attempt, steps, pids,
                                        self.layout.chaos_dir, self.emit)
        if wg.group_world_size in (None, 1):
            return []
        return self.peers.poll(self.attempt, self._job_world_size(), mono)

    def record_lost_peers(self) -> list[str]:
        """After the agent lost its rendezvous (c10d's store dies with its host): record a peer that stopped
        beating as lost, waiting at most the lost-node timeout for the verdict. Returns the lost nodes."""
        try:
            if self.attempt < 0 or (self.get_worker_group().group_world_size or 1) < 2:
                return []
            lost = self.peers.settle(self.attempt, self._job_world_size(), time.monotonic())
            if lost:
                self.recorder.record_node_lost(self.attempt, lost, time.time(), None)
            return [n.node for n in lost]
        except Exception as exc:  # the job is ending anyway: never hide why
            log.warning("could not check the peers after losing the rendezvous: %s", exc)
            return []

    def on_exit_barrier(self) -> None:
        """torch's wait for every agent at the end, except that a peer found lost meanwhile ends it: a killed
        agent never arrives, and torch would wait its full 120 s for it."""
        if (self.get_worker_group().group_world_size or 1) < 2:
            return self.torch_exit_barrier()
        def observe() -> list[nodes.LostNode]:
            return self.peers.observe(self.attempt, self._job_world_size(), time.monotonic())

        lost = nodes.wait_unless_lost(self.torch_exit_barrier, observe)
        if lost:
            log.warning("not waiting at the exit barrier for lost node(s) %s", ", ".join(n.node for n in lost))
        return None

    # --- ending an attempt --------------------------------------------------------------------------

    def close_attempt(self, reason: str, exit_code: int | None) -> None:
        if not self._attempt_closed:
            self._attempt_closed = True
            self.emit(AttemptEnded(time=time.time(), host=self.cfg.node_id, attempt=self.attempt,
                                   reason=reason, exit_code=exit_code))
            self.lifetime.sweep()  # what detached from a worker that ended (a setsid child) ends with it

    def on_restart_workers(self, worker_group: WorkerGroup, counted: bool) -> None:
        self.ledger.torch_restarted(counted)
        if not self._attempt_closed:
            # No worker of ours failed: a node waits to join. A peer that failed (its failure is claimed), one
            # that left for a waiting spare (straggler restart-now), or a new node (told to the peers first,
            # before our workers stop: theirs then fail, and that is this planned restart).
            planned = self.watch.planned_leave(self.attempt) is not None or (
                not counted and self.recorder.announce_rejoin(self.attempt, "a node waits to join the job"))
            self.close_attempt("planned" if planned else "failure", None)
        self.torch_restart_workers(worker_group)

    # --- stopping -------------------------------------------------------------------------------

    def on_shutdown(self, death_sig: signal.Signals) -> None:
        """Every stop (restart, hang, end of run, a signal to the agent) gets our grace, not torch's 30 s."""
        if self.signals.first is not None:
            self.signals.disarm()  # stopping for a signal: a second one must not cut the stop short
        self.stop_local_workers(death_sig)
        # The base class closes log files and stops its watchdog and health-check server; the processes
        # are gone by now, so its own signal-and-wait finds nothing left to wait for.
        self.torch_shutdown(death_sig, timeout=1)
        self.run_logs.finish()  # the rest of their output to the console; the files stop being followed

    def stop_local_workers(self, death_sig: signal.Signals) -> None:
        procs = [p for p in self._procs().values() if p.poll() is None]
        if procs:
            took = stop_processes(procs, self.cfg.stop_grace_seconds, death_sig)
            log.info("%d worker(s) of attempt %d stopped in %.2fs", len(procs), self.attempt, took)
        self.lifetime.sweep()  # descendants that left the workers' sessions: out of reach of the group kill
