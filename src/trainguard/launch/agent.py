"""The node agent: torch.distributed.elastic's LocalElasticAgent plus trainguard's watch, evidence and policy.

A thin adapter: the elastic agent keeps doing what it does well (c10d rendezvous across nodes, starting and
restarting the local workers, the restart budget); the decisions live in pure modules (`watchdog`: is the
job hung, `blame`: who caused it, `policy`: restart or stop, `stop`: how workers end). Hooks:

* ``_rendezvous``: before every (re)start, applies node-level chaos, runs health checks and leaves the job
  (`NodeExcludedExit`) when a high-severity check fails or the host is a known lemon;
* ``_start_workers``: the worker environment (`trainguard.protocol.WorkerEnv`) and ``AttemptStarted``;
* ``_monitor_workers``: sees crashes (a process exited) and hangs (`Watchdog` over the heartbeats), and on
  either gathers evidence from every live rank *before* returning the failure, since the base agent
  SIGTERMs the workers as soon as it sees one;
* ``_restart_workers``: closes the attempt's records when a peer node forced the restart;
* ``_shutdown`` (behind ``_stop_workers`` on restarts and at the end): SIGCONT, SIGTERM, our short grace,
  SIGKILL (`trainguard.launch.stop`) instead of torch's 30 s wait.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.rendezvous import RendezvousGracefulExitError

from trainguard import chaos, sdc
from trainguard.errors import TrainguardError
from trainguard.eventlog import EventWriter, iter_events
from trainguard.events import (
    NODE_FAULT_RANK,
    AttemptEnded,
    AttemptStarted,
    CheckpointRejected,
    Diagnosis,
    Event,
    FailureDetected,
    FaultInjected,
    HealthCheckResult,
    NodeExcluded,
    PlannedInterruption,
    RunStarted,
)
from trainguard.launch import blame, evidence, nodes
from trainguard.launch.config import SupervisorConfig
from trainguard.launch.inprocess import InProcessRestarts
from trainguard.launch.logs import RunDirLogs
from trainguard.launch.policy import AttemptOutcome, NoProgressRule
from trainguard.launch.stop import stop_processes
from trainguard.launch.watchdog import Verdict, Watchdog
from trainguard.protocol import Heartbeat, WorkerEnv, read_heartbeat
from trainguard.safefs import make_dirs, write_private

log = logging.getLogger(__name__)

DUMP_WAIT_SECONDS = 3.0
"""How long the node recording a hang waits for other nodes' dumps in a shared diagnostics folder."""
_HANG_VERDICTS = ("hang", "p2p-hang")


class NodeExcludedExit(RendezvousGracefulExitError):
    """This node failed a high-severity health check (or is a lemon) and leaves the job."""


def latest_checkpoint(directory: Path) -> int | None:
    """Newest committed checkpoint step (manifest present; verification happens in the workers' restore)."""
    from trainguard.checkpoint import latest_step

    step = latest_step(directory)
    return int(step) if step is not None else None


def _auto_instrument_path() -> str | None:
    """The folder that loads trainguard's worker side into every worker (``sitecustomize``), if available."""
    try:
        from trainguard.worker.bootstrap import site_dir  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return str(site_dir())


class GuardAgent(LocalElasticAgent):
    """One per node. Build with `trainguard.launch.supervisor.supervise`."""

    def __init__(self, spec: Any, cfg: SupervisorConfig) -> None:
        self.cfg = cfg
        self.layout = cfg.layout
        self.attempt = -1
        super().__init__(spec, logs_specs=RunDirLogs(cfg, lambda: self.attempt), exit_barrier_timeout=120,
                         shutdown_timeout=max(1, round(cfg.stop_grace_seconds)),
                         log_line_prefix_template=getattr(cfg, "log_line_prefix", None))
        self.events = EventWriter(self.layout.agent_events(cfg.node_id))
        from trainguard.stragglers.handover import StoreHandover
        from trainguard.stragglers.watch import AgentWatch, WatchSettings  # telemetry and the straggler policy

        settings = WatchSettings.resolve(cfg.straggler_policy, cfg.straggler_probe_seconds, cfg.telemetry_seconds)
        self.watch = AgentWatch(self.layout, cfg.node_id, self.emit, settings,
                                handover=StoreHandover(lambda: getattr(self, "_store", None), cfg.run_id,
                                                       spec.rdzv_handler))
        self.watchdog = Watchdog(cfg.watchdog)
        self.policy = NoProgressRule(cfg.max_no_progress_attempts, cfg.max_restarts)
        self.faults = chaos.parse_spec(cfg.chaos)
        self.start_time = time.time()
        self.leader = False
        self.run_started_written = False
        self.stop_reason: str | None = None
        self.excluded_reason: str | None = None
        self.failures: list[FailureDetected] = []
        self._attempt_closed = True
        self._last_alive_mono = time.monotonic()
        self._early: tuple[dict[int, int], evidence.GatheredEvidence, float, float] | None = None
        self._sdc_pending: tuple[sdc.SdcMarker, dict[int, str]] | None = None
        """Corruption found in the last attempt (marker, rank -> node): rollback and exclusion at the restart."""
        self._base_pythonpath = os.environ.get("PYTHONPATH", "")
        self._warned_no_bootstrap = False
        self.beat = nodes.BeatWriter(cfg.run_dir, cfg.node_id)
        """This agent's beat in the shared run directory: how peers know it is alive."""
        self.peers = nodes.PeerWatch(cfg.run_dir, cfg.node_id, cfg.node_lost_timeout_seconds)
        self._peers_polled_mono = 0.0
        self._peers_cache: tuple[int, list[str]] | None = None
        for name in ("trainguard.classify", "trainguard.localize", "trainguard.checkpoint"):
            # import now what the first failure needs, not inside the restart's critical path
            importlib.import_module(name)
        self.inprocess = InProcessRestarts.build(cfg, tuple(spec.args))
        """In-process restarts (``--in-process``, `trainguard.launch.inprocess`); None: whole-process restarts."""
        self.beat.start()

    # --- helpers --------------------------------------------------------------------------------

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

    def _hosts_of(self, ranks: list[int]) -> tuple[str, ...]:
        where = self.layout.rank_nodes(self.attempt)
        return tuple(sorted({where.get(r, self.cfg.node_id) for r in ranks}))

    def _claim_failure(self) -> bool:
        """Only one node records a failure that several nodes see."""
        store = getattr(self, "_store", None)
        if store is None:
            return True
        try:
            key = f"trainguard/{self.cfg.run_id}/failure/{self.attempt}"
            return int(store.add(key, 1)) == 1  # add, not compare_set: etcd's store has only add
        except Exception:
            return True

    # --- before every (re)start -----------------------------------------------------------------

    def _apply_node_chaos(self) -> None:
        for f in self.faults:
            if f.kind != "unhealthy" or f.node != self.cfg.node_id:
                continue
            if (f.attempt if f.attempt is not None else 0) != self.attempt:
                continue
            marker = self.layout.chaos_dir / f"unhealthy-{self.cfg.node_id}"
            write_private(marker, f"{f.to_spec()}\n".encode())
            self.emit(FaultInjected(time=time.time(), host=self.cfg.node_id, attempt=self.attempt,
                                    rank=NODE_FAULT_RANK, step=0, kind="unhealthy", params={"node": self.cfg.node_id}))

    def _health_gate(self) -> None:
        from trainguard.health import HealthConfig, run_checks

        bad: list[str] = []
        if self.cfg.health_checks:
            results = run_checks(HealthConfig(
                node=self.cfg.node_id, run_dir=self.cfg.run_dir, checkpoint_dir=self.cfg.checkpoint_dir,
                # The store only exists once the first rendezvous ran: check it on restarts only.
                rdzv_endpoint=self.cfg.rdzv_endpoint if self.attempt > 0 else None,
                torch_checks=False, gpu_checks=self.cfg.gpu_checks,
            ))
            for r in results:
                self.emit(HealthCheckResult(time=time.time(), host=self.cfg.node_id, name=r.name,
                                            severity=r.severity, ok=r.ok, detail=r.detail,
                                            skipped=r.skipped, attempt=self.attempt))
                if not r.ok and not r.skipped and r.severity == "high":
                    bad.append(f"{r.name}: {r.detail}" if r.detail else r.name)
        bad.extend(self._lemon_reasons())
        bad.extend(nodes.lost_reasons(self.cfg.run_dir, self.cfg.node_id))
        bad.extend(self.watch.exclusion_reasons(self.attempt))
        bad.extend(self._sdc_exclusion())
        if bad:
            reason = "; ".join(bad)
            self.emit(NodeExcluded(time=time.time(), host=self.cfg.node_id, node=self.cfg.node_id,
                                   reason=reason, attempt=self.attempt))
            self.excluded_reason = reason
            self._leave_rendezvous()
            raise NodeExcludedExit(f"node {self.cfg.node_id} excluded: {reason}")

    def _leave_rendezvous(self) -> None:
        """Leave the current rendezvous round now, so the other nodes (and a waiting spare) form the next one
        at once instead of waiting until this node's keep-alive expires (3 x 5 s in torch's c10d handler)."""
        handler = self._worker_group.spec.rdzv_handler
        try:  # torch has no public "leave" (shutdown() closes the rendezvous for every node)
            from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp

            handler._stop_heartbeats()
            handler._op_executor.run(_RendezvousExitOp(), time.monotonic() + 10)
        except Exception as exc:  # the others then drop this node when its keep-alive expires
            log.warning("could not leave the rendezvous (%s); peers wait for its keep-alive to expire", exc)

    def _sdc_exclusion(self) -> list[str]:
        """The reason to exclude this node when one of its ranks corrupted parameters in the last attempt.

        A node that cannot be excluded (the job's only node, or no majority named a culprit) is kept, and a
        failed low-severity ``sdc`` check records that it should be drained after the job.
        """
        if self._sdc_pending is None:
            return []
        marker, nodes = self._sdc_pending
        decision = sdc.exclusion_decision(marker, nodes, self.cfg.node_id, self.cfg.max_nodes)
        if decision.exclude:
            return [decision.reason]
        if decision.reason:
            self.emit(HealthCheckResult(time=time.time(), host=self.cfg.node_id, name="sdc", severity="low",
                                        ok=False, detail=decision.reason, attempt=self.attempt))
        return []

    def _lemon_reasons(self) -> list[str]:
        from trainguard.fleetdb import FleetDB, default_db_path
        from trainguard.lemon import flagged_hosts

        path = Path(self.cfg.fleet_db) if self.cfg.fleet_db else default_db_path()
        if not path.exists():  # no fleet history yet; do not create a database as a side effect
            return []
        try:
            with FleetDB(path) as db:
                flagged = flagged_hosts(db)
        except Exception as exc:  # a broken fleet database must not stop the job
            log.warning("lemon check skipped: %s", exc)
            return []
        return [f"lemon: {self.cfg.node_id} flagged by fleet history"] if self.cfg.node_id in flagged else []

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        self.attempt += 1
        self._apply_node_chaos()
        self._health_gate()
        first = self.attempt == 0
        super()._rendezvous(worker_group)
        if first:  # a spare joining a running job continues the job's attempt numbers
            self.attempt = max(self.attempt, self._attempts_ended())
        self.beat.set_attempt(self.attempt)
        self.leader = worker_group.group_rank == 0
        # Only the first attempt's leader starts the run: one that took over from a lost leader must not.
        if self.leader and self.attempt == 0 and not self.run_started_written:
            self.run_started_written = True
            ws = worker_group.workers[0].world_size if worker_group.workers else 0
            config = self.cfg.to_json()
            # Readers of the run (reports, the lead's console) must know whether hangs can be detected at all:
            # without automatic instrumentation only scripts calling trainguard.attach() send progress.
            config["progress_signals_expected"] = self.cfg.auto_instrument
            self.emit(RunStarted(time=self.start_time, host=self.cfg.node_id, run_id=self.cfg.run_id,
                                 world_size=ws, nnodes=worker_group.group_world_size or 1,
                                 target_steps=self.cfg.target_steps, config=config))

    def _attempts_ended(self) -> int:
        """1 + the highest attempt any agent of this run dir closed (0 when none did)."""
        top = -1
        for path in self.layout.events_dir.glob("agent-*.jsonl"):
            with contextlib.suppress(TrainguardError):  # an unreadable file tells nothing about attempts
                for _, record in iter_events(path):
                    if isinstance(record, AttemptEnded):
                        top = max(top, record.attempt)
        return top + 1

    def _worker_environ(self) -> dict[str, str]:
        env = WorkerEnv(
            run_dir=self.cfg.run_dir, attempt=self.attempt, node=self.cfg.node_id,
            heartbeat_dir=self.hb_dir(), evidence_dir=self.diag_dir(), agent_pid=os.getpid(),
            chaos=self.cfg.chaos, pg_timeout_seconds=self.cfg.pg_timeout_seconds(), auto=self.cfg.auto_instrument,
        ).to_environ()
        env[sdc.ENV_CHECK_EVERY] = str(self.cfg.sdc_check_every)
        if self.inprocess is not None:
            env.update(self.inprocess.environ())
        paths = [self._base_pythonpath] if self._base_pythonpath else []
        if self.cfg.auto_instrument:
            site = _auto_instrument_path()
            if site is not None:
                paths.insert(0, site)
            elif not self._warned_no_bootstrap:
                self._warned_no_bootstrap = True
                log.warning("automatic instrumentation is not available (no trainguard.worker.bootstrap): "
                            "only scripts that call trainguard.attach() send progress signals")
        env["PYTHONPATH"] = os.pathsep.join(paths)
        return env

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        # The base agent starts workers with a copy of this process's environment plus its own variables.
        os.environ.update(self._worker_environ())
        if not os.environ["PYTHONPATH"]:
            del os.environ["PYTHONPATH"]
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        self._sdc_rollback()
        self._open_attempt(worker_group, recovery="restart" if self.attempt > 0 else "")
        return super()._start_workers(worker_group)

    def _open_attempt(self, worker_group: WorkerGroup, recovery: str) -> None:
        """Folders, watchdog and ``AttemptStarted`` of ``self.attempt`` (a launch or an in-process restart)."""
        make_dirs(self.diag_dir())
        mono = time.monotonic()
        self.watchdog.new_attempt(mono)
        self._last_alive_mono = mono
        resume = latest_checkpoint(self.cfg.checkpoint_dir)
        ws = worker_group.workers[0].world_size if worker_group.workers else 0
        self.emit(AttemptStarted(time=time.time(), host=self.cfg.node_id, attempt=self.attempt, world_size=ws,
                                 hosts=(self.cfg.node_id,), resume_step=resume, recovery=recovery))
        self._attempt_closed = False
        self._early = None
        self.watch.on_attempt(self.attempt)

    # --- watching -------------------------------------------------------------------------------

    def _exited_early(self, wg: WorkerGroup) -> dict[int, int]:
        """Global rank -> exit code of workers that failed, read before the base agent reacts to them.

        The base agent's poll SIGTERMs every other worker the moment it sees one fail, so the
        evidence of the survivors has to be gathered first.
        """
        handlers = getattr(self._pcontext, "subprocess_handlers", None) or {}
        failed = {}
        for local_rank, h in handlers.items():
            code = h.proc.poll()
            if code not in (None, 0):
                failed[wg.workers[local_rank].global_rank] = int(code)
        return failed

    def _finished(self, wg: WorkerGroup) -> set[int]:
        """Global ranks whose process already ended with exit code 0.

        Their heartbeat thread ended with them, so to the watchdog they would look frozen: a rank that finished
        while a slower peer still tears down is not a hang. (A peer left waiting in a collective for a finished
        rank is still found: it is a waiting rank.)
        """
        handlers = getattr(self._pcontext, "subprocess_handlers", None) or {}
        return {wg.workers[local_rank].global_rank for local_rank, h in handlers.items() if h.proc.poll() == 0}

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        marker_file = sdc.marker_path(self.cfg.run_dir, self.attempt)
        if self._sdc_pending is None and os.path.lexists(marker_file):  # one stat per poll
            marker = sdc.read_marker(marker_file)
            if marker is not None and marker.attempt == self.attempt:
                return self._on_sdc(worker_group, marker)
        early = self._exited_early(worker_group)
        if early and self._early is None:
            wall, mono = time.time(), time.monotonic()
            ev = evidence.gather(self.cfg.run_dir, self.diag_dir(), self._live(worker_group, set(early)),
                                 self._logs(worker_group))
            self._early = (early, ev, wall, mono)
            if self.inprocess is not None:  # only the failed ranks get new processes, if it can be done
                return self.inprocess.after_exit(self, worker_group)
            # The base poll below would close the survivors with torch's 30 s SIGTERM wait (and never resume
            # a stopped one): end them our way first, now that their evidence is in. A worker failing between
            # our poll and the base's (microseconds) still gets torch's close.
            self._stop_local_workers(signal.SIGTERM)
        result = super()._monitor_workers(worker_group)
        if result.state == WorkerState.HEALTHY:
            fell_back = self.inprocess.poll(self, worker_group) if self.inprocess is not None else None
            if fell_back is not None:
                return fell_back
            mono = time.monotonic()
            beats = self._read_beats(worker_group)
            lost = self._node_watch(worker_group, beats, mono)
            if lost:
                return self._on_node_lost(worker_group, lost, time.time())
            finished = self._finished(worker_group)
            verdict = self.watchdog.check({r: b for r, b in beats.items() if r not in finished}, mono)
            if verdict is None:
                self._last_alive_mono = mono
                leave = self.watch.poll(lambda: self._live(worker_group, set()), self.leader)
                return result if leave is None else self._leave_for_spare(leave)
            return self._on_hang(worker_group, verdict, time.time(), mono)
        if result.state == WorkerState.FAILED:
            return self._on_exit(worker_group, result)
        if result.state == WorkerState.SUCCEEDED:
            self._close_attempt("completed", 0)
        return result

    def _leave_for_spare(self, reason: str) -> RunResult:
        """Straggler policy ``restart-now`` named a rank of this node and a spare waits: end this attempt as a
        planned interruption; the restart's health gate then excludes this node (`AgentWatch.exclusion_reasons`)
        and the spare takes its place in the rendezvous."""
        self._claim_failure()  # the peers' workers fail when ours stop: that is this restart, not a new failure
        self.emit(PlannedInterruption(time=time.time(), host=self.cfg.node_id, attempt=self.attempt, reason=reason))
        self._close_attempt("planned", None)
        self._stop_local_workers(signal.SIGTERM)
        self._remaining_restarts += 1  # a membership change is not a retry (torch's rule for joining nodes)
        return RunResult(state=WorkerState.FAILED)

    # --- lost nodes and node-level chaos (`trainguard.launch.nodes`) ---------------------------------

    def _peer_nodes(self) -> list[str]:
        """The other nodes of this attempt (from the heartbeat folders: cached once every rank has one)."""
        cached = self._peers_cache
        if cached is not None and cached[0] == self.attempt:
            return cached[1]
        members = nodes.attempt_nodes(self.layout, self.attempt)
        peers = [n for n in members if n != self.cfg.node_id]
        workers = self._worker_group.workers
        if workers and sum(len(r) for r in members.values()) >= workers[0].world_size:
            self._peers_cache = (self.attempt, peers)
        return peers

    def _node_watch(self, wg: WorkerGroup, beats: dict[int, Heartbeat | None], mono: float) -> list[nodes.LostNode]:
        """Fire this node's due node faults; twice a second, the peers that stopped beating."""
        if self.faults and all(b is not None for b in beats.values()):
            nodes.fire_due_faults(self.faults, self.cfg.node_id, self.attempt, [b.step for b in beats.values() if b],
                                  [int(w.id) for w in wg.workers if w.id is not None], self.layout.chaos_dir, self.emit)
        if mono - self._peers_polled_mono < 0.5 or wg.group_world_size in (None, 1):
            return []
        self._peers_polled_mono = mono
        return self.peers.observe(nodes.ring_successors(self._peer_nodes(), self.cfg.node_id), mono)

    def _lost_behind(self, codes: dict[int, int], kind: str, wg: WorkerGroup, mono: float) -> list[nodes.LostNode]:
        """Whether local ranks failed because a peer node died: their error exits (or aborts) are then an echo.
        Waits until every peer beat again after the failure, or one is lost (bounded: `PeerWatch.settle`)."""
        echo = kind == "exit" or all(c == -signal.SIGABRT for c in codes.values())
        if not echo or not wg.group_world_size or wg.group_world_size < 2:
            return []
        return self.peers.settle(self._peer_nodes(), mono)

    def _on_node_lost(self, wg: WorkerGroup, lost: list[nodes.LostNode], wall: float) -> RunResult:
        beats = self._read_beats(wg)
        steps = [b.step for b in beats.values() if b is not None]
        self._record_node_lost(lost, wall, min(steps) if steps else None)
        self._close_attempt("failure", None)
        self._apply_policy(beats, evidence.GatheredEvidence(self.diag_dir()))
        return RunResult(state=WorkerState.FAILED)

    def _record_node_lost(self, lost: list[nodes.LostNode], wall: float, step: int | None) -> None:
        """``FailureDetected`` (kind ``node-lost``), a ``Diagnosis``, and ``NodeExcluded`` for each lost node,
        by the one agent that claims the failure; the lost nodes' last beats and log tails become evidence."""
        if not self._claim_failure():
            return
        # The lost-node markers decide too: with c10d the store that answers the claim may have died with the node.
        if not [n for n in lost if nodes.mark_lost(self.cfg.run_dir, n.node, f"recorded by {self.cfg.node_id} in "
                                                   f"attempt {self.attempt}")]:
            return
        failure, *others = nodes.lost_records(self.layout, self.cfg.node_id, self.attempt, lost, wall, step,
                                              self.cfg.node_lost_timeout_seconds)
        self.failures.append(failure)
        for record in (failure, *others):
            self.emit(record)

    def record_lost_peers(self) -> list[str]:
        """After the agent lost its rendezvous (c10d's store dies with its host): record a peer that stopped
        beating as lost, waiting at most the lost-node timeout for the verdict. Returns the lost nodes."""
        try:
            if self.attempt < 0 or (self._worker_group.group_world_size or 1) < 2:
                return []
            lost = self.peers.settle(self._peer_nodes(), time.monotonic())
            if lost:
                self._record_node_lost(lost, time.time(), None)
            return [n.node for n in lost]
        except Exception as exc:  # the job is ending anyway: never hide why
            log.warning("could not check the peers after losing the rendezvous: %s", exc)
            return []

    def _exit_barrier(self) -> None:
        """torch's wait for every agent at the end, except that a peer found lost meanwhile ends it: a killed
        agent never arrives, and torch would wait its full 120 s for it."""
        if (self._worker_group.group_world_size or 1) < 2:
            return super()._exit_barrier()
        done = threading.Event()

        def barrier() -> None:
            try:
                super(GuardAgent, self)._exit_barrier()
            finally:
                done.set()

        threading.Thread(target=barrier, name="trainguard-exit-barrier", daemon=True).start()
        while not done.wait(0.5):
            lost = self.peers.observe(nodes.ring_successors(self._peer_nodes(), self.cfg.node_id), time.monotonic())
            if lost:
                log.warning("not waiting at the exit barrier for lost node(s) %s", ", ".join(n.node for n in lost))
                return None
        return None

    def _live(self, wg: WorkerGroup, exclude: set[int]) -> dict[int, int]:
        live = {}
        for w in wg.workers:
            if w.global_rank in exclude or w.id is None:
                continue
            try:
                os.kill(int(w.id), 0)
                live[w.global_rank] = int(w.id)
            except (OSError, ValueError):
                pass
        return live

    def _logs(self, wg: WorkerGroup) -> dict[int, list[Path]]:
        return {w.global_rank: [self.layout.rank_log(self.attempt, w.global_rank),
                                self.layout.rank_stdout(self.attempt, w.global_rank)]
                for w in wg.workers}

    def _on_exit(self, wg: WorkerGroup, result: RunResult) -> RunResult:
        if self._early is not None:
            codes, ev, wall, mono = self._early
            self._early = None
        else:
            wall, mono = time.time(), time.monotonic()
            codes = {r: f.exitcode for r, f in result.failures.items()}
            ev = evidence.gather(self.cfg.run_dir, self.diag_dir(), self._live(wg, set(codes)), self._logs(wg))
        failed = sorted(codes)
        culprits, kind = blame.crash_culprits(codes)
        beats = self._read_beats(wg)
        steps = [b.step for b in beats.values() if b is not None]
        detail = blame.crash_detail(codes)
        if self.watch.planned_leave(self.attempt) is not None:  # a node left for a waiting spare (restart-now)
            self._close_attempt("planned", None)
            self._remaining_restarts += 1  # a membership change is not a retry (torch's rule for joining nodes)
            return result
        if kind == "exit" and wg.group_world_size and wg.group_world_size > 1:
            time.sleep(0.5)  # an error exit may echo a crash on another node: let that node record it first
        lost = self._lost_behind(codes, kind, wg, mono)
        if lost:  # the echo of a node that died: nobody else records it; detected now, not at the exit
            self._record_node_lost(lost, time.time(), min(steps) if steps else None)
        elif self._claim_failure():
            self._record_failure(kind, culprits, mono - self._last_alive_mono, wall, min(steps) if steps else None,
                                 ev, detail, verdict="crash", explanation=detail,
                                 if_unknown=blame.unexplained_crash_note(codes, culprits))
        self._close_attempt("failure", codes[failed[0]] if failed else None)
        self._apply_policy(beats, ev)
        return result

    # --- silent data corruption ---------------------------------------------------------------------

    def _on_sdc(self, wg: WorkerGroup, marker: sdc.SdcMarker) -> RunResult:
        """The ranks found replicas that disagree: stop them, record it; rollback and exclusion follow at
        the restart (`_sdc_rollback`, `_sdc_exclusion`), once every node has stopped its workers."""
        wall = time.time()
        # The ranks wait for us: stop them before anything else so no save of corrupted state commits.
        self._stop_local_workers(signal.SIGTERM)
        nodes = self.layout.rank_nodes(self.attempt)
        self._sdc_pending = (marker, nodes)
        culprits = list(marker.culprit_ranks)
        hosts = tuple(sorted({nodes.get(r, self.cfg.node_id) for r in culprits}))
        plan = sdc.rollback_plan(self._committed_checkpoints(), marker.last_clean_step)
        if plan.resume_step is not None:
            rollback = (f"rolling back to the checkpoint of step {plan.resume_step} (newest at or before the last "
                        f"clean step {marker.last_clean_step})")
        elif plan.set_aside:
            rollback = (f"no checkpoint at or before the last clean step {marker.last_clean_step}: "
                        f"restarting from the beginning")
        else:
            rollback = (f"WARNING: no trainguard checkpoint to roll back to: the restart resumes from the "
                        f"script's own checkpoint, which may be newer than the last clean step "
                        f"{marker.last_clean_step} and still carry the corruption")
            log.warning("sdc: %s", rollback)
        if plan.set_aside:
            rollback += f"; checkpoints {', '.join(str(s) for s in plan.set_aside)} set aside"
        exclusion = self._exclusion_note(marker, nodes)
        who = "culprit" if marker.majority else "suspects (no majority)"
        detail = f"{marker.explanation}; {who}: ranks {', '.join(map(str, culprits))}; {rollback}; {exclusion}"
        if self._claim_failure():
            relative = str(sdc.marker_path(Path("."), self.attempt))
            record = FailureDetected(time=wall, host=self.cfg.node_id, attempt=self.attempt, kind="sdc",
                                     ranks=tuple(culprits), hosts=hosts,
                                     detection_latency_seconds=max(0.0, wall - marker.last_clean_time),
                                     step=marker.step, evidence=(relative,), detail=detail)
            self.failures.append(record)
            self.emit(record)
            self.emit(Diagnosis(time=time.time(), host=self.cfg.node_id, attempt=self.attempt,
                                category="Silent Data Corruption", group="GPU", verdict="sdc",
                                culprit_ranks=tuple(culprits), culprit_hosts=hosts,
                                confidence=0.9 if marker.majority else 0.5,
                                explanation=f"parameter fingerprints after step {marker.step}: "
                                            f"{marker.explanation}", evidence=(relative,)))
        self._close_attempt("failure", None)
        beats = self._read_beats(wg)
        self._apply_policy(beats, evidence.GatheredEvidence(self.diag_dir()))
        return RunResult(state=WorkerState.FAILED)

    def _exclusion_note(self, marker: sdc.SdcMarker, nodes: dict[int, str]) -> str:
        notes = []
        for node in sorted({nodes.get(r, self.cfg.node_id) for r in marker.culprit_ranks}):
            decision = sdc.exclusion_decision(marker, nodes, node, self.cfg.max_nodes)
            notes.append(f"node {node} excluded at the restart" if decision.exclude
                         else f"node {node} {decision.reason.partition('; ')[2]}")
        return "; ".join(notes) or "no node to exclude"

    def _committed_checkpoints(self) -> list[int]:
        from trainguard.checkpoint.manifest import committed_steps

        return committed_steps(self.cfg.checkpoint_dir)

    def _sdc_rollback(self) -> None:
        """Before the restart after corruption: move checkpoints newer than the last clean step aside
        (``.sdc-suspect-step-N-...``, kept as evidence), so the restore resumes from a clean one."""
        if self._sdc_pending is None:
            return
        marker, _ = self._sdc_pending
        self._sdc_pending = None
        plan = sdc.rollback_plan(self._committed_checkpoints(), marker.last_clean_step)
        for step in plan.set_aside:
            path = self.cfg.checkpoint_dir / f"step-{step}"
            aside = self.cfg.checkpoint_dir / f".sdc-suspect-step-{step}-a{marker.attempt}-{os.getpid()}"
            try:
                os.rename(path, aside)
            except FileNotFoundError:
                continue  # another node sharing the folder moved it first
            except OSError as exc:
                log.warning("sdc: cannot set aside %s (%s); the restore may pick it", path, exc)
                continue
            self.emit(CheckpointRejected(time=time.time(), host=self.cfg.node_id, attempt=marker.attempt, step=step,
                                         path=str(aside), reason=f"sdc: taken after the last clean step "
                                         f"{marker.last_clean_step} (corruption found after step {marker.step})"))

    def _wait_for_peer_dumps(self, wg: WorkerGroup, world: int) -> None:
        if len(wg.workers) >= world:
            return  # every rank is local: nothing else will arrive
        deadline = time.monotonic() + DUMP_WAIT_SECONDS
        while len(list(self.diag_dir().glob("fr_trace_rank_*.pkl"))) < world and time.monotonic() < deadline:
            time.sleep(0.2)

    def _on_hang(self, wg: WorkerGroup, verdict: Verdict, wall: float, mono: float) -> RunResult:
        world = wg.workers[0].world_size if wg.workers else 0
        if len(wg.workers) < world:  # ranks wait for a node that may be stopped or cut off as a whole
            lost = self.peers.settle(self._peer_nodes(), mono)
            if lost:
                return self._on_node_lost(wg, lost, time.time())
        ev = evidence.gather(self.cfg.run_dir, self.diag_dir(), self._live(wg, set()), self._logs(wg))
        self._wait_for_peer_dumps(wg, world)
        dumps = evidence.read_dumps(self.diag_dir())
        steps = {r: int(rep.get("step", verdict.last_steps.get(r, 0))) for r, rep in ev.replies.items()}
        for r, s in verdict.last_steps.items():
            steps.setdefault(r, s)
        found = blame.hang_culprits(blame.HangFacts(
            world_size=world, enqueued=dumps.enqueued, unreadable=dumps.unreadable, stopped=tuple(ev.stopped),
            unanswered=tuple(ev.unanswered), stale=verdict.stale_ranks, steps=steps))
        culprits, explanation = list(found.culprits), found.explanation
        verdict_name, diag_culprits, diag_explanation = "hang", culprits, explanation
        loc = evidence.localize(self.diag_dir(), self.layout.rank_nodes(self.attempt)) if dumps.enqueued else None
        if loc is not None and found.rule in ("enqueued", "no-dump", "steps", "none") and (
                not culprits or sorted(loc["culprit_ranks"]) == culprits):
            verdict_name, diag_culprits = loc["verdict"], loc["culprit_ranks"]
            diag_explanation = loc["explanation"]
            culprits = culprits or diag_culprits
        elif loc is not None:
            # The supervisor's own evidence (a stopped or frozen rank, or one short of the collective the
            # others wait in) decides; a different localization finding is kept as context.
            diag_explanation = f"{explanation}; localization said {loc['verdict']}: {loc['explanation']}"
        latency = mono - verdict.onset_mono
        detail = f"{verdict.reason}; {explanation}"
        if self._claim_failure():
            last = min(verdict.last_steps.values()) if verdict.last_steps else None
            self._record_failure("hang", culprits, latency, wall, last, ev, detail, verdict=verdict_name,
                                 explanation=diag_explanation, diagnosis_ranks=diag_culprits, backend=dumps.backend)
        self._close_attempt("failure", None)
        self._apply_policy(self._read_beats(wg), ev)
        if self.inprocess is not None and self.inprocess.recover(self, wg, culprits, "hang", kill=True):
            return RunResult(state=WorkerState.HEALTHY)  # the hung ranks were killed and replaced
        return RunResult(state=WorkerState.FAILED)

    def _classify(self, ev: evidence.GatheredEvidence, ranks: list[int], verdict: str,
                  backend: str | None) -> tuple[str, str, float, tuple[str, ...], str]:
        """(category, group, confidence, evidence lines, note) from the culprits' log tails."""
        note = ""
        given: str | None = verdict
        if verdict in _HANG_VERDICTS and backend != "nccl":
            # classify maps a hang verdict to "NCCL Watchdog Timeouts"; without NCCL evidence (a gloo job,
            # or no dump at all) that would be a guess presented as a finding, so only the logs decide.
            given = None
            note = f" (hang on {backend or 'an unknown backend'}: no NCCL evidence, category from logs only)"
        try:
            from trainguard.classify import classify_text

            text = "".join((ev.directory / f"log_tail_rank_{r}.txt").read_text() for r in ranks
                           if (ev.directory / f"log_tail_rank_{r}.txt").exists())
            c = classify_text(text, f"attempt-{self.attempt}", verdict=given)
            # The evidence lines themselves (not only file paths): the fleet database reads XID codes from them.
            return c.category, c.group, float(c.confidence), c.evidence_strings(), note
        except Exception as exc:  # classification must never stand in the way of recovery
            log.warning("classification of attempt %d failed: %s", self.attempt, exc)
            return "Unknown", "Unknown", 0.0, (), note

    def _record_failure(self, kind: str, ranks: list[int], latency: float, wall: float, step: int | None,
                        ev: evidence.GatheredEvidence, detail: str, *, verdict: str, explanation: str,
                        diagnosis_ranks: list[int] | None = None, backend: str | None = None,
                        if_unknown: str = "") -> None:
        record = FailureDetected(time=wall, host=self.cfg.node_id, attempt=self.attempt, kind=kind,
                                 ranks=tuple(ranks), hosts=self._hosts_of(ranks),
                                 detection_latency_seconds=max(0.0, latency), step=step,
                                 evidence=tuple(ev.files), detail=detail)
        self.failures.append(record)
        self.emit(record)
        category, group, confidence, lines, note = self._classify(ev, ranks, verdict, backend)
        if category == "Unknown":
            note += if_unknown  # say why nothing was found rather than only "Unknown"
        blamed = list(ranks if diagnosis_ranks is None else diagnosis_ranks)
        self.emit(Diagnosis(time=time.time(), host=self.cfg.node_id, attempt=self.attempt, category=category,
                            group=group, verdict=verdict, culprit_ranks=tuple(blamed),
                            culprit_hosts=self._hosts_of(blamed), confidence=confidence,
                            explanation=explanation + note, evidence=(*ev.files, *lines)))

    def _close_attempt(self, reason: str, exit_code: int | None) -> None:
        if not self._attempt_closed:
            self._attempt_closed = True
            self.emit(AttemptEnded(time=time.time(), host=self.cfg.node_id, attempt=self.attempt,
                                   reason=reason, exit_code=exit_code))

    def _apply_policy(self, beats: dict[int, Heartbeat | None], ev: evidence.GatheredEvidence) -> None:
        """Stop when several failed attempts in a row made no progress, or the budget is spent."""
        steps = [b.step for b in beats.values() if b is not None]
        steps += [int(rep["step"]) for rep in ev.replies.values() if isinstance(rep.get("step"), int)]
        outcome = AttemptOutcome(best_step=max(steps) if steps else None,
                                 latest_checkpoint=latest_checkpoint(self.cfg.checkpoint_dir))
        decision = self.policy.on_failure(outcome, int(getattr(self, "_remaining_restarts", 0)))
        if decision.stop:
            self.stop_reason = decision.reason
            self._remaining_restarts = 0

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        # A peer node failed, or left for a waiting spare (straggler restart-now): this attempt ends here too.
        planned = not self._attempt_closed and self.watch.planned_leave(self.attempt) is not None
        self._close_attempt("planned" if planned else "failure", None)
        super()._restart_workers(worker_group)

    # --- stopping -------------------------------------------------------------------------------

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        """Every stop (restart, hang, end of run, a signal to the agent) gets our grace, not torch's 30 s."""
        self._stop_local_workers(death_sig)
        # The base class closes log files and stops its watchdog and health-check server; the processes
        # are gone by now, so its own signal-and-wait finds nothing left to wait for.
        super()._shutdown(death_sig, timeout=1)

    def _stop_local_workers(self, death_sig: signal.Signals) -> None:
        handlers = getattr(self._pcontext, "subprocess_handlers", None) or {}
        procs = [h.proc for h in handlers.values() if h.proc.poll() is None]
        if procs:
            took = stop_processes(procs, self.cfg.stop_grace_seconds, death_sig)
            log.info("%d worker(s) of attempt %d stopped in %.2fs", len(procs), self.attempt, took)
