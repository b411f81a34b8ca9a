"""What the node agent does once something failed: a worker's exit, a hang verdict, corruption found, a lost node or
a straggler leaving for a spare. Each is recorded (`trainguard.launch.failures`), turned into an `attempts` event,
and the decision `Attempts.decide` returns is carried out. A base of `trainguard.launch.agent.GuardAgent`, which
owns the state it reads."""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState

from trainguard.core.events import PlannedInterruption
from trainguard.launch import attempts, blame, evidence, nodes
from trainguard.launch.failures import hang_finding, latest_checkpoint, wait_for_peer_dumps
from trainguard.launch.hang_latency import hang_latency
from trainguard.launch.policy import AttemptOutcome
from trainguard.launch.watchdog import Verdict
from trainguard.sdc import verdict as sdc

if TYPE_CHECKING:
    from pathlib import Path

    from trainguard.core.events import Event
    from trainguard.core.protocol import Heartbeat, RunLayout
    from trainguard.launch.attempts import Attempts
    from trainguard.launch.config import SupervisorConfig
    from trainguard.launch.failures import FailureRecorder
    from trainguard.launch.framework_progress import FrameworkCheckpoints
    from trainguard.launch.inprocess import InProcessRestarts
    from trainguard.sdc.response import CorruptionResponse
    from trainguard.stragglers.watch import AgentWatch
    from trainguard.torch_api.elastic import WorkerProcesses

log = logging.getLogger(__name__)


class FailureResponse:
    """The agent's failure paths. The names below are the agent's (declared for type checking only, so that none
    of them shadows the agent's or torch's own at run time)."""

    if TYPE_CHECKING:
        cfg: SupervisorConfig
        layout: RunLayout
        ledger: Attempts
        recorder: FailureRecorder
        corruption: CorruptionResponse
        inprocess: InProcessRestarts | None
        watch: AgentWatch
        peers: nodes.AttemptPeers
        framework_checkpoints: FrameworkCheckpoints
        _early: tuple[dict[int, int], evidence.GatheredEvidence, float, float] | None
        _last_alive_mono: float

        @property
        def attempt(self) -> int: ...

        def emit(self, record: Event) -> None: ...

        def diag_dir(self) -> Path: ...

        def worker_environ(self) -> dict[str, str]: ...

        def worker_processes(self) -> WorkerProcesses | None: ...

        def open_attempt(self, worker_group: WorkerGroup, recovery: str, warm_starts: int = 0) -> None: ...

        def close_attempt(self, reason: str, exit_code: int | None) -> None: ...

        def stop_local_workers(self, death_sig: signal.Signals) -> None: ...

        def _read_beats(self, wg: WorkerGroup) -> dict[int, Heartbeat | None]: ...

        def _job_world_size(self) -> int: ...

        def _gather(self, wg: WorkerGroup, exclude: set[int]) -> evidence.GatheredEvidence: ...

    def _leave_for_spare(self, reason: str) -> RunResult:
        """Straggler policy ``restart-now`` named a rank of this node and a spare waits: end this attempt as a
        planned interruption; the restart's health gate then excludes this node (`AgentWatch.exclusion_reasons`)
        and the spare takes its place in the rendezvous."""
        # The peers' workers fail when ours stop: that is this restart, not a new failure.
        self.recorder.claim(self.attempt)
        self.emit(PlannedInterruption(time=time.time(), host=self.cfg.node_id, attempt=self.attempt, reason=reason))
        self.close_attempt("planned", None)
        self.stop_local_workers(signal.SIGTERM)
        self.ledger.decide(attempts.StragglerLeave(reason, this_node=True))  # gives its restart back
        return RunResult(state=WorkerState.FAILED)

    # --- failures: what happened is `trainguard.launch.failures`'s, corruption `trainguard.sdc.response`'s,
    # --- what follows `trainguard.launch.attempts`'s

    def _on_exit_in_process(self, wg: WorkerGroup) -> RunResult:
        """Workers exited with an error under ``--in-process`` (their evidence is gathered): recorded as always,
        then replaced in process if the decision says so; otherwise the rest stop for a whole-process restart."""
        result = self._on_exit(wg, RunResult(state=WorkerState.FAILED))
        if result.state != WorkerState.HEALTHY:
            self.stop_local_workers(signal.SIGTERM)
        return result

    def _exit_evidence(self, wg: WorkerGroup, result: RunResult
                       ) -> tuple[dict[int, int], evidence.GatheredEvidence, float, float]:
        """Exit codes, evidence and detection times: those `on_monitor` gathered early, or gathered now."""
        if self._early is not None:
            early, self._early = self._early, None
            return early
        wall, mono = time.time(), time.monotonic()
        codes = {r: f.exitcode for r, f in result.failures.items()}
        return codes, self._gather(wg, set(codes)), wall, mono

    def _on_exit(self, wg: WorkerGroup, result: RunResult) -> RunResult:
        codes, ev, wall, mono = self._exit_evidence(wg, result)
        failed = sorted(codes)
        kind = blame.crash_culprits(codes)[1]
        echo = self._may_echo(codes, kind, wg)
        if echo and kind == "exit":
            time.sleep(0.5)  # an error exit may echo a crash on another node: let that node record it first
        beats = self._read_beats(wg)
        # A node left for a waiting spare (restart-now), or a peer restarted the round for a node waiting to
        # join: our workers failed because theirs stopped. A planned restart, no failure (and no retry spent).
        left = self.watch.planned_leave(self.attempt) or (self.recorder.rejoin_announced(self.attempt) if echo
                                                           else None)
        if left is not None:
            self.close_attempt("planned", None)
            self.ledger.decide(attempts.StragglerLeave(left, this_node=False))
            return result
        steps = [b.step for b in beats.values() if b is not None]
        lost = self._record_exit(wg, codes, ev, wall, mono, min(steps) if steps else None)
        self.close_attempt("failure", codes[failed[0]] if failed else None)
        outcome = self._outcome(beats, ev)
        event: attempts.Event = attempts.NodeLost(outcome) if lost else attempts.Crash(
            tuple(failed), blame.crash_culprits(codes)[1], outcome, self._replaceable(wg, failed))
        return self._act(self.ledger.decide(event), wg, result)

    def _record_exit(self, wg: WorkerGroup, codes: dict[int, int], ev: evidence.GatheredEvidence, wall: float,
                     mono: float, step: int | None) -> bool:
        """Write the failure records of workers that exited; True when they were the echo of a lost node."""
        culprits, kind = blame.crash_culprits(codes)
        lost = self._lost_behind(codes, kind, wg, mono)
        if lost:  # the echo of a node that died: nobody else records it; detected now, not at the exit
            self.recorder.record_node_lost(self.attempt, lost, time.time(), step)
        elif self.recorder.claim(self.attempt):
            detail = blame.crash_detail(codes)
            self.recorder.record(self.attempt, kind, culprits, mono - self._last_alive_mono, wall, step, ev, detail,
                                 verdict="crash", explanation=detail,
                                 if_unknown=blame.unexplained_crash_note(codes, culprits))
        return bool(lost)

    def _on_hang(self, wg: WorkerGroup, verdict: Verdict, wall: float, mono: float) -> RunResult:
        world = wg.workers[0].world_size if wg.workers else 0
        if len(wg.workers) < world:  # ranks wait for a node that may be stopped or cut off as a whole
            lost = self.peers.settle(self.attempt, self._job_world_size(), mono)
            if lost:
                return self._on_node_lost(wg, lost, time.time())
        ev = self._gather(wg, set())
        wait_for_peer_dumps(self.diag_dir(), len(wg.workers), world)
        found = hang_finding(ev, verdict, world, self.layout, self.attempt)
        latency = hang_latency(self.layout, self.attempt, list(range(world)), wall, mono - verdict.onset_mono)
        detail = f"{verdict.reason}; {found.explanation}"
        if self.recorder.claim(self.attempt):
            last = min(verdict.last_steps.values()) if verdict.last_steps else None
            self.recorder.record(self.attempt, "hang", found.culprits, latency.seconds, wall, last, ev, detail,
                                 verdict=found.verdict, explanation=found.diagnosis_explanation,
                                 diagnosis_ranks=found.diagnosis_ranks, backend=found.backend,
                                 latency_from=latency.origin)
        self.close_attempt("failure", None)
        hang = attempts.Hang(tuple(found.culprits), self._outcome(self._read_beats(wg), ev),
                             self._replaceable(wg, found.culprits))
        return self._act(self.ledger.decide(hang), wg, RunResult(state=WorkerState.FAILED))

    def _on_sdc(self, wg: WorkerGroup, marker: sdc.SdcMarker) -> RunResult:
        """The ranks found replicas that disagree: stop them, record it; rollback and exclusion follow at
        the restart (`CorruptionResponse`), once every node has stopped its workers."""
        wall = time.time()
        # The ranks wait for us: stop them before anything else so no save of corrupted state commits.
        self.stop_local_workers(signal.SIGTERM)
        self.corruption.record(marker, self.attempt, wall)
        self.close_attempt("failure", None)
        outcome = self._outcome(self._read_beats(wg), evidence.GatheredEvidence(self.diag_dir()))
        return self._act(self.ledger.decide(attempts.Corruption(outcome)), wg, RunResult(state=WorkerState.FAILED))

    def _outcome(self, beats: dict[int, Heartbeat | None], ev: evidence.GatheredEvidence) -> AttemptOutcome:
        """What the failed attempt achieved, for the no-progress rule: its best step (heartbeats and the ranks'
        replies), the newest checkpoint, trainguard's and the script's framework's."""
        steps = [b.step for b in beats.values() if b is not None]
        steps += [int(rep["step"]) for rep in ev.replies.values() if isinstance(rep.get("step"), int)]
        return AttemptOutcome(best_step=max(steps) if steps else None,
                              latest_checkpoint=latest_checkpoint(self.cfg.checkpoint_dir),
                              framework_checkpoint=self.framework_checkpoints.latest())

    def _replaceable(self, wg: WorkerGroup, ranks: list[int]) -> bool:
        """Whether an in-process restart could replace ``ranks``: all on this node, a one-node job, processes
        that torch's context lets us swap."""
        local = {w.global_rank for w in wg.workers}
        return (self.worker_processes() is not None and (wg.group_world_size or 1) <= 1
                and all(r in local for r in ranks))

    def _act(self, decision: attempts.Decision, wg: WorkerGroup, failed: RunResult) -> RunResult:
        """Carry out the decision after a failure: an in-process restart goes on HEALTHY; anything else returns
        ``failed`` to torch's loop, which restarts the group while `restarts_left` allows."""
        abandoned = decision.abandoned if isinstance(decision, attempts.Restart | attempts.Stop) else None
        if abandoned is not None and self.inprocess is not None:
            self.inprocess.abandon(self, abandoned)
        if isinstance(decision, attempts.InProcess) and self.inprocess is not None:
            self.inprocess.start(self, wg, decision)
            return RunResult(state=WorkerState.HEALTHY)  # only the failed ranks were replaced
        if isinstance(decision, attempts.Stop):
            log.info("attempt %d failed; no restart: %s", self.attempt, decision.reason)
        return failed

    @staticmethod
    def _may_echo(codes: dict[int, int], kind: str, wg: WorkerGroup) -> bool:
        """Whether local ranks' ends (``kind`` from `blame.crash_culprits`) may be the echo of something on another
        node: error exits (or aborts, as gloo and NCCL do when a peer's connection resets) in a job of several
        nodes."""
        quiet = kind == "exit" or all(c == -signal.SIGABRT for c in codes.values())
        return quiet and (wg.group_world_size or 0) > 1

    def _lost_behind(self, codes: dict[int, int], kind: str, wg: WorkerGroup, mono: float) -> list[nodes.LostNode]:
        """Whether local ranks failed because a peer node died: their error exits (or aborts) are then an echo.
        Waits until every peer beat again after the failure, or one is lost (bounded: `PeerWatch.settle`)."""
        if not self._may_echo(codes, kind, wg):
            return []
        return self.peers.settle(self.attempt, self._job_world_size(), mono)

    def _on_node_lost(self, wg: WorkerGroup, lost: list[nodes.LostNode], wall: float) -> RunResult:
        beats = self._read_beats(wg)
        steps = [b.step for b in beats.values() if b is not None]
        self.recorder.record_node_lost(self.attempt, lost, wall, min(steps) if steps else None)
        self.close_attempt("failure", None)
        outcome = self._outcome(beats, evidence.GatheredEvidence(self.diag_dir()))
        return self._act(self.ledger.decide(attempts.NodeLost(outcome)), wg, RunResult(state=WorkerState.FAILED))
