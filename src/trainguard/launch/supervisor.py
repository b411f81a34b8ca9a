"""`supervise`: run one node's agent to the end of the job and say how it ended."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainguard import errors
from trainguard.core.events import FailureDetected, RunEnded
from trainguard.core.protocol import read_heartbeat
from trainguard.core.rundir import RunDir
from trainguard.launch.config import SupervisorConfig, parse_signals

if TYPE_CHECKING:
    from trainguard.launch.lifetime import ProcessTracker
    from trainguard.launch.runlock import RunDirWatch
    from trainguard.launch.signals import StopSignals

log = logging.getLogger(__name__)

EXIT_COMPLETED = 0
EXIT_FAILED = 1
EXIT_EXCLUDED = errors.EXIT_EXCLUDED
"""This node was excluded by a health check or the lemon list; the job may go on elsewhere."""


@dataclass(frozen=True)
class SupervisorResult:
    """How one node's supervision ended."""

    exit_code: int
    status: str
    """``completed``, ``failed``, ``excluded`` or ``aborted``."""
    reason: str
    """Why it ended, one line."""
    attempts: int
    """Attempts this node took part in."""
    completed_steps: int | None
    """Last step every local rank completed in the final attempt (None if none)."""
    failures: list[FailureDetected] = field(default_factory=list)
    """Failures this node recorded."""
    unfired_faults: tuple[str, ...] = ()
    """Faults of the ``--inject`` schedule that never fired (no marker in ``chaos/``), as spec strings."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the rendezvous store of a single-node run binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _completed_steps(agent: Any) -> int | None:
    best = None
    for path in agent.hb_dir().glob("rank-*"):
        beat = read_heartbeat(path)
        if beat is not None and (best is None or beat.step < best):
            best = beat.step
    return best


@contextlib.contextmanager
def torch_agent_environment(cfg: SupervisorConfig) -> Iterator[None]:
    """The settings torch's elastic agent reads from this process's environment while it runs, set for
    the duration of one `supervise` call and restored afterwards (see docs/decisions.md)."""
    settings = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # gloo restarts need a fresh store per attempt
    if cfg.signals_to_handle is not None:  # read when the agent starts each attempt's workers
        settings["TORCHELASTIC_SIGNALS_TO_HANDLE"] = parse_signals(cfg.signals_to_handle)
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def supervise(cfg: SupervisorConfig) -> SupervisorResult:
    """Run the job's workers on this node until it completes, fails for good, or this node is excluded."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from trainguard.launch.lifetime import ProcessTracker
    from trainguard.launch.runlock import RunDirWatch, hold_run_dir
    from trainguard.launch.signals import StopSignals

    lock = hold_run_dir(cfg.run_dir, cfg.node_id)  # a live run holds the folder: RunDirBusyError (exit 2)
    # The stop signals are ours from here on (torch installs its own only when it first starts workers, after
    # the rendezvous and health checks): a signal in any phase stops the run, and is never forgotten.
    signals = StopSignals.from_setting(cfg.signals_to_handle)
    signals.install()
    # Before any worker exists: the lifeline ends the run's processes if this process dies, even by SIGKILL.
    lifetime = ProcessTracker()
    lifetime.start_lifeline()
    # The folder deleted or replaced: the watch stops the run as a SIGTERM does (only while ours handles it).
    watch = RunDirWatch(cfg.run_dir, lambda: os.kill(os.getpid(), signal.SIGTERM) if signals.active else None).start()
    try:
        with torch_agent_environment(cfg):
            return _supervise(cfg, signals, lifetime, watch)
    except SignalException as exc:  # before the agent existed: nothing started, nothing to close
        if watch.lost is not None:
            return SupervisorResult(errors.EXIT_STORAGE, "lost", watch.lost, 0, None)
        return SupervisorResult(130, "aborted", f"stopped by signal {exc.sigval}", 0, None)
    finally:
        watch.stop()
        lifetime.close()  # whatever of the run is still running (a setsid child of a finished worker) ends here
        signals.restore()
        lock.release()


def _check_torch() -> None:
    """Refuse (one line) when torch's elastic agent lacks the hooks trainguard runs on (docs/compatibility.md);
    the console says what only degrades the run (`trainguard.cli.run`)."""
    from trainguard.torch_api.features import probe

    support = probe()
    if not next(f.available for f in support.features if f.name == "launch"):
        from trainguard.torch_api.elastic import missing_hooks

        lacks = ", ".join(missing_hooks())
        raise errors.UnsupportedTorchError(f"torch {support.version}: the elastic agent lacks {lacks}; "
                                           "trainguard run cannot supervise workers on it (use torchrun)")


def _supervise(cfg: SupervisorConfig, signals: StopSignals, lifetime: ProcessTracker,
               watch: RunDirWatch) -> SupervisorResult:
    from torch.distributed.elastic.agent.server.api import WorkerSpec, WorkerState
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from trainguard.launch.agent import TORCH_ROUND_SLEEP_SECONDS, GuardAgent
    from trainguard.launch.store_link import RendezvousLostError

    _check_torch()
    RunDir(cfg.run_dir).create()
    handler = _rendezvous_handler(cfg)
    entry, args = worker_entry(cfg)
    spec = WorkerSpec(role=cfg.role, local_world_size=cfg.nproc_per_node, entrypoint=entry, args=args,
                      rdzv_handler=handler, max_restarts=cfg.max_restarts,
                      monitor_interval=min(cfg.monitor_interval_seconds, TORCH_ROUND_SLEEP_SECONDS))
    agent = GuardAgent(spec, cfg, signals=signals, lifetime=lifetime)
    status, reason, code = "failed", "", EXIT_FAILED
    store_lost = False
    try:
        result = agent.run()
        signals.disarm()
        if agent.excluded_reason is not None:
            status, reason, code = "excluded", f"node excluded: {agent.excluded_reason}", EXIT_EXCLUDED
        elif result is not None and result.state == WorkerState.SUCCEEDED:
            status, reason, code = "completed", "all workers finished", EXIT_COMPLETED
        else:
            reason = agent.stop_reason or f"restart budget spent ({cfg.max_restarts} restarts)"
    except SignalException as exc:
        signals.disarm()
        status, reason, code = "aborted", f"stopped by signal {exc.sigval}", 130
        agent.close_attempt("stopped", None)  # torch's run stopped the workers before re-raising
    except Exception as exc:  # the rendezvous store vanished, a peer agent died, ...
        signals.disarm()
        store_lost = isinstance(exc, RendezvousLostError)
        log.debug("agent failed", exc_info=True)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        status, reason = "failed", f"agent error: {exc.__class__.__name__}: {first[:300]}"
        if store_lost:
            reason = f"rendezvous lost: {exc}"
        lost = agent.record_lost_peers()  # with c10d the store dies with its host: say which node that was
        if lost:
            reason += f" (node {', '.join(lost)} lost)"
        agent.close_attempt("failure", None)
    finally:
        if agent.store_link is not None:
            agent.store_link.stop()
        if status in ("completed", "failed") and not store_lost:  # closing needs the store: it would hang
            try:
                handler.shutdown()
            except Exception as exc:
                log.debug("rendezvous shutdown: %s", exc)
    return _finish(cfg, agent, watch, status, reason, code)


def _rendezvous_handler(cfg: SupervisorConfig) -> Any:
    """torch's rendezvous handler for ``cfg``'s backend and endpoint; c10d and etcd-v2 keep their state signed
    with the job secret (`trainguard.launch.signed_rendezvous`): torch unpickles that state, so an unsigned
    one written by another user would run its code in the agent."""
    from trainguard.launch.local_rendezvous import loopback_host

    params = rendezvous_parameters(cfg)
    if cfg.rdzv_backend == "static":  # no pickled state: torch's own handler
        from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

        if cfg.max_nodes == 1:
            return _LoopbackWorkerStore(get_rendezvous_handler(params))
        return _FreshWorkerStore(get_rendezvous_handler(params), cfg.local_addr)
    from trainguard.launch.signed_rendezvous import signed_handler
    from trainguard.launch.store_auth import job_signer
    from trainguard.torch_api.endpoint import recognise_interface_addresses

    recognise_interface_addresses()

    # torch would host a loopback endpoint's store on every interface: bind it to loopback ourselves.
    loopback = loopback_host(cfg.rdzv_endpoint) if cfg.rdzv_backend == "c10d" else None
    handler = signed_handler(params, job_signer(cfg.run_dir), loopback)
    return _LoopbackWorkerStore(handler) if cfg.max_nodes == 1 else handler


def _finish(cfg: SupervisorConfig, agent: Any, watch: RunDirWatch, status: str, reason: str,
            code: int) -> SupervisorResult:
    """After the agent's run: the final beat and ``run_ended``, the lost-folder summary, the result."""
    if watch.lost is not None:  # whatever stopped the run, its folder is no longer the run's
        status, reason, code = "lost", f"{watch.lost} (stopped {watch.lost_after or 0:.1f}s after the start)", \
            errors.EXIT_STORAGE
    agent.beat.stop(status)  # a final state: peers must not take an ended agent for a lost node
    if agent.spares is not None:
        agent.spares.close()  # the waiting warm spares
    steps = _completed_steps(agent) if agent.attempt >= 0 else None
    ended = RunEnded(time=time.time(), host=cfg.node_id, run_id=cfg.run_id, status=status, reason=reason,
                     exit_code=code, completed_steps=steps)
    if agent.leader and status != "excluded":  # an excluded node no longer speaks for the job
        agent.emit(ended)
    if watch.lost is not None:
        reason = _keep_lost_run(cfg, agent, ended, reason)
    agent.events.close()
    return SupervisorResult(code, status, reason, agent.attempt + 1, steps, list(agent.failures),
                            unfired_faults(cfg) if watch.lost is None else ())


def _keep_lost_run(cfg: SupervisorConfig, agent: Any, ended: RunEnded, reason: str) -> str:
    """The run folder is gone or replaced: write what the run still knows elsewhere; the reason, with where."""
    from trainguard.launch.runlock import write_lost_summary

    summary = {"run_dir": str(cfg.run_dir), "run_id": cfg.run_id, "node": cfg.node_id, "lost": reason,
               "attempts": agent.attempt + 1, "run_ended": ended.to_dict(),
               "failures": [f.to_dict() for f in agent.failures]}
    where = write_lost_summary(cfg.run_dir, cfg.layout.agent_events(cfg.node_id), summary)
    return f"{reason}; what the run still knew is in {where}" if where else f"{reason}; nothing could be saved"


class _FreshWorkerStore:
    """torch's static rendezvous with a new worker store in every attempt.

    The static handler keeps one TCPStore for the whole run and tells the workers to use it
    (``use_agent_store``); their process-group keys carry no attempt, so after a restart gloo reads
    the dead attempt's addresses and hangs or fails to connect. As the c10d handler does with
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, rank 0's workers host a fresh store each attempt on a
    free port, published to the other nodes through the rendezvous store under the attempt's key.
    """

    def __init__(self, inner: Any, local_addr: str | None) -> None:
        self._inner = inner
        self._local_addr = local_addr
        self._round = 0

    @property
    def use_agent_store(self) -> bool:
        return False

    def next_rendezvous(self) -> Any:
        from torch.distributed import PrefixStore
        from torch.distributed.elastic.rendezvous import RendezvousInfo, RendezvousStoreInfo

        info = self._inner.next_rendezvous()
        keys = PrefixStore(f"trainguard/worker-store/{self._round}", info.store)
        self._round += 1
        bootstrap = RendezvousStoreInfo.build(info.rank, keys, local_addr=self._local_addr or
                                              info.bootstrap_store_info.master_addr)
        return RendezvousInfo(info.store, info.rank, info.world_size, bootstrap)

    def __getattr__(self, name: str) -> Any:  # everything else is the static handler's
        return getattr(self._inner, name)


class _LoopbackWorkerStore:
    """A one-node job: the workers' process-group store hosted by this agent on 127.0.0.1, a new one each round.

    Otherwise rank 0's worker hosts it through torch's ``env://`` start, and torch's TCPStore server listens
    on every interface whatever ``MASTER_ADDR`` says. Here the agent binds the socket itself
    (`trainguard.launch.local_rendezvous.loopback_server`) and tells the workers to join it as clients
    (``use_agent_store``: ``TORCHELASTIC_USE_AGENT_STORE=True``, ``MASTER_ADDR=127.0.0.1``); a fresh store per
    round keeps a restarted group off the dead attempt's keys, as `_FreshWorkerStore` does on several nodes.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._store: Any = None

    @property
    def use_agent_store(self) -> bool:
        return True

    def next_rendezvous(self) -> Any:
        from datetime import timedelta

        from torch.distributed.elastic.rendezvous import RendezvousInfo, RendezvousStoreInfo

        from trainguard.launch.local_rendezvous import loopback_server

        info = self._inner.next_rendezvous()
        self._store = loopback_server(timedelta(minutes=30))  # the last round's store goes with its workers
        return RendezvousInfo(info.store, info.rank, info.world_size,
                              RendezvousStoreInfo(master_addr="127.0.0.1", master_port=int(self._store.port)))

    def __getattr__(self, name: str) -> Any:  # everything else is the wrapped handler's
        return getattr(self._inner, name)


def worker_entry(cfg: SupervisorConfig) -> tuple[str, tuple[str, ...]]:
    """What each worker executes, as torchrun does: ``python -u script args``, ``python -u -m module
    args`` (``module``), or the command itself (``no_python``). ``-u``: unbuffered output, so the log
    files and the console see a rank's lines as it prints them."""
    command = list(cfg.command)
    if cfg.no_python:
        return command[0], tuple(command[1:])
    python = os.environ.get("PYTHON_EXEC", sys.executable)  # torchrun's override of the interpreter
    return python, ("-u", *(["-m"] if cfg.module else []), *command)


def rendezvous_parameters(cfg: SupervisorConfig) -> Any:
    """torch's rendezvous parameters for this node (c10d, etcd-v2 or static)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    extra: dict[str, Any] = dict(cfg.rdzv_conf)
    if cfg.rdzv_backend == "static":
        extra["rank"] = cfg.node_rank
    return RendezvousParameters(
        backend=cfg.rdzv_backend, endpoint=cfg.rdzv_endpoint, run_id=cfg.run_id,
        min_nodes=cfg.min_nodes, max_nodes=cfg.max_nodes, local_addr=cfg.local_addr,
        **{"join_timeout": cfg.join_timeout_seconds, "last_call_timeout": cfg.last_call_seconds,
           "close_timeout": cfg.rdzv_close_timeout_seconds, **extra},
    )


def unfired_faults(cfg: SupervisorConfig) -> tuple[str, ...]:
    """The faults of the schedule that left no marker: a rank fault writes ``chaos/fired-<index>``
    before firing, a node fault ``chaos/unhealthy-<node>``. With several nodes on run directories
    that are not shared, a fault fired on another node shows here as unfired."""
    from trainguard.chaos import faults as chaos

    try:
        faults = chaos.parse_spec(cfg.chaos)
    except errors.UsageError:  # validated before launch; nothing sensible to report otherwise
        return ()
    chaos_dir = cfg.layout.chaos_dir
    out = []
    for f in faults:
        marker = f"unhealthy-{f.node}" if f.kind == "unhealthy" else f"fired-{f.index}"
        if not (chaos_dir / marker).exists():
            out.append(f.to_spec())
    return tuple(out)
