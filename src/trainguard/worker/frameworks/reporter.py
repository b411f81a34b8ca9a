"""What a framework adapter reports, in trainguard's records: one `FrameworkReporter` per framework trainer.

An adapter (`trainguard.worker.frameworks.hf`, `.lightning`) calls it from the framework's own callbacks; it
turns them into what the worker side already writes for ``trainguard.attach()`` and the optimizer hooks:

* **steps**: ``StepCompleted`` numbered by the framework's **global step** (``numbering="framework"``), so
  numbers continue across restarts whatever the optimizer's state; heartbeat source ``optimizer`` (the
  agent watches an unmodified script: a hang is a wait). A step's time runs from the end of the previous
  step, or of the last logging, evaluation or save after it, to the framework's step end. While training
  runs, the reporter owns the process's step clock (``Runtime.step_owner``): the optimizer hooks count no
  step and fire no fault, so nothing is counted twice.
* **the resume point**: when training begins at a global step above 0, ``CheckpointLoaded`` with that step
  (training continues at step + 1) and the time the adapter measured loading the checkpoint.
* **saves**: ``CheckpointSaveStarted`` / ``CheckpointSaveFinished`` around the framework's own save, its whole
  duration blocking (framework saves are synchronous), and the heartbeat phase ``checkpoint`` meanwhile, so
  the agent allows for it as for trainguard's own saves.
* **chaos**: faults due at step S fire when the framework begins step S (before its forward pass).

Every record carries ``framework`` so readers can tell the framework's checkpoints from trainguard's. No
method raises: a failure turns the reporter off for good, with one warning, and training goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from typing import Any

from trainguard.core.events import CheckpointLoaded, CheckpointSaveFinished, CheckpointSaveStarted, StepCompleted
from trainguard.worker import runtime

log = logging.getLogger(__name__)

LoadSpan = tuple[float, float, float]
"""(start, end) on the monotonic clock and the wall-clock end of one timed part of a checkpoint load."""


def path_bytes(path: str) -> int:
    """Bytes of a checkpoint file, or of every file under a checkpoint folder; 0 when unreadable."""
    try:
        if os.path.isfile(path):
            return os.path.getsize(path)
        total = 0
        for folder, _, files in os.walk(path):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.path.getsize(os.path.join(folder, name))
        return total
    except OSError:
        return 0


def as_loss(value: Any) -> float | None:
    """A finite loss from a Python number or a one-element CPU tensor; None otherwise (a GPU tensor is not
    read: that would synchronize the device)."""
    try:
        if isinstance(value, bool):
            return None
        if isinstance(value, (int, float)):
            out = float(value)
        else:
            device = getattr(value, "device", None)
            if getattr(device, "type", None) != "cpu" or value.numel() != 1:
                return None
            out = float(value.detach().item())
    except Exception:
        return None
    return out if math.isfinite(out) else None


class FrameworkReporter:
    """Reports one framework trainer's progress, resume point and checkpoints to this process's worker side.

    Holds plain values only, so a trainer that is pickled (a spawn launcher) pickles it too.
    """

    def __init__(self, framework: str) -> None:
        self.framework = framework
        """``transformers`` or ``lightning``: written into the checkpoint records."""
        self.failed = False
        self.training = False
        """Between the framework's train begin and train end."""
        self.last_step: int | None = None
        """The last global step reported."""
        self.resume_step = 0
        """The global step training began at (0: from scratch)."""
        self._clock: float | None = None
        """Monotonic time the next step's duration counts from."""
        self._pending: StepCompleted | None = None
        """A step record held back until its loss is logged (moments later)."""
        self._loads: list[LoadSpan] = []
        self._load_path = ""
        self._resume_reported = True
        self._save: tuple[int, float] | None = None
        """(step, monotonic start) of the save in progress."""
        self.saved_step: int | None = None
        """The step of the last save reported."""

    def __getstate__(self) -> dict[str, Any]:
        # A copy in another process (a spawn launcher's child) starts fresh: nothing of this one is its own.
        return FrameworkReporter(self.framework).__dict__

    # --- plumbing -------------------------------------------------------------------------------------

    def _runtime(self) -> runtime.Runtime | None:
        rt = runtime.current()
        if self.failed or rt is None or rt.closed or rt.source == "script":
            return None
        return rt

    def _give_up(self, exc: BaseException) -> None:
        self.failed = True
        self.training = False
        rt = runtime.current()
        if rt is not None and rt.step_owner == self.framework:
            rt.step_owner = None  # the optimizer hooks take over again
        log.warning("trainguard: %s adapter failed (%s); it is off for this process", self.framework, exc)

    # --- loading ----------------------------------------------------------------------------------------

    def load_span(self, start_mono: float, end_mono: float, path: str = "") -> None:
        """One timed part of loading a checkpoint (model, optimizer, RNG state, the file itself)."""
        self._loads.append((start_mono, end_mono, time.time()))
        if path and not self._load_path:
            self._load_path = path

    def note_load_path(self, path: str) -> None:
        if path and not self._load_path:
            self._load_path = path

    def report_resume(self) -> None:
        """``CheckpointLoaded`` once per training run that began above step 0 (or loaded something)."""
        if self._resume_reported:
            return
        self._resume_reported = True
        try:
            rt = self._runtime()
            if rt is None or (self.resume_step <= 0 and not self._loads):
                return
            seconds = sum(end - start for start, end, _ in self._loads)
            when = max((wall for _, _, wall in self._loads), default=time.time())
            path = self._load_path
            rt.emit(CheckpointLoaded(time=when, host=rt.host, attempt=rt.attempt, rank=rt.rank, step=self.resume_step,
                                     seconds=seconds, path=path, bytes=path_bytes(path) if path and rt.rank == 0 else 0,
                                     framework=self.framework))
            self._loads = []
        except Exception as exc:
            self._give_up(exc)

    # --- training -------------------------------------------------------------------------------------

    def train_begin(self, global_step: int) -> None:
        """The framework starts (or resumes) training at ``global_step``: from now on its steps count."""
        try:
            rt = self._runtime()
            if rt is None:
                return
            rt.step_owner = self.framework
            self.training = True
            self.resume_step = max(0, int(global_step))
            self.last_step = self.resume_step
            self._clock = time.monotonic()
            self._resume_reported = False
        except Exception as exc:
            self._give_up(exc)

    def step_begin(self, global_step: int) -> None:
        """The framework begins the step after ``global_step``: pending records go out, due faults fire."""
        if not self.training:
            return
        try:
            self.flush()
            self.report_resume()
            rt = self._runtime()
            if rt is not None and rt.injector is not None:
                rt.injector.on_step_start(int(global_step) + 1)
        except Exception as exc:
            self._give_up(exc)

    def step_end(self, global_step: int, *, epoch: float | None = None, loss: float | None = None,
                 loss_follows: bool = False) -> None:
        """The framework finished optimizer step ``global_step`` (repeats and micro-batches are ignored).

        ``loss_follows``: the framework logs this step's loss next (`step_loss`); the record waits for it.
        """
        if not self.training:
            return
        try:
            step = int(global_step)
            if self.last_step is not None and step <= self.last_step:
                return
            rt = self._runtime()
            if rt is None:
                return
            self.flush()
            self.report_resume()
            end = time.monotonic()
            start = self._clock if self._clock is not None else end
            record = rt.complete_step(step, end - start, source="optimizer", end_mono=end, phase="step",
                                      numbering="framework", epoch=epoch, loss=loss, emit=not loss_follows)
            if loss_follows:
                self._pending = record
            self.last_step = step
            self._clock = end
        except Exception as exc:
            self._give_up(exc)

    def step_loss(self, global_step: int, loss: float | None) -> None:
        """The loss the framework logged at ``global_step``; completes the held-back record of that step."""
        pending = self._pending
        if pending is not None and pending.step == int(global_step) and loss is not None:
            self._pending = dataclasses.replace(pending, loss=loss)
        self.flush()

    def flush(self) -> None:
        """Write the held-back step record, if any."""
        pending, self._pending = self._pending, None
        rt = self._runtime()
        if pending is not None and rt is not None:
            rt.emit(pending)

    def pause_end(self) -> None:
        """Logging, evaluation or a save ended: the next step's time counts from now."""
        if self.training:
            self._clock = time.monotonic()

    def train_end(self) -> None:
        """Training is over: records out, the optimizer hooks count steps again."""
        if not self.training:
            return
        self.training = False
        try:
            self.flush()
            self.report_resume()
            rt = runtime.current()
            if rt is not None and rt.step_owner == self.framework:
                rt.step_owner = None
        except Exception as exc:
            self._give_up(exc)

    # --- saving ---------------------------------------------------------------------------------------

    def expect_save(self) -> None:
        """A save follows shortly (the framework decided so at the step's end): the agent allows for it now."""
        rt = self._runtime()
        if rt is not None and self.training:
            rt.set_phase("checkpoint")

    def save_begin(self, global_step: int, *, start_mono: float | None = None, start_wall: float | None = None) -> None:
        """The framework starts saving the state of ``global_step`` (``start_*``: when, if it began earlier)."""
        try:
            rt = self._runtime()
            if rt is None:
                return
            self.flush()
            step = int(global_step)
            self._save = (step, time.monotonic() if start_mono is None else start_mono)
            rt.set_phase("checkpoint")
            rt.emit(CheckpointSaveStarted(time=time.time() if start_wall is None else start_wall, host=rt.host,
                                          attempt=rt.attempt, rank=rt.rank, step=step, framework=self.framework))
        except Exception as exc:
            self._give_up(exc)

    def save_end(self, *, path: str = "", ok: bool = True, error: str = "", count_bytes: bool = False) -> None:
        """The save begun by `save_begin` ended; ``count_bytes``: this rank wrote ``path`` (sizes are read)."""
        save, self._save = self._save, None
        if save is None:
            return
        try:
            rt = self._runtime()
            if rt is None:
                return
            step, start = save
            self.saved_step = step
            seconds = max(0.0, time.monotonic() - start)
            rt.emit(CheckpointSaveFinished(time=time.time(), host=rt.host, attempt=rt.attempt, rank=rt.rank, step=step,
                                           blocking_seconds=seconds, total_seconds=seconds,
                                           bytes=path_bytes(path) if count_bytes and path and ok else 0, path=path,
                                           ok=ok, error=error[:500], framework=self.framework))
            rt.set_phase("step" if self.training else "idle")
            self.pause_end()
        except Exception as exc:
            self._give_up(exc)

    @property
    def saving(self) -> bool:
        return self._save is not None

    @property
    def clock(self) -> float | None:
        """Monotonic time of the last step end or pause end (a save that was not timed began after it)."""
        return self._clock
