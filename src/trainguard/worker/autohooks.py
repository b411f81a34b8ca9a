"""Progress, chaos and evidence for a script that never imports trainguard, from public torch hooks.

`trainguard.worker.bootstrap` calls `on_import` right after ``torch.optim`` or ``torch.distributed``
has been imported by the script. From then on:

* a global optimizer-step post hook (``torch.optim.optimizer.register_optimizer_step_post_hook``) counts
  steps. **A step is one completed ``step()`` of the lead optimizer**: the first optimizer object of
  the process whose ``step()`` completes (if it is garbage collected, the next one to step takes over).
  Other optimizers stepping in the same iteration are not counted again; with gradient accumulation a
  step is one optimizer update, not one micro-batch; a step skipped by a gradient scaler (inf/NaN) is
  not a step. The step's *number* is the optimizer's own count when it keeps one (``state[p]["step"]``
  of Adam, AdamW and most adaptive optimizers, restored with the optimizer's state dict by a resumed
  script, so numbers continue across restarts); otherwise the steps counted in this attempt.
* each step writes the heartbeat (source ``optimizer``) and a ``StepCompleted`` event (``numbering``
  ``optimizer`` for the optimizer's own count, ``attempt`` for steps counted in this attempt). Its duration is
  the time since the previous step ended; the first step of an attempt counts only from just before its
  optimizer update (its forward and backward started before anything could see them), so the effective
  training time computed from the events errs on the low side by at most one step per attempt.
* faults scheduled for step S fire at the start of step S: right after step S-1's update (post hook),
  i.e. before step S's forward pass and collectives; a fault due at the first step of an attempt fires in
  the pre hook of that attempt's first update.
* every K steps (``TRAINGUARD_SDC_EVERY``) the replicas compare parameter fingerprints right after the
  update (`trainguard.sdc.check`), before the next step's faults fire.
* the public checkpoint calls (``torch.save``, ``torch.load``, ...) are observed (`trainguard.worker.ckpt_io`);
  a restore in progress ends at the first optimizer update after it. An update inside DCP's
  ``get_state_dict``/``set_state_dict`` (a zero step that creates the optimizer's state) is no step.
* ``torch.distributed.destroy_process_group()`` of the default group says the rank's training is over (heartbeat
  phase ``done``) before torch tears the group down: that teardown can deadlock in torch itself (a gloo group's
  destructor joins its threads holding the GIL while one of them needs it; pytorch/pytorch#56297), and the
  agent ends a rank frozen there as finished, not hung (`trainguard.launch.teardown`).
* the control thread starts (so a rank stuck in rendezvous can still give its stacks), and so does the
  background thread, which reads collective progress once a default process group exists (see
  `trainguard.worker.runtime`).

Once the script calls ``trainguard.attach()`` its own steps count: these hooks stop counting for good. While
a framework adapter (`trainguard.worker.frameworks`) reports the framework's own steps (``Runtime.step_owner``),
these hooks neither count steps nor fire faults; the SDC check stays here.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
import weakref
from types import ModuleType
from typing import Any

from trainguard.worker import ckpt_io, runtime

log = logging.getLogger(__name__)


class OptimizerSteps:
    """The step clock of one process, driven by the global optimizer hooks."""

    def __init__(self) -> None:
        self._lead: weakref.ref[Any] | None = None
        self._counted = 0
        self._first_pre_mono: float | None = None
        self._last_end_mono: float | None = None
        self._failed = False

    def restart(self) -> None:
        """Forget the previous attempt: the next step is again an attempt's first (in-process re-entry)."""
        self._lead = None
        self._counted = 0
        self._first_pre_mono = None
        self._last_end_mono = None

    def _runtime(self) -> runtime.Runtime | None:
        rt = runtime.current()
        if rt is None or rt.closed or rt.source == "script" or self._failed:
            return None
        return rt

    def pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if ckpt_io.in_state_call():  # DCP creating the optimizer's state with a zero step: no training step
                return None
            ckpt_io.on_step(optimizer)  # a restore in progress ends at the first update after it
            rt = self._runtime()
            if rt is None or self._first_pre_mono is not None:
                return None
            # The first update of this attempt: faults due at its step fire now.
            self._first_pre_mono = time.monotonic()
            if rt.sdc is not None:
                rt.sdc.track(optimizer)  # so an sdc fault due now has parameters to corrupt
            if rt.injector is not None and rt.step_owner is None:  # an adapter fires faults at its own steps
                rt.injector.on_step_start(optimizer_step(optimizer) + 1)
        except Exception as exc:
            self._give_up(exc)
        return None

    def post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            rt = self._runtime()
            if rt is None or ckpt_io.in_state_call():
                return
            lead = self._lead() if self._lead is not None else None
            if lead is None:
                self._lead = weakref.ref(optimizer)
            elif lead is not optimizer:
                return
            end = time.monotonic()
            start = self._last_end_mono if self._last_end_mono is not None else (self._first_pre_mono or end)
            self._last_end_mono = end
            self._counted += 1
            own = optimizer_step(optimizer)
            step = own or self._counted
            owned = rt.step_owner is not None  # a framework adapter reports this step, by the framework's number
            if not owned:
                rt.complete_step(step, end - start, source="optimizer", end_mono=end, phase="step",
                                 numbering="optimizer" if own else "attempt")
            if rt.sdc is not None:  # the replicas are compared after the update, before the next step's faults
                rt.sdc.on_step(step, optimizer)
            if rt.injector is not None and not owned:
                rt.injector.on_step_start(step + 1)
        except Exception as exc:
            self._give_up(exc)

    def _give_up(self, exc: Exception) -> None:
        self._failed = True
        log.warning("trainguard: automatic step counting failed (%s); it is off for this process", exc)


def optimizer_step(optimizer: Any) -> int:
    """The optimizer's own step count (``state[p]["step"]`` of its first parameter with state), else 0.

    Only a Python number or a CPU tensor is read: reading a GPU tensor would synchronize the device.
    """
    try:
        first = next(iter(optimizer.state.values()), None)
    except Exception:
        return 0
    if not isinstance(first, dict):
        return 0
    value = first.get("step")
    if isinstance(value, (int, float)):
        return int(value)
    device = getattr(value, "device", None)
    if value is not None and getattr(device, "type", None) == "cpu" and value.numel() == 1:
        return int(value.item())
    return 0


_steps: OptimizerSteps | None = None
_handles: list[Any] = []


def steps() -> OptimizerSteps | None:
    """The process's step clock, once the optimizer hooks are installed."""
    return _steps


def install_optimizer_hooks(optim_module: ModuleType) -> bool:
    """Register the global optimizer hooks (once); False when this torch has no such API."""
    global _steps
    if _steps is not None:
        return True
    optimizer = getattr(optim_module, "optimizer", None) or sys.modules.get("torch.optim.optimizer")
    register_pre = getattr(optimizer, "register_optimizer_step_pre_hook", None)
    register_post = getattr(optimizer, "register_optimizer_step_post_hook", None)
    if register_pre is None or register_post is None:
        log.warning("trainguard: this torch has no global optimizer hooks; no automatic step counting")
        return False
    clock = OptimizerSteps()
    _handles.append(register_pre(clock.pre_hook))
    _handles.append(register_post(clock.post_hook))
    _steps = clock
    return True


def _install_sdc(rt: runtime.Runtime) -> None:
    try:
        from trainguard.sdc import check as sdc

        sdc.install(rt)
    except Exception as exc:  # the check is optional; progress and evidence are not
        log.warning("trainguard: no SDC check (%s)", exc)


DESTROY_MARK = "_trainguard_destroy"


def install_destroy_hook(dist: ModuleType) -> bool:
    """Wrap ``dist.destroy_process_group`` so that destroying the default group first sets the heartbeat phase
    ``done``, synchronously (the background thread may never run again if torch's teardown then holds the GIL).
    The original stays reachable as ``__wrapped__`` for trainguard's own teardown between in-process attempts."""
    original = getattr(dist, "destroy_process_group", None)
    if not callable(original) or getattr(original, DESTROY_MARK, False):
        return False

    @functools.wraps(original)
    def destroy_process_group(group: Any = None, *args: Any, **kwargs: Any) -> Any:
        if group is None:  # the default group, and every group with it: this rank's training is over
            rt = runtime.current()
            if rt is not None and not rt.closed:
                rt.set_phase("done")
        return original(group, *args, **kwargs)

    setattr(destroy_process_group, DESTROY_MARK, True)
    setattr(dist, "destroy_process_group", destroy_process_group)  # noqa: B010
    return True


def on_import(name: str, module: ModuleType) -> None:
    """Called by the bootstrap right after the script imported ``torch.optim`` or ``torch.distributed``."""
    try:
        rt = runtime.acquire()
        if name == "torch.optim":
            install_optimizer_hooks(module)
            from trainguard.worker import ckpt_entries

            ckpt_entries.on_import(name, module)  # torch.save / torch.load and the load_state_dict calls
            _install_sdc(rt)
        elif name == "torch.distributed":
            install_destroy_hook(module)
        # The control thread starts now rather than once a process group exists: a rank stuck in
        # rendezvous or init_process_group can then still answer with its stacks.
        rt.start_control()
        rt.start_background()
    except Exception as exc:  # instrumentation must never break the script's import of torch
        log.warning("trainguard: automatic instrumentation off (%s)", exc)


def on_new_attempt() -> None:
    """A surviving rank re-enters its training function in a new in-process attempt
    (`trainguard.worker.inprocess`), whose variables are already in ``os.environ``; the previous attempt's
    runtime is closed. Nothing imports ``torch.optim`` again, so the hooks follow the process here: a new
    runtime (heartbeat, events, chaos of the new attempt), the step clock from zero, the SDC check again
    (the replacement ranks create its group at their first step; a survivor without it would leave them
    waiting for ever), the control and background threads. Without the hooks (no bootstrap) nothing."""
    clock = _steps
    if clock is None:
        return
    try:
        clock.restart()
        rt = runtime.acquire()
        _install_sdc(rt)
        rt.start_control()
        rt.start_background()
    except Exception as exc:  # instrumentation must never break the re-entry
        log.warning("trainguard: automatic instrumentation off in the new attempt (%s)", exc)


def uninstall() -> None:
    """Remove the global optimizer hooks (tests, and anyone embedding trainguard in a long-lived process)."""
    global _steps
    while _handles:
        _handles.pop().remove()
    _steps = None
    dist = sys.modules.get("torch.distributed")
    wrapped: Any = getattr(dist, "destroy_process_group", None)
    if dist is not None and getattr(wrapped, DESTROY_MARK, False):
        setattr(dist, "destroy_process_group", wrapped.__wrapped__)  # noqa: B010
