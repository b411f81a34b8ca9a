"""`attach()`: what a training script calls to be watched: step/phase marks, events, heartbeats, evidence.

Under ``trainguard run`` the agent passes everything through the environment (``TRAINGUARD_*``).
Without an agent (plain ``python train.py`` or plain torchrun) the same calls write local event files
under ``trainguard-runs/<run id>/`` and nothing else; no failure of this library ever stops training.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from trainguard import chaos
from trainguard.eventlog import EventWriter
from trainguard.events import Event, FaultInjected, StepCompleted

log = logging.getLogger(__name__)

HEARTBEAT_BYTES = 160
"""Fixed size of a heartbeat file: rewritten in place with one ``pwrite`` per step and phase."""
DEFAULT_PG_TIMEOUT_SECONDS = 1800.0


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def pg_timeout() -> timedelta:
    """The process-group timeout the agent asks for (above its own hang timeout), else torch's default."""
    try:
        seconds = float(os.environ.get("TRAINGUARD_PG_TIMEOUT_SECONDS", DEFAULT_PG_TIMEOUT_SECONDS))
    except ValueError:
        seconds = DEFAULT_PG_TIMEOUT_SECONDS
    return timedelta(seconds=max(seconds, 1.0))


def parse_heartbeat(data: bytes) -> dict[str, Any] | None:
    """Parse a heartbeat file's bytes (see `Worker._beat`); None if empty or torn."""
    text = data.rstrip(b"\0 \n").decode(errors="replace")
    parts = dict(p.split("=", 1) for p in text.split()[1:] if "=" in p)
    try:
        return {
            "step": int(parts["step"]),
            "time": float(parts["t"]),
            "duration_seconds": float(parts["dur"]),
            "phase": parts["phase"],
            "phase_start": float(parts["pt"]),
            "steps_done": int(parts["n"]),
        }
    except (KeyError, ValueError):
        return None


@dataclass
class _Status:
    step: int = 0
    steps_done: int = 0
    phase: str = "init"

    def snapshot(self) -> dict[str, Any]:
        return {"step": self.step, "steps_done": self.steps_done, "phase": self.phase}


@dataclass
class StepContext:
    """One step in progress: time its phases with `phase`, set `loss` before it ends."""

    worker: Worker
    step: int
    start: float
    phases: dict[str, float] = field(default_factory=dict)
    loss: float | None = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        self.worker._beat(name)
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0


class Worker:
    """The in-rank side of trainguard. Build it with `attach`."""

    def __init__(self, run_dir: Path, *, rank: int, attempt: int, host: str, agent: bool) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.attempt = attempt
        self.host = host
        self.under_agent = agent
        self._status = _Status()
        self.events: EventWriter | None = None
        try:
            self.events = EventWriter(run_dir / "events" / f"rank-{rank}.jsonl")
        except Exception as exc:
            log.warning("trainguard: no event file (%s); continuing without events", exc)
        self._hb_fd: int | None = None
        hb_dir = os.environ.get("TRAINGUARD_HEARTBEAT_DIR")
        if hb_dir:
            try:
                Path(hb_dir).mkdir(parents=True, exist_ok=True)
                self._hb_fd = os.open(Path(hb_dir) / f"rank-{rank}", os.O_WRONLY | os.O_CREAT, 0o644)
            except OSError as exc:
                log.warning("trainguard: no heartbeat file (%s)", exc)
        self._last_step_end = time.time()
        self._last_duration = 0.0
        self._phase_start = self._last_step_end
        self._beat("init")
        self._control: Any = None
        if agent:
            try:
                from trainguard.worker.control import ControlThread

                prewarm = os.environ.get("TRAINGUARD_FR_PREWARM", "1") != "0"
                self._control = ControlThread(rank, self._status, prewarm=prewarm)
            except OSError as exc:
                log.warning("trainguard: no control channel (%s)", exc)
        self._injector: chaos.Injector | None = None
        faults = []
        try:
            faults = chaos.parse_spec(os.environ.get("TRAINGUARD_CHAOS"))
        except Exception as exc:
            log.warning("trainguard: ignoring bad TRAINGUARD_CHAOS: %s", exc)
        if faults:
            group = None
            if chaos.Injector.needs_chaos_group(faults):
                group = _new_group()
            self._injector = chaos.Injector(
                faults,
                rank=rank,
                attempt=attempt,
                marker_dir=run_dir / "chaos",
                record=self._record_fault,
                chaos_group=group,
            )

    # --- events ---------------------------------------------------------------------------------

    def emit(self, record: Event) -> None:
        """Append a record to this rank's event file; never raises."""
        if self.events is None:
            return
        try:
            self.events.write(record)
        except Exception as exc:
            log.warning("trainguard: event write failed (%s); events off for this rank", exc)
            self.events = None

    def _record_fault(self, fault: chaos.Fault, step: int) -> None:
        params = dict(fault.params)
        if fault.node is not None:
            params["node"] = fault.node
        self.emit(
            FaultInjected(
                time=time.time(), host=self.host, attempt=self.attempt, rank=self.rank,
                step=step, kind=fault.kind, params=params,
            )
        )

    # --- progress -------------------------------------------------------------------------------

    def _beat(self, phase: str) -> None:
        now = time.time()
        self._status.phase = phase
        self._phase_start = now
        if self._hb_fd is None:
            return
        s = self._status
        line = (
            f"v1 step={s.step} t={self._last_step_end:.6f} dur={self._last_duration:.6f} "
            f"phase={phase} pt={now:.6f} n={s.steps_done}\n"
        ).encode()
        try:
            os.pwrite(self._hb_fd, line.ljust(HEARTBEAT_BYTES, b" "), 0)
        except OSError:
            self._hb_fd = None

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[StepContext]:
        """Mark one optimizer step (``step`` starts at 1). Faults scheduled for it fire on entry."""
        if self._injector is not None:
            self._injector.on_step_start(step)
        ctx = StepContext(self, step, time.time())
        self._beat("step")
        yield ctx
        end = time.time()
        duration = end - ctx.start
        self._status.step = step
        self._status.steps_done += 1
        self._last_step_end = end
        self._last_duration = duration
        if self._injector is not None:
            self._injector.note_step_seconds(duration)
        self._beat("idle")
        self.emit(
            StepCompleted(
                time=end, host=self.host, attempt=self.attempt, rank=self.rank, step=step,
                duration_seconds=duration, phases=dict(ctx.phases), loss=ctx.loss,
            )
        )

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A phase outside any step (e.g. a restore); the agent allows extra time for ``checkpoint``."""
        self._beat(name)
        try:
            yield
        finally:
            self._beat("idle")

    def close(self) -> None:
        """Training is over for this rank: the agent stops applying the step timeout to it."""
        self._beat("done")
        if self._control is not None:
            self._control.close()
        if self.events is not None:
            self.events.close()
        if self._hb_fd is not None:
            os.close(self._hb_fd)
            self._hb_fd = None


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
    """
    agent = os.environ.get("TRAINGUARD_AGENT") == "1"
    if run_dir is None:
        env_dir = os.environ.get("TRAINGUARD_RUN_DIR")
        run_dir = env_dir or Path("trainguard-runs") / os.environ.get("TORCHELASTIC_RUN_ID", "local")
    if rank is None:
        rank = _env_int("RANK", 0)
    attempt = _env_int("TRAINGUARD_ATTEMPT", _env_int("TORCHELASTIC_RESTART_COUNT", 0))
    host = os.environ.get("TRAINGUARD_NODE") or socket.gethostname()
    return Worker(Path(run_dir), rank=rank, attempt=attempt, host=host, agent=agent)
