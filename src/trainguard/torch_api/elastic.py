"""torch.distributed.elastic's agent with its private hooks as named methods, and its worker processes.

`ElasticAgentBase` is torch's ``LocalElasticAgent`` (rendezvous, starting and restarting local workers, the
exit barrier). Its per-round hooks are private methods; here each is overridden once and forwarded to an
``on_*`` method a subclass overrides, with ``torch_*`` calling torch's own behaviour. The restart budget is
the subclass's (`restarts_left`): torch's private counter is set from it in one place, after every monitor
round, right before torch's loop reads it. `WorkerProcesses` is the view of torch's process context that
in-process restarts need (each worker's process, environment and log files; replacing one process).
`torch_start_workers` can hand some local ranks to processes started ahead (warm spares) instead of the
cold processes torch would start, through the one factory torch's process context makes its handles with.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import api as mp_api
from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

log = logging.getLogger(__name__)

HOOKS = ("_rendezvous", "_start_workers", "_monitor_workers", "_restart_workers", "_shutdown", "_exit_barrier")
"""torch's private agent methods `ElasticAgentBase` overrides."""
STATE = ("_pcontext", "_remaining_restarts", "_store")
"""torch's private agent attributes it reads or writes."""


HANDLER_FACTORY = "get_subprocess_handler"
"""The name torch's process context (``multiprocessing.api``) builds each worker's process handle with."""

Adopt = Callable[[int, dict[str, str], str | None, str | None], "subprocess.Popen[bytes] | None"]
"""``(local_rank, environment, stdout path, stderr path) -> a process that took the rank, or None``."""


def can_adopt() -> bool:
    """Whether the installed torch builds worker handles through `HANDLER_FACTORY` (warm starts need it)."""
    return callable(getattr(mp_api, HANDLER_FACTORY, None))


@contextmanager
def _adopting(adopt: Adopt) -> Iterator[None]:
    """While inside, torch's process context asks ``adopt`` first for each local rank's process; a rank it
    declines is started by torch as usual."""
    original = getattr(mp_api, HANDLER_FACTORY)

    def factory(**kw: Any) -> SubprocessHandler:
        if kw.get("numa_options") is not None:  # torch wraps the command for NUMA binding: only it can start it
            return original(**kw)
        local_rank = int(kw["local_rank_id"])
        env = {**os.environ, **{str(k): str(v) for k, v in kw["env"].items() if v is not None}}
        proc = adopt(local_rank, env, kw.get("stdout") or None, kw.get("stderr") or None)
        return _AdoptedHandler(proc, local_rank) if proc is not None else original(**kw)

    setattr(mp_api, HANDLER_FACTORY, factory)
    try:
        yield
    finally:
        setattr(mp_api, HANDLER_FACTORY, original)


def missing_hooks() -> list[str]:
    """torch agent internals this module relies on that the installed torch lacks (empty: all there)."""
    missing = [h for h in HOOKS if not callable(getattr(LocalElasticAgent, h, None))]
    try:
        source = inspect.getsource(LocalElasticAgent) + inspect.getsource(LocalElasticAgent.__mro__[1])
    except (OSError, TypeError):
        source = ""
    missing += [f"attribute {a}" for a in STATE if source and f"self.{a}" not in source]
    return missing


_SHUTDOWN_TAKES_TIMEOUT = "timeout" in inspect.signature(LocalElasticAgent._shutdown).parameters


class ElasticAgentBase(LocalElasticAgent):
    """torch's LocalElasticAgent with named hooks. Subclasses override the ``on_*`` methods and
    `restarts_left`; they never touch torch's private members."""

    _tg_budget_synced: int = 0
    """torch's restart counter as last set from `restarts_left` (a lower value means torch charged a restart)."""

    def __init__(self, spec: Any, *, logs_specs: Any, exit_barrier_timeout: float, shutdown_timeout: int,
                 log_line_prefix: str | None = None) -> None:
        accepted = inspect.signature(LocalElasticAgent.__init__).parameters
        kwargs: dict[str, Any] = {"logs_specs": logs_specs, "exit_barrier_timeout": exit_barrier_timeout}
        if "shutdown_timeout" in accepted:
            kwargs["shutdown_timeout"] = shutdown_timeout
        if "log_line_prefix_template" in accepted:
            kwargs["log_line_prefix_template"] = log_line_prefix
        super().__init__(spec, **kwargs)
        if "log_line_prefix_template" not in accepted and log_line_prefix is not None:
            self._log_line_prefix_template = log_line_prefix
        self._tg_budget_synced = int(self._remaining_restarts)

    # --- what subclasses override (defaults: torch's behaviour) ------------------------------------------

    def on_rendezvous(self, worker_group: WorkerGroup) -> None:
        """Before every (re)start: join the round."""
        self.torch_rendezvous(worker_group)

    def on_start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        """Start the local workers; returns local rank -> worker id (pid)."""
        return self.torch_start_workers(worker_group)

    def on_monitor(self, worker_group: WorkerGroup) -> RunResult:
        """One monitor round (every ``monitor_interval``): the group's state."""
        return self.torch_monitor(worker_group)

    def on_restart_workers(self, worker_group: WorkerGroup, counted: bool) -> None:
        """Restart the group: ``counted`` when torch charged it to the restart budget (a failure), False for a
        membership change (a node joined or a peer's failure restarted the round)."""
        self.torch_restart_workers(worker_group)

    def on_exit_barrier(self) -> None:
        """After the group succeeded: wait for the other agents."""
        self.torch_exit_barrier()

    def on_shutdown(self, death_sig: signal.Signals) -> None:
        """Every stop of the local workers (restart, end of run, a signal to the agent)."""
        self.torch_shutdown(death_sig, timeout=30)

    def on_torch_stopped_restarts(self) -> None:
        """torch's own monitor disabled restarts (a worker stuck in uninterruptible sleep, torch 2.13+)."""

    def restarts_left(self) -> int:
        """The restart budget torch's loop checks after each failed round (default: torch's own)."""
        return int(self._remaining_restarts)

    # --- torch's own behaviour -----------------------------------------------------------------------------

    def torch_rendezvous(self, worker_group: WorkerGroup) -> None:
        super()._rendezvous(worker_group)

    def torch_start_workers(self, worker_group: WorkerGroup, adopt: Adopt | None = None) -> dict[int, Any]:
        """torch's start of the local workers; with ``adopt``, the ranks it takes run in its processes."""
        if adopt is None or not can_adopt():
            return super()._start_workers(worker_group)
        with _adopting(adopt):
            return super()._start_workers(worker_group)

    def torch_monitor(self, worker_group: WorkerGroup) -> RunResult:
        before = self._remaining_restarts
        result = super()._monitor_workers(worker_group)
        if before > 0 and self._remaining_restarts == 0:
            self.on_torch_stopped_restarts()
        return result

    def torch_restart_workers(self, worker_group: WorkerGroup) -> None:
        super()._restart_workers(worker_group)

    def torch_exit_barrier(self) -> None:
        super()._exit_barrier()

    def torch_shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        if _SHUTDOWN_TAKES_TIMEOUT:
            super()._shutdown(death_sig, timeout)
        else:  # torch 2.11: no timeout (its close waits 30 s)
            super()._shutdown(death_sig)

    # --- state torch keeps privately -----------------------------------------------------------------------

    def worker_processes(self) -> WorkerProcesses | None:
        """The running workers' processes (None before the first start)."""
        pc = getattr(self, "_pcontext", None)
        return WorkerProcesses(pc) if pc is not None and hasattr(pc, "subprocess_handlers") else None

    def rendezvous_store(self) -> Any:
        """The store of the current rendezvous round (it changes at every restart), or None before one."""
        return getattr(self, "_store", None)

    # --- torch's private hooks, forwarded ------------------------------------------------------------------

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        self.on_rendezvous(worker_group)

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        return self.on_start_workers(worker_group)

    def _monitor_workers(self, worker_group: WorkerGroup) -> RunResult:
        result = self.on_monitor(worker_group)
        # torch's loop reads its counter right after this returns: the one place it is set from ours.
        synced = max(0, int(self.restarts_left()))
        self._remaining_restarts = synced
        self._tg_budget_synced = synced
        return result

    def _restart_workers(self, worker_group: WorkerGroup) -> None:
        counted = self._remaining_restarts < self._tg_budget_synced  # torch charged this restart
        self._tg_budget_synced = int(self._remaining_restarts)
        self.on_restart_workers(worker_group, counted)

    def _exit_barrier(self) -> None:
        self.on_exit_barrier()

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        self.on_shutdown(death_sig)


class WorkerProcesses:
    """torch's process context of the local workers, as in-process restarts use it."""

    def __init__(self, pcontext: Any) -> None:
        self._pc = pcontext

    def procs(self) -> dict[int, subprocess.Popen[bytes]]:
        """Local rank -> the worker's process."""
        return {lr: h.proc for lr, h in (self._pc.subprocess_handlers or {}).items()}

    def env(self, local_rank: int) -> dict[str, str]:
        """The environment torch started ``local_rank`` with (on top of the agent's)."""
        return dict(self._pc.envs[local_rank])

    def log_files(self, local_rank: int) -> tuple[str | None, str | None]:
        """``(stdout, stderr)`` files of ``local_rank`` (None: not redirected)."""
        return self._pc.stdouts.get(local_rank) or None, self._pc.stderrs.get(local_rank) or None

    def replace(self, local_rank: int, env: dict[str, str], proc: subprocess.Popen[bytes] | None = None) -> int:
        """Put a new process in ``local_rank``'s place: ``proc`` (a warm spare that opened the rank's logs
        itself) or, without one, the rank's command started anew with its environment plus ``env``, its logs
        appended to. The old process must have ended. Returns the new pid."""
        old = self._pc.subprocess_handlers[local_rank]
        for stream in (getattr(old, "_stdout", None), getattr(old, "_stderr", None)):
            if stream is not None:
                stream.close()
        handler: SubprocessHandler
        if proc is not None:
            handler = _AdoptedHandler(proc, local_rank)
        else:
            stdout, stderr = self.log_files(local_rank)
            handler = _AppendingHandler(self._pc.entrypoint, self._pc.args[local_rank],
                                        {**self.env(local_rank), **env}, stdout, stderr, local_rank)
        self._pc.subprocess_handlers[local_rank] = handler
        return int(handler.proc.pid)


class _AppendingHandler(SubprocessHandler):
    """torch's worker process handle, but its log files are appended to, not truncated: the replacement of a
    rank writes after its predecessor's lines, in the files the console tailer already follows."""

    def __init__(self, entrypoint: str, args: tuple[Any, ...], env: dict[str, str], stdout: str | None,
                 stderr: str | None, local_rank: int) -> None:
        self._stdout = open(stdout, "a") if stdout else None  # noqa: SIM115 (closed by SubprocessHandler.close)
        self._stderr = open(stderr, "a") if stderr else None  # noqa: SIM115
        self.local_rank_id = local_rank
        self.proc = self._popen((entrypoint, *[str(a) for a in args]), {**os.environ, **env})


class _AdoptedHandler(SubprocessHandler):
    """torch's worker process handle around a process started elsewhere (a warm spare that took a rank)."""

    def __init__(self, proc: subprocess.Popen[bytes], local_rank: int) -> None:
        self._stdout = None
        self._stderr = None
        self.local_rank_id = local_rank
        self.proc = proc
