"""The node agent: torch.distributed.elastic's LocalElasticAgent plus trainguard's watch, evidence and policy.

The elastic agent keeps doing what it does well (c10d rendezvous across nodes, starting, stopping and
restarting the local workers, the restart budget). trainguard hooks into four of its steps:

* ``_rendezvous``: before every (re)start, applies node-level chaos, runs health checks and leaves
  the job (`NodeExcludedExit`) when a high-severity check fails or the host is a known lemon;
* ``_start_workers``: passes the attempt, heartbeat folder, chaos schedule and process-group timeout
  to the workers and records ``AttemptStarted``;
* ``_monitor_workers``: sees crashes (a process exited) and hangs (heartbeats stopped past the learned
  timeout), and on either gathers evidence from every live rank *before* returning the failure, since
  the base agent SIGTERMs the workers as soon as it sees one;
* ``_restart_workers``: closes the attempt's records and applies the no-progress rule.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.rendezvous import RendezvousGracefulExitError

from trainguard import chaos
from trainguard.eventlog import EventWriter
from trainguard.events import (
    AttemptEnded,
    AttemptStarted,
    Diagnosis,
    Event,
    FailureDetected,
    FaultInjected,
    HealthCheckResult,
    NodeExcluded,
    RunStarted,
)
from trainguard.launch import evidence
from trainguard.launch.config import SupervisorConfig
from trainguard.launch.logs import RunDirLogs
from trainguard.launch.watchdog import Watchdog
from trainguard.worker import parse_heartbeat
from trainguard.worker.library import HEARTBEAT_BYTES

log = logging.getLogger(__name__)


class NodeExcludedExit(RendezvousGracefulExitError):
    """This node failed a high-severity health check (or is a lemon) and leaves the job."""


def latest_checkpoint(directory: Path) -> int | None:
    """Newest committed checkpoint step (manifest present; verification happens in the workers' restore)."""
    from trainguard.checkpoint import latest_step

    step = latest_step(directory)
    return int(step) if step is not None else None


class GuardAgent(LocalElasticAgent):
    """One per node. Build with `trainguard.launch.supervisor.supervise`."""

    def __init__(self, spec: Any, cfg: SupervisorConfig) -> None:
        self.cfg = cfg
        self.attempt = -1
        super().__init__(spec, logs_specs=RunDirLogs(cfg, lambda: self.attempt), exit_barrier_timeout=120,
                         shutdown_timeout=5)
        self.events = EventWriter(cfg.run_dir / "events" / f"agent-{cfg.node_id}.jsonl")
        self.watchdog = Watchdog(cfg.watchdog)
        self.faults = chaos.parse_spec(cfg.chaos)
        self.start_time = time.time()
        self.leader = False
        self.run_started_written = False
        self.stop_reason: str | None = None
        self.excluded_reason: str | None = None
        self.failures: list[FailureDetected] = []
        self._best_ckpt: int | None = None
        self._no_progress = 0
        self._attempt_closed = True
        self._last_alive = time.time()
        self._early: tuple[dict[int, int], evidence.Evidence, float] | None = None
        for name in ("trainguard.classify", "trainguard.localize", "trainguard.checkpoint"):
            # import now what the first failure needs, not inside the restart's critical path
            importlib.import_module(name)

    # --- helpers --------------------------------------------------------------------------------

    def emit(self, record: Event) -> None:
        self.events.write(record)

    def hb_dir(self) -> Path:
        return self.cfg.run_dir / "heartbeats" / self.cfg.node_id / f"attempt-{self.attempt}"

    def _read_beats(self, wg: WorkerGroup) -> dict[int, dict[str, Any] | None]:
        beats: dict[int, dict[str, Any] | None] = {}
        for w in wg.workers:
            try:
                with open(self.hb_dir() / f"rank-{w.global_rank}", "rb") as fh:
                    beats[w.global_rank] = parse_heartbeat(fh.read(HEARTBEAT_BYTES))
            except OSError:
                beats[w.global_rank] = None
        return beats

    def _rank_hosts(self) -> dict[int, str]:
        """Which node ran each rank in this attempt, from the heartbeat folders (shared run dir)."""
        out: dict[int, str] = {}
        for path in (self.cfg.run_dir / "heartbeats").glob(f"*/attempt-{self.attempt}/rank-*"):
            with contextlib.suppress(ValueError):
                out[int(path.name[len("rank-"):])] = path.parent.parent.name
        return out

    def _hosts_of(self, ranks: list[int]) -> tuple[str, ...]:
        where = self._rank_hosts()
        return tuple(sorted({where.get(r, self.cfg.node_id) for r in ranks}))

    def _claim_failure(self) -> bool:
        """Only one node records a failure that several nodes see."""
        store = getattr(self, "_store", None)
        if store is None:
            return True
        try:
            key = f"trainguard/{self.cfg.run_id}/failure/{self.attempt}"
            won = store.compare_set(key, "", self.cfg.node_id)
            return bytes(won).decode() == self.cfg.node_id
        except Exception:
            return True

    # --- before every (re)start -----------------------------------------------------------------

    def _apply_node_chaos(self) -> None:
        for f in self.faults:
            if f.kind != "unhealthy" or f.node != self.cfg.node_id:
                continue
            if (f.attempt if f.attempt is not None else 0) != self.attempt:
                continue
            marker = self.cfg.run_dir / "chaos" / f"unhealthy-{self.cfg.node_id}"
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"{f.to_spec()}\n")
            self.emit(FaultInjected(time=time.time(), host=self.cfg.node_id, attempt=self.attempt,
                                    rank=-1, step=0, kind="unhealthy", params={"node": self.cfg.node_id}))

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
        self.leader = worker_group.group_rank == 0
        if self.leader and not self.run_started_written:
            self.run_started_written = True
            ws = worker_group.workers[0].world_size if worker_group.workers else 0
            self.emit(RunStarted(time=self.start_time, host=self.cfg.node_id, run_id=self.cfg.run_id,
                                 world_size=ws, nnodes=worker_group.group_world_size or 1,
                                 target_steps=self.cfg.target_steps, config=self.cfg.to_json()))

    def _attempts_ended(self) -> int:
        """1 + the highest attempt any agent of this run dir closed (0 when none did)."""
        top = -1
        for path in (self.cfg.run_dir / "events").glob("agent-*.jsonl"):
            with contextlib.suppress(OSError):
                for line in path.read_text().splitlines():
                    if '"attempt_ended"' in line:
                        with contextlib.suppress(ValueError, KeyError, TypeError):
                            top = max(top, int(json.loads(line)["attempt"]))
        return top + 1

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        env = {
            "TRAINGUARD_AGENT": "1",
            "TRAINGUARD_RUN_DIR": str(self.cfg.run_dir),
            "TRAINGUARD_ATTEMPT": str(self.attempt),
            "TRAINGUARD_HEARTBEAT_DIR": str(self.hb_dir()),
            "TRAINGUARD_CHAOS": self.cfg.chaos,
            "TRAINGUARD_NODE": self.cfg.node_id,
            "TRAINGUARD_PG_TIMEOUT_SECONDS": str(self.cfg.pg_timeout_seconds()),
        }
        os.environ.update(env)
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        now = time.time()
        self.watchdog.new_attempt(now)
        self._last_alive = now
        resume = latest_checkpoint(self.cfg.checkpoint_dir)
        ws = worker_group.workers[0].world_size if worker_group.workers else 0
        self.emit(AttemptStarted(time=now, host=self.cfg.node_id, attempt=self.attempt, world_size=ws,
                                 hosts=(self.cfg.node_id,), resume_step=resume))
        self._attempt_closed = False
        self._early = None
        return super()._start_workers(worker_group)

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

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        early = self._exited_early(worker_group)
        if early and self._early is None:
            now = time.time()
            ev = evidence.gather(self.cfg.run_dir, self.cfg.run_dir / "diagnostics" / f"attempt-{self.attempt}",
                                 self._live(worker_group, set(early)), self._logs(worker_group))
            self._early = (early, ev, now)
        result = super()._monitor_workers(worker_group)
        now = time.time()
        if result.state == WorkerState.HEALTHY:
            beats = self._read_beats(worker_group)
            for rank, beat in beats.items():
                if beat is not None:
                    self.watchdog.observe(rank, beat)
            verdict = self.watchdog.check(beats, now)
            if verdict is None:
                self._last_alive = now
                return result
            return self._on_hang(worker_group, verdict, now)
        if result.state == WorkerState.FAILED:
            return self._on_exit(worker_group, result, now)
        if result.state == WorkerState.SUCCEEDED:
            self._close_attempt("completed", 0)
        return result

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
        d = self.cfg.run_dir / "logs" / f"attempt-{self.attempt}"
        return {w.global_rank: [d / f"rank-{w.global_rank}.log", d / f"rank-{w.global_rank}.stdout.log"]
                for w in wg.workers}

    def _on_exit(self, wg: WorkerGroup, result: RunResult, now: float) -> RunResult:
        if self._early is not None:
            codes, ev, now = self._early
            self._early = None
        else:
            codes = {r: f.exitcode for r, f in result.failures.items()}
            ev = evidence.gather(self.cfg.run_dir, self.cfg.run_dir / "diagnostics" / f"attempt-{self.attempt}",
                                 self._live(wg, set(codes)), self._logs(wg))
        failed = sorted(codes)
        culprits, kind = evidence.crash_culprits(codes)
        signalled = kind == "crash"
        beats = self._read_beats(wg)
        steps = [b["step"] for b in beats.values() if b is not None]
        detail = ", ".join(f"rank {r} exit code {codes[r]}" for r in failed)
        if not signalled and wg.group_world_size and wg.group_world_size > 1:
            time.sleep(0.5)  # an error exit may echo a crash on another node: let that node record it first
        if self._claim_failure():
            self._record_failure(kind, culprits, now - self._last_alive, now, min(steps) if steps else None,
                                 ev, detail, verdict="crash", explanation=detail)
        self._close_attempt("failure", codes[failed[0]] if failed else None)
        self._apply_policy()
        return result

    def _on_hang(self, wg: WorkerGroup, verdict: Any, now: float) -> RunResult:
        diag = self.cfg.run_dir / "diagnostics" / f"attempt-{self.attempt}"
        live = self._live(wg, set())
        ev = evidence.gather(self.cfg.run_dir, diag, live, self._logs(wg))
        world = wg.workers[0].world_size if wg.workers else 0
        deadline = time.time() + 3.0  # other nodes dump into the same folder when it is shared
        while len(list(diag.glob("fr_trace_rank_*.pkl"))) < world and time.time() < deadline:
            if len(wg.workers) == world:
                break
            time.sleep(0.2)
        steps = {r: int(rep.get("step", verdict.last_steps.get(r, 0))) for r, rep in ev.replies.items()}
        loc = evidence.localize(diag, self._rank_hosts())
        culprits, explanation = evidence.simple_culprits(diag, steps, world)
        verdict_name, diag_culprits, diag_explanation = "hang", culprits, explanation
        if loc is not None and (not culprits or sorted(loc["culprit_ranks"]) == culprits):
            verdict_name, diag_culprits = loc["verdict"], loc["culprit_ranks"]
            diag_explanation = loc["explanation"]
            culprits = culprits or diag_culprits
        elif loc is not None:
            # The supervisor saw a rank stop short of the collective the others wait in; a different
            # localization finding is kept as context, not as the verdict.
            diag_explanation = f"{explanation}; localization said {loc['verdict']}: {loc['explanation']}"
        detail = (f"no step completed for {now - verdict.onset:.1f}s (timeout {verdict.timeout_seconds:.1f}s); "
                  f"{explanation}")
        if self._claim_failure():
            last = min(verdict.last_steps.values()) if verdict.last_steps else None
            self._record_failure("hang", culprits, now - verdict.onset, now, last, ev, detail,
                                 verdict=verdict_name, explanation=diag_explanation,
                                 diagnosis_ranks=diag_culprits)
        self._close_attempt("failure", None)
        self._apply_policy()
        return RunResult(state=WorkerState.FAILED)

    def _record_failure(self, kind: str, ranks: list[int], latency: float, now: float, step: int | None,
                        ev: evidence.Evidence, detail: str, *, verdict: str, explanation: str,
                        diagnosis_ranks: list[int] | None = None) -> None:
        record = FailureDetected(time=now, host=self.cfg.node_id, attempt=self.attempt, kind=kind,
                                 ranks=tuple(ranks), hosts=self._hosts_of(ranks),
                                 detection_latency_seconds=max(0.0, latency), step=step,
                                 evidence=tuple(ev.files), detail=detail)
        self.failures.append(record)
        self.emit(record)
        category, group, confidence = "Unknown", "Unknown", 0.5
        lines: tuple[str, ...] = ()
        try:
            from trainguard.classify import classify_text

            text = "".join((ev.directory / f"log_tail_rank_{r}.txt").read_text() for r in ranks
                           if (ev.directory / f"log_tail_rank_{r}.txt").exists())
            c = classify_text(text, f"attempt-{self.attempt}", verdict=verdict)
            category, group, confidence = c.category, c.group, float(c.confidence)
            # The evidence lines themselves (not only file paths): the fleet database reads XID codes from them.
            lines = c.evidence_strings()
        except Exception as exc:  # classification must never stand in the way of recovery
            log.warning("classification of attempt %d failed: %s", self.attempt, exc)
        self.emit(Diagnosis(time=time.time(), host=self.cfg.node_id, attempt=self.attempt, category=category,
                            group=group, verdict=verdict,
                            culprit_ranks=tuple(ranks if diagnosis_ranks is None else diagnosis_ranks),
                            culprit_hosts=self._hosts_of(list(ranks if diagnosis_ranks is None
                                                             else diagnosis_ranks)),
                            confidence=confidence,
                            explanation=explanation, evidence=(*ev.files, *lines)))

    def _close_attempt(self, reason: str, exit_code: int | None) -> None:
        if not self._attempt_closed:
            self._attempt_closed = True
            self.emit(AttemptEnded(time=time.time(), host=self.cfg.node_id, attempt=self.attempt,
                                   reason=reason, exit_code=exit_code))

    def _apply_policy(self) -> None:
        """Stop when no new checkpoint appeared across several failed attempts, or the budget is spent."""
        latest = latest_checkpoint(self.cfg.checkpoint_dir)
        if latest is not None and (self._best_ckpt is None or latest > self._best_ckpt):
            self._best_ckpt, self._no_progress = latest, 0
        else:
            self._no_progress += 1
        if self._no_progress >= self.cfg.max_no_progress_attempts:
            self.stop_reason = (f"no progress: no new checkpoint across {self._no_progress} failed attempts "
                                f"(latest: {self._best_ckpt})")
            self._remaining_restarts = 0
        elif self._remaining_restarts <= 0:
            self.stop_reason = f"restart budget spent ({self.cfg.max_restarts} restarts)"

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        self._close_attempt("failure", None)  # a peer node failed: this attempt ends here too
        super()._restart_workers(worker_group)
