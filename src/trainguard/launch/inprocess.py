"""The agent's side of in-process restart: replace only the failed ranks, let the survivors re-enter.

With ``--in-process`` a failure (a crashed rank, or a hung rank the agent kills) does not restart the worker
group. The agent opens the next attempt, starts one new process per failed local rank with that attempt's
environment, and publishes the attempt on its own store (``trainguard.core.protocol.inprocess_key``); the
surviving ranks, waiting in `trainguard.worker.inprocess.restartable`, re-form the process group with
them. If the group is not complete within the timeout, the agent falls back to a whole-process restart.
Single node only (the store lives in this agent, listening on loopback only; its keys are named and signed
with the job secret: `trainguard.worker.inprocess.SignedKeys`). Whether to restart in process, and the
attempt number and budget that go with it, are `trainguard.launch.attempts`'s decision (`InProcess`); this
module carries it out and reports how it ended (`InProcessDone`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState

from trainguard.core import protocol
from trainguard.core.events import Event, InProcessRecovery
from trainguard.core.protocol import RunLayout
from trainguard.launch.attempts import InProcess, InProcessDone
from trainguard.launch.config import SupervisorConfig
from trainguard.launch.local_rendezvous import loopback_server
from trainguard.launch.stop import stop_processes
from trainguard.launch.store_auth import StoreSigner, job_signer
from trainguard.launch.warm import WarmSpares
from trainguard.torch_api.elastic import WorkerProcesses
from trainguard.worker.inprocess import SignedKeys

log = logging.getLogger(__name__)


class RecoveryHost(Protocol):
    """What an in-process recovery needs from its node agent (`trainguard.launch.agent.GuardAgent`): the
    workers' processes and environment, the attempt's records, and a way to stop workers."""

    cfg: SupervisorConfig
    layout: RunLayout

    @property
    def attempt(self) -> int: ...

    def emit(self, record: Event) -> None: ...

    def worker_environ(self) -> dict[str, str]: ...

    def worker_processes(self) -> WorkerProcesses | None: ...

    def open_attempt(self, worker_group: WorkerGroup, recovery: str) -> None: ...

    def close_attempt(self, reason: str, exit_code: int | None) -> None: ...

    def stop_local_workers(self, death_sig: signal.Signals) -> None: ...


def _link_logs(agent: RecoveryHost, workers: WorkerProcesses, wg: WorkerGroup) -> None:
    """``logs/attempt-<k>/rank-<r>.log`` (and ``.stdout.log``) of an in-process attempt as links to the files
    the ranks keep writing (those of the attempt that started the process group's processes), so evidence
    and readers find every attempt's logs where the layout says."""
    for w in wg.workers:
        stdout, stderr = workers.log_files(w.local_rank)
        for target, link in ((stderr, agent.layout.rank_log(agent.attempt, w.global_rank)),
                             (stdout, agent.layout.rank_stdout(agent.attempt, w.global_rank))):
            if not target or os.path.lexists(link):
                continue
            try:
                link.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(os.path.abspath(target), link)
            except OSError as exc:  # logs are evidence, not a reason to stop the recovery
                log.warning("in-process restart: no log link %s (%s)", link, exc)


@dataclass(frozen=True)
class PendingRecovery:
    """An in-process recovery the agent started and has not seen complete yet."""

    attempt: int
    """The attempt the survivors and replacements form."""
    ranks: tuple[int, ...]
    """Global ranks that got new processes."""
    kind: str
    """What failed: ``crash``, ``exit`` or ``hang``."""
    started_mono: float
    """When the agent started the recovery (``time.monotonic()``)."""
    deadline_mono: float
    """After this, the recovery is abandoned for a whole-process restart."""
    warm: int = 0
    """How many of the new processes were warm spares."""


class InProcessRestarts:
    """The agent's in-process store and the recovery in progress."""

    def __init__(self, timeout_seconds: float, signer: StoreSigner, spares: WarmSpares | None = None,
                 fresh: bool = False) -> None:
        self.timeout_seconds = timeout_seconds
        self.fresh = fresh
        """Every local rank gets a new process after a failure (``--fresh-processes``), not only the failed."""
        self.spares = spares
        """Warm spare processes that take failed ranks' places (``--warm-spares``); None: cold processes."""
        self.keys = SignedKeys(signer)
        self.store = loopback_server(timedelta(seconds=max(timeout_seconds, 10.0)))
        self.pending: PendingRecovery | None = None

    @classmethod
    def build(cls, cfg: SupervisorConfig, spares: WarmSpares | None) -> InProcessRestarts | None:
        """The agent's in-process restarts as ``cfg`` asks (None without ``in_process``), drawing on the
        agent's warm spares."""
        if not cfg.in_process:
            return None
        # The workers read the same secret (the run directory's file, or the launcher's variable).
        return cls(cfg.in_process_timeout_seconds, job_signer(cfg.run_dir), spares, cfg.fresh_processes)

    def environ(self) -> dict[str, str]:
        """What every worker gets on top of the usual environment."""
        return {protocol.INPROCESS_STORE_ENV: f"127.0.0.1:{self.store.port}",
                protocol.INPROCESS_TIMEOUT_ENV: repr(float(self.timeout_seconds))}

    # --- carrying out a recovery -------------------------------------------------------------------

    def start(self, agent: RecoveryHost, wg: WorkerGroup, decision: InProcess) -> None:
        """Replace the processes of ``decision.ranks`` and start attempt ``decision.attempt`` in process.

        The failed attempt is already recorded and closed, and the agent's attempt number is already
        ``decision.attempt`` (`trainguard.launch.attempts.Attempts` counted it and charged the budget)."""
        workers = agent.worker_processes()
        if workers is None:  # `GuardAgent._replaceable` checked: torch's context is there
            raise RuntimeError("in-process restart without worker processes")
        local = {w.global_rank: w.local_rank for w in wg.workers}
        failed, kill = list(decision.ranks), decision.kill
        procs = workers.procs()
        if self.fresh:  # every rank anew; their evidence is already saved
            failed, kill = sorted(local), True
        if kill:  # a hung rank: its death breaks the survivors' collectives (gloo closes its sockets)
            stop_processes([procs[local[r]] for r in failed], agent.cfg.stop_grace_seconds, signal.SIGKILL)
        # Ranks that died meanwhile (an error of their own) are replaced too.
        dead = sorted({*failed, *(w.global_rank for w in wg.workers if procs[w.local_rank].poll() is not None)})
        env = agent.worker_environ()
        self.store.set(self.keys.key(decision.attempt, "env"), self.keys.seal(
            decision.attempt, "env", json.dumps({k: env[k] for k in protocol.INPROCESS_ATTEMPT_ENV if k in env})))
        agent.open_attempt(wg, recovery="in-process")
        warm = sum(self._replace(workers, wg, local[rank], env) for rank in dead)
        _link_logs(agent, workers, wg)
        # How many keep their processes: a script with a `trainguard.Replica` trains on with them until the new
        # processes arrive (`trainguard.worker.inprocess`).
        world = wg.workers[0].world_size if wg.workers else len(local)
        self.store.set(self.keys.key(decision.attempt, "survivors"), self.keys.seal(
            decision.attempt, "survivors", str(max(0, world - len(dead)))))
        self.store.set(self.keys.key(decision.previous, "next"),  # the survivors go
                       self.keys.seal(decision.previous, "next", str(decision.attempt)))
        now = time.monotonic()
        self.pending = PendingRecovery(decision.attempt, tuple(dead), decision.kind, now, now + self.timeout_seconds,
                                       warm)
        log.info("in-process restart: attempt %d, new processes for ranks %s", decision.attempt, list(dead))

    def _replace(self, workers: WorkerProcesses, wg: WorkerGroup, local_rank: int, env: dict[str, str]) -> bool:
        """Put a new process (a warm spare if one waits) in ``local_rank``'s place; True if it was a spare."""
        stdout, stderr = workers.log_files(local_rank)
        spare = None
        if self.spares is not None:
            spare = self.spares.take({**workers.env(local_rank), **env}, stdout, stderr)
        if spare is not None:
            log.info("in-process restart: warm spare pid %d takes local rank %d", spare.pid, local_rank)
        wg.workers[local_rank].id = workers.replace(local_rank, env, spare)
        return spare is not None

    # --- watching it --------------------------------------------------------------------------------

    def poll(self, agent: RecoveryHost, wg: WorkerGroup) -> InProcessDone | None:
        """Each monitor round: None while nothing changed; when the pending recovery completed, its record and
        ``InProcessDone(recovered=True)``; after its timeout ``InProcessDone(recovered=False)`` (the agent then
        calls `fall_back`)."""
        p = self.pending
        if p is None:
            return None
        joined = int(self.store.add(self.keys.key(p.attempt, "joined"), 0))
        world = wg.workers[0].world_size if wg.workers else 0
        now = time.monotonic()
        if joined >= world:
            self.pending = None
            agent.emit(InProcessRecovery(time=time.time(), host=agent.cfg.node_id, attempt=p.attempt,
                                         status="recovered", ranks=p.ranks, failure_kind=p.kind,
                                         seconds=now - p.started_mono, warm_spares_used=p.warm))
            return InProcessDone(recovered=True)
        if now < p.deadline_mono:
            return None
        return InProcessDone(recovered=False, why=f"{joined} of {world} ranks formed the process group within "
                                                  f"{self.timeout_seconds:g}s")

    def abandon(self, agent: RecoveryHost, why: str) -> None:
        """Record that the pending recovery failed; the whole-process restart that follows replaces it (its
        restart was given back: `Attempts` counts the try and its fallback as one)."""
        p = self.pending
        self.pending = None
        if p is None:
            return
        agent.emit(InProcessRecovery(time=time.time(), host=agent.cfg.node_id, attempt=p.attempt,
                                     status="fallback", ranks=p.ranks, failure_kind=p.kind,
                                     seconds=time.monotonic() - p.started_mono, warm_spares_used=p.warm,
                                     detail=why))
        log.warning("in-process restart abandoned (%s): restarting every worker", why)

    def fall_back(self, agent: RecoveryHost, why: str) -> RunResult:
        """Abandon the pending recovery: record it, end its attempt, stop every local worker."""
        self.abandon(agent, why)
        agent.close_attempt("failure", None)
        agent.stop_local_workers(signal.SIGTERM)
        return RunResult(state=WorkerState.FAILED)
