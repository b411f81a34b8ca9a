"""The one per-process state of trainguard's worker side, shared by `attach()` and the automatic hooks.

It owns the heartbeat file, the rank's event file, the chaos injector, the control thread and a
background thread that refreshes the heartbeat every `TICK_SECONDS` (``alive_mono``), reads collective
progress from the flight recorder once a default process group exists, starts the control thread and
pre-warms the first dump. Nothing here may stop or slow training: every failure is logged once and
turns the failing part off.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import sys
import threading
import time
import traceback
import weakref
from pathlib import Path
from types import TracebackType
from typing import Any

from trainguard.chaos import faults as chaos
from trainguard.core.eventlog import EventWriter
from trainguard.core.events import Event, FaultInjected, StepCompleted
from trainguard.core.protocol import PROCESS_STATE_FILE, SOURCES, Heartbeat, RunLayout, WorkerEnv, heartbeat_name
from trainguard.core.safefs import open_heartbeat
from trainguard.worker.control import ControlThread, dump_flight_recorder, torch_ready, write_evidence
from trainguard.worker.progress import SETTLED_BACKEND, CollectiveStatus, CollectiveTracker, read_pg_status

log = logging.getLogger(__name__)

TICK_SECONDS = 1.0
"""How often the background thread refreshes the heartbeat and polls the flight recorder."""

_ALL: weakref.WeakSet[Runtime] = weakref.WeakSet()
_current: Runtime | None = None
_current_lock = threading.Lock()


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() and len(value) < 10 else default


def default_run_dir(env: WorkerEnv) -> Path:
    """``$TRAINGUARD_RUN_DIR``, else ``trainguard-runs/<TORCHELASTIC_RUN_ID or local>`` (no agent)."""
    if env.run_dir is not None:
        return env.run_dir
    return Path("trainguard-runs") / os.environ.get("TORCHELASTIC_RUN_ID", "local")


class Runtime:
    """Heartbeat, events, chaos and threads of one worker process. Get it with `acquire`."""

    def __init__(self, env: WorkerEnv, *, rank: int, run_dir: Path) -> None:
        self.env = env
        self.rank = rank
        self.run_dir = run_dir
        self.attempt = env.attempt
        self.host = env.node or socket.gethostname()
        self.closed = False
        self._disabled = False  # set in a forked child: the parent's files are not the child's to write
        self._lock = threading.Lock()
        now = time.monotonic()
        self.step = 0
        self.steps_done = 0
        self.progress_mono = now
        self.duration_seconds = 0.0
        self.phase = "init"
        self.phase_start_mono = now
        self.source = "none"
        self.step_owner: str | None = None
        """The framework whose adapter counts this process's steps right now (``transformers``,
        ``lightning``; `trainguard.worker.frameworks`); None: the optimizer hooks count them."""
        self.collectives = CollectiveStatus(0, 0.0)
        self._tracker = CollectiveTracker()
        self._pg_seen = False
        self._prewarm_pending = env.fr_prewarm and env.under_agent
        self.events: EventWriter | None = None
        try:
            self.events = EventWriter(RunLayout(run_dir).rank_events(rank))
        except Exception as exc:
            log.warning("trainguard: no event file (%s); continuing without events", exc)
        self._hb_fd: int | None = None
        if env.heartbeat_dir is not None:
            try:
                self._hb_fd = open_heartbeat(env.heartbeat_dir, heartbeat_name(rank))
            except OSError as exc:
                log.warning("trainguard: no heartbeat file (%s)", exc)
        self.injector: chaos.Injector | None = None
        try:
            faults = chaos.parse_spec(env.chaos)
        except Exception as exc:
            log.warning("trainguard: ignoring bad TRAINGUARD_CHAOS: %s", exc)
            faults = []
        if faults:
            self.injector = chaos.Injector(faults, rank=rank, attempt=self.attempt,
                                           marker_dir=RunLayout(run_dir).chaos_dir, record=self._record_fault)
        self.sdc: Any = None
        """The silent-data-corruption check (`trainguard.sdc.check.SdcChecker`) once installed."""
        self._control: ControlThread | None = None
        self._control_tried = False
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self.beat()
        _ALL.add(self)

    # --- status ---------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {"step": self.step, "steps_done": self.steps_done, "phase": self.phase, "source": self.source}

    def beat(self) -> None:
        """Rewrite the heartbeat file in place (one ``pwrite``); never raises."""
        fd = self._hb_fd
        if fd is None or self._disabled:
            return
        with self._lock:
            now = time.monotonic()
            try:
                data = Heartbeat(step=self.step, steps_done=self.steps_done, progress_mono=self.progress_mono,
                                 duration_seconds=self.duration_seconds, phase=self.phase,
                                 phase_start_mono=self.phase_start_mono, source=self.source,
                                 collectives_done=self.collectives.collectives_done,
                                 pending_since_mono=self.collectives.pending_since_mono, alive_mono=now).encode()
                os.pwrite(fd, data, 0)
            except (OSError, ValueError) as exc:
                log.warning("trainguard: heartbeat write failed (%s); heartbeats off for this rank", exc)
                self._hb_fd = None

    def set_phase(self, name: str) -> None:
        self.phase = name
        self.phase_start_mono = time.monotonic()
        self.beat()

    def set_source(self, source: str) -> None:
        """``script`` (trainguard.attach()) wins over ``optimizer`` (automatic hooks) for good."""
        assert source in SOURCES
        if self.source != "script":
            self.source = source

    def resume_at(self, step: int) -> None:
        """This rank's state is that of ``step`` (healed from a live peer): the heartbeat says so before the rank
        completes a step of its own. No step is counted or recorded."""
        if self._disabled:
            return
        self.step = step
        self.beat()

    def complete_step(self, step: int, duration_seconds: float, *, source: str, end_mono: float | None = None,
                      phases: dict[str, float] | None = None, loss: float | None = None,
                      phase: str = "idle", numbering: str = "", epoch: float | None = None,
                      emit: bool = True) -> StepCompleted | None:
        """Record one completed step: status, heartbeat, ``StepCompleted`` event, chaos's step clock.

        ``numbering`` says where ``step`` comes from (`StepCompleted.numbering`). With ``emit=False`` the
        record is returned instead of written, for a caller that learns the step's loss a moment later and
        writes it then (`emit`); its ``time`` is still the step's end. None when this process is disabled.
        """
        if self._disabled:
            return None
        end = time.monotonic() if end_mono is None else end_mono
        self.set_source(source)
        self.step = step
        self.steps_done += 1
        self.progress_mono = end
        self.duration_seconds = duration_seconds
        self.phase = phase
        self.phase_start_mono = end
        if self._pg_seen:
            status = read_pg_status(only_backend=SETTLED_BACKEND)
            if status is not None:
                self._tracker.settle(status)
        self.beat()
        if self.injector is not None:
            self.injector.note_step_seconds(duration_seconds)
        record = StepCompleted(time=time.time(), host=self.host, attempt=self.attempt, rank=self.rank, step=step,
                               duration_seconds=duration_seconds, phases=phases or {}, loss=loss,
                               numbering=numbering, epoch=epoch)
        if emit:
            self.emit(record)
        return record

    # --- events ---------------------------------------------------------------------------------

    def emit(self, record: Event) -> None:
        """Append a record to this rank's event file; never raises."""
        events = self.events
        if events is None or self._disabled:
            return
        try:
            events.write(record)
        except Exception as exc:
            log.warning("trainguard: event write failed (%s); events off for this rank", exc)
            self.events = None

    def _record_fault(self, fault: chaos.Fault, step: int) -> None:
        params = dict(fault.params)
        if fault.node is not None:
            params["node"] = fault.node
        self.emit(FaultInjected(time=time.time(), host=self.host, attempt=self.attempt, rank=self.rank, step=step,
                                kind=fault.kind, params=params))

    # --- threads --------------------------------------------------------------------------------

    def start_control(self) -> None:
        """Serve the agent's requests (only under an agent; once)."""
        if self._control_tried or self.env.agent_pid is None or self._disabled or self.closed:
            return
        self._control_tried = True
        evidence = self.env.evidence_dir
        if evidence is None and self.env.run_dir is not None:
            evidence = RunLayout(self.env.run_dir).diagnostics_dir(self.attempt)
        try:
            self._control = ControlThread(self.rank, self.snapshot, evidence_dir=evidence,
                                          agent_pid=self.env.agent_pid)
        except OSError as exc:
            log.warning("trainguard: no control channel (%s)", exc)
        if evidence is not None:
            self._install_last_words(evidence)

    def _install_last_words(self, evidence: Path) -> None:
        """Dump the flight recorder and stacks when the script dies of an uncaught exception.

        A rank that fails because a peer died (gloo: "Connection closed by peer") exits within
        milliseconds, before the agent can ask it for evidence; its dump is the survivors' view of the
        collective that broke, so it writes it on its way out. The previous hook still runs after.
        """
        previous = sys.excepthook

        def last_words(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            # Once the agent gathered this attempt's evidence (it is deciding, and stopping us), a dump written
            # now would replace the one its decision used, and tell a later `diagnose` another story.
            gathered = (evidence / PROCESS_STATE_FILE).exists()
            if not self._disabled and not self.closed and not issubclass(kind, KeyboardInterrupt) and not gathered:
                try:
                    text = "".join(traceback.format_exception(kind, exc, tb))
                    write_evidence(evidence, self.rank, preface=f"# uncaught exception, written on exit\n{text}\n")
                except Exception as err:  # evidence is best effort; the exit must go on
                    log.warning("trainguard: no evidence on exit (%s)", err)
            previous(kind, exc, tb)

        sys.excepthook = last_words

    def start_background(self) -> None:
        """Start the heartbeat/progress thread (once; only when someone reads heartbeats or asks for dumps)."""
        if self._thread is not None or self._disabled or self.closed:
            return
        if self._hb_fd is None and self.env.agent_pid is None:
            return
        self._thread = threading.Thread(target=self._loop, name="trainguard-heartbeat", daemon=True)
        self._thread.start()
        # The script is over once the interpreter shuts down; torch's teardown can take seconds after that
        # (more on a loaded host), with this daemon thread already gone: say "done" first, so the agent does
        # not read the silence as a frozen process.
        atexit.register(self.close)

    def _loop(self) -> None:
        with contextlib.suppress(OSError):  # low priority: stay out of the training threads' way
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        while not self.closed and not self._disabled:
            try:
                self._tick()
            except Exception as exc:  # never let the thread die silently on one bad tick
                log.warning("trainguard: background tick failed: %s", exc)
            self._wake.wait(TICK_SECONDS)

    def _tick(self) -> None:
        status = read_pg_status() if torch_ready() else None
        if status is not None:
            if not self._pg_seen:
                self._pg_seen = True
                self.start_control()
            self.collectives = self._tracker.update(status, time.monotonic())
            if self._prewarm_pending and self.steps_done >= 1:
                # The first dump with stack frames imports the symbolizer (~1-2 s); pay it here, once.
                self._prewarm_pending = False
                dump_flight_recorder()
        elif self._pg_seen and self.phase != "done" and torch_ready():
            # The script destroyed its process group: training is over, teardown is not a hang.
            self.phase = "done"
            self.phase_start_mono = time.monotonic()
            self.collectives = CollectiveStatus(self.collectives.collectives_done, 0.0)
        self.beat()

    def close(self) -> None:
        """Training is over for this process: heartbeat ``done``, threads and files closed."""
        if self.closed:
            return
        self.set_phase("done")
        self.closed = True
        self._wake.set()
        if self._control is not None:
            self._control.close()
        if self.events is not None:
            self.events.close()
        with self._lock:
            if self._hb_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._hb_fd)
                self._hb_fd = None

    def _after_fork_in_child(self) -> None:
        self._disabled = True
        self._hb_fd = None
        self.events = None
        self._control = None
        self._thread = None


def _forget_in_child() -> None:
    global _current
    for rt in list(_ALL):
        rt._after_fork_in_child()
    _current = None


os.register_at_fork(after_in_child=_forget_in_child)


def current() -> Runtime | None:
    """This process's runtime, if something created it."""
    return _current


def acquire(*, run_dir: Path | None = None, rank: int | None = None, env: WorkerEnv | None = None) -> Runtime:
    """This process's runtime, created on first use from the environment (``RANK``, ``TRAINGUARD_*``)."""
    global _current
    with _current_lock:
        env = WorkerEnv.from_environ() if env is None else env
        rank = _env_int("RANK", 0) if rank is None else rank
        run_dir = default_run_dir(env) if run_dir is None else run_dir
        rt = _current
        if rt is not None and not rt.closed and rt.rank == rank and rt.run_dir == run_dir:
            return rt
        if rt is not None and not rt.closed:
            log.warning("trainguard: a second worker (rank %d, %s) in this process replaces (rank %d, %s)",
                        rank, run_dir, rt.rank, rt.run_dir)
        _current = Runtime(env, rank=rank, run_dir=run_dir)
        return _current
