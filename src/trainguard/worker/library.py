"""`attach()`: what a training script calls to be watched: step/phase marks, events, heartbeats, evidence.

Under ``trainguard run`` the agent passes everything through the environment (``TRAINGUARD_*``, see
`trainguard.core.protocol.WorkerEnv`). Without an agent (plain ``python train.py`` or plain torchrun) the same
calls write local event files under ``trainguard-runs/<run id>/`` and nothing else; no failure of this
library ever stops training. A script's explicit steps win over the automatic optimizer hooks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from trainguard.chaos import faults as chaos
from trainguard.core import protocol
from trainguard.core.eventlog import EventWriter
from trainguard.core.events import Event
from trainguard.worker import runtime

log = logging.getLogger(__name__)

DEFAULT_PG_TIMEOUT_SECONDS = 1800.0


def pg_timeout() -> timedelta:
    """The process-group timeout the agent asks for (above its own hang timeout), else torch's default."""
    seconds = protocol.WorkerEnv.from_environ().pg_timeout_seconds or DEFAULT_PG_TIMEOUT_SECONDS
    return timedelta(seconds=max(seconds, 1.0))


@dataclass
class StepContext:
    """One step in progress: time its phases with `phase`, set `loss` before it ends."""

    worker: Worker
    step: int
    start: float
    """``time.monotonic()`` at the step's start."""
    phases: dict[str, float] = field(default_factory=dict)
    loss: float | None = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        self.worker._rt.set_phase(name)
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0


class Worker:
    """The in-rank side of trainguard as a script sees it. Build it with `attach`; ``with`` closes it."""

    def __init__(self, rt: runtime.Runtime) -> None:
        self._rt = rt
        self._step: StepContext | None = None
        self.run_dir: Path = rt.run_dir
        """This job's run directory (events, checkpoints, diagnostics)."""
        self.rank: int = rt.rank
        self.attempt: int = rt.attempt
        """Restart count of the job (0 for the first attempt)."""
        self.host: str = rt.host
        self.under_agent: bool = rt.env.under_agent
        """Whether ``trainguard run`` supervises this process."""

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def events(self) -> EventWriter | None:
        """The rank's event writer (``trainguard.Checkpointer(worker, ...)`` writes to it); None when off."""
        return self._rt.events

    def emit(self, record: Event) -> None:
        """Append a record to this rank's event file; never raises."""
        self._rt.emit(record)

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[StepContext]:
        """Mark one optimizer step (``step`` starts at 1). Faults scheduled for it fire on entry."""
        rt = self._rt
        rt.set_source("script")  # before the optimizer's hooks in this step: they no longer count
        if rt.injector is not None:
            rt.injector.on_step_start(step)
        ctx = StepContext(self, step, time.monotonic())
        rt.set_phase("step")
        self._step = ctx
        try:
            yield ctx
        finally:
            self._step = None
        end = time.monotonic()
        rt.complete_step(step, end - ctx.start, source="script", end_mono=end, phases=dict(ctx.phases),
                         loss=ctx.loss, numbering="script")
        if rt.sdc is not None:  # every K steps the replicas compare parameters (after the update)
            rt.sdc.on_step(step)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A phase inside or outside a step (e.g. a restore); the agent allows extra time for ``checkpoint``.

        On exit the phase before it is current again; inside a step its time joins the step's phases.
        """
        if self._rt.closed:  # after close the phase stays "done" (e.g. a checkpointer closed after the worker)
            yield
            return
        before = self._rt.phase
        step = self._step
        t0 = time.perf_counter()
        self._rt.set_phase(name)
        try:
            yield
        finally:
            if step is not None:
                step.phases[name] = step.phases.get(name, 0.0) + time.perf_counter() - t0
            self._rt.set_phase(before)

    def close(self) -> None:
        """Training is over for this rank: the agent stops applying the step timeout to it."""
        self._rt.close()


def _new_group() -> Any:
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            return dist.new_group(backend="gloo")
    except Exception as exc:
        log.warning("trainguard: cannot create the chaos group: %s", exc)
    return None


def attach(run_dir: str | os.PathLike[str] | None = None, *, rank: int | None = None) -> Worker:
    """Start trainguard's in-rank side. Call once per process, after ``init_process_group``.

    ``run_dir`` defaults to ``$TRAINGUARD_RUN_DIR`` (set by ``trainguard run``), else
    ``trainguard-runs/<TORCHELASTIC_RUN_ID or local>``. ``rank`` defaults to ``$RANK`` (0).
    From the script's first ``worker.step(...)`` on, its steps are the rank's progress (heartbeat source
    ``script``); until then, and for good in a script that never calls it, the optimizer's steps count as they do
    without this call, so that such a script's hangs are still found.
    """
    rt = runtime.acquire(run_dir=Path(run_dir) if run_dir is not None else None, rank=rank)
    rt.start_control()
    rt.start_background()
    if rt.injector is not None and rt.injector.chaos_group is None and chaos.Injector.needs_chaos_group(
            rt.injector.faults):
        # Every rank calls attach(), so every rank creates this group, in the same order.
        rt.injector.chaos_group = _new_group()
    try:
        from trainguard.sdc import check as sdc

        sdc.install(rt)
    except Exception as exc:  # the check is optional; training is not
        log.warning("trainguard: no SDC check (%s)", exc)
    return Worker(rt)
