"""The Hugging Face ``transformers.Trainer`` adapter: a ``TrainerCallback`` every Trainer gets, unasked.

Installed by `trainguard.worker.frameworks.on_import` right after the script imported ``transformers.trainer``
(``from transformers import Trainer`` does): ``Trainer.__init__`` is wrapped so that each Trainer, and each
subclass that calls it (``Seq2SeqTrainer``, TRL's trainers), ends its construction with a
`TrainguardCallback` at the end of its callback list (after ``DefaultFlowCallback``, so the step's
``should_log`` / ``should_save`` are decided when it runs). What the callback reports
(`trainguard.worker.frameworks.reporter`):

* ``on_train_begin``: the resume point, ``state.global_step`` (0 when training starts from scratch);
* ``on_step_begin``: due chaos faults fire; ``on_step_end``: the step, numbered ``state.global_step``, with
  ``state.epoch``; its loss is the one ``on_log`` reports right after (the Trainer's mean over the logging
  interval), when the step is a logging step;
* ``on_log``, ``on_evaluate``, ``on_save``: the next step's time counts from their end.

Durations the callbacks cannot see are timed around the Trainer's own methods, where this version has them
(each is looked up by name, called unchanged, and skipped when absent): ``_save_checkpoint`` (a save), and
``_load_from_checkpoint``, ``_load_optimizer_and_scheduler``, ``_load_rng_state`` (the parts of a resume). A
Trainer without ``_save_checkpoint`` has its save timed from the last callback before ``on_save``; one without
the load methods reports its resume point with 0 s of loading.
Inside those methods the generic observation of ``torch.save``/safetensors (`trainguard.worker.ckpt_io`) stays
quiet: the adapter reports the save or the resume, once.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from transformers.trainer_callback import TrainerCallback

from trainguard.worker import ckpt_io
from trainguard.worker.frameworks.reporter import FrameworkReporter

log = logging.getLogger(__name__)

FRAMEWORK = "transformers"
MARK = "_trainguard_wrapped"
"""Attribute set on every function this module wrapped (so nothing is wrapped twice)."""
SAVE_METHOD = "_save_checkpoint"
LOAD_METHODS = ("_load_from_checkpoint", "_load_optimizer_and_scheduler", "_load_rng_state")
CHECKPOINT_PREFIX = "checkpoint"
"""``transformers.trainer_utils.PREFIX_CHECKPOINT_DIR``: a save of step N writes ``<output_dir>/checkpoint-N``."""


class TrainguardCallback(TrainerCallback):
    """Reports a Trainer's global step, resume point and checkpoints to trainguard's worker side."""

    def __init__(self) -> None:
        self.reporter = FrameworkReporter(FRAMEWORK)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.reporter.train_begin(int(getattr(state, "global_step", 0) or 0))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.reporter.step_begin(int(state.global_step))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        epoch = getattr(state, "epoch", None)
        logs_next = bool(getattr(control, "should_log", False))
        self.reporter.step_end(int(state.global_step), epoch=float(epoch) if epoch is not None else None,
                               loss_follows=logs_next)
        if getattr(control, "should_save", False):
            self.reporter.expect_save()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        loss = (logs or {}).get("loss")
        self.reporter.step_loss(int(state.global_step), float(loss) if isinstance(loss, (int, float)) else None)
        self.reporter.pause_end()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.reporter.flush()
        self.reporter.pause_end()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        reporter = self.reporter
        if reporter.saved_step != int(state.global_step) and reporter.training and reporter.clock is not None:
            # The save method was not timed (absent in this version, or overridden without calling it): the
            # save ran since the last callback before this one.
            start = reporter.clock
            reporter.save_begin(int(state.global_step), start_mono=start,
                                start_wall=time.time() - (time.monotonic() - start))
            reporter.save_end(path=_checkpoint_path(args, state), count_bytes=_is_zero(state))
        reporter.pause_end()

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.reporter.flush()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.reporter.train_end()


def _checkpoint_path(args: Any, state: Any) -> str:
    output = getattr(args, "output_dir", None)
    return os.path.join(str(output), f"{CHECKPOINT_PREFIX}-{state.global_step}") if output else ""


def _is_zero(state: Any) -> bool:
    return bool(getattr(state, "is_world_process_zero", False))


def callback_of(trainer: Any) -> TrainguardCallback | None:
    """The trainguard callback of a Trainer, if it has one."""
    handler = getattr(trainer, "callback_handler", None)
    for callback in getattr(handler, "callbacks", ()):
        if isinstance(callback, TrainguardCallback):
            return callback
    return None


def attach(trainer: Any) -> TrainguardCallback | None:
    """Give a Trainer its callback (once); None when this Trainer has no callback handler to add it to."""
    found = callback_of(trainer)
    if found is not None:
        return found
    add = getattr(trainer, "add_callback", None)
    if add is None:
        log.info("trainguard: this transformers Trainer has no add_callback; steps come from the optimizer hooks")
        return None
    callback = TrainguardCallback()
    add(callback)
    return callback


def _wrap_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            attach(self)
        except Exception as exc:  # the Trainer must be built whatever happens here
            log.warning("trainguard: no transformers adapter for this Trainer (%s)", exc)

    setattr(__init__, MARK, True)
    return __init__


def _wrap_save(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def save(self: Any, *args: Any, **kwargs: Any) -> Any:
        callback = callback_of(self)
        reporter = callback.reporter if callback is not None else None
        if reporter is None or not reporter.training:
            return original(self, *args, **kwargs)
        state = getattr(self, "state", None)
        reporter.save_begin(int(getattr(state, "global_step", 0) or 0))
        ok, error = True, ""
        try:
            with ckpt_io.quiet():  # the save is reported here, not again by the torch or safetensors calls in it
                return original(self, *args, **kwargs)
        except BaseException as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}"
            raise
        finally:
            reporter.save_end(path=_checkpoint_path(getattr(self, "args", None), state) if state is not None else "",
                              ok=ok, error=error, count_bytes=state is not None and _is_zero(state))

    setattr(save, MARK, True)
    return save


def _wrap_load(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load(self: Any, *args: Any, **kwargs: Any) -> Any:
        checkpoint = args[0] if args else next(iter(kwargs.values()), None)
        if not checkpoint:  # called without a checkpoint when training starts from scratch
            return original(self, *args, **kwargs)
        start = time.monotonic()
        try:
            with ckpt_io.quiet():  # reported by this adapter's resume record
                return original(self, *args, **kwargs)
        finally:
            callback = callback_of(self)
            if callback is not None:
                callback.reporter.load_span(start, time.monotonic(), str(checkpoint))

    setattr(load, MARK, True)
    return load


def install(module: ModuleType) -> bool:
    """Wrap ``Trainer.__init__`` (and time its save and load methods) in the just-imported ``transformers.trainer``."""
    trainer_cls = getattr(module, "Trainer", None)
    init = getattr(trainer_cls, "__init__", None)
    if trainer_cls is None or init is None:
        log.info("trainguard: transformers.trainer has no Trainer class; steps come from the optimizer hooks")
        return False
    if getattr(init, MARK, False):
        return True
    for name, wrap in ((SAVE_METHOD, _wrap_save), *((n, _wrap_load) for n in LOAD_METHODS)):
        method = trainer_cls.__dict__.get(name)
        if callable(method) and not getattr(method, MARK, False):
            setattr(trainer_cls, name, wrap(method))
        elif method is None:
            log.debug("trainguard: transformers Trainer has no %s; not timed", name)
    trainer_cls.__init__ = _wrap_init(init)
    return True
