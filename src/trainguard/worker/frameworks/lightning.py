"""The PyTorch Lightning ``Trainer`` adapter: a ``Callback`` every Trainer gets, unasked.

Installed by `trainguard.worker.frameworks.on_import` right after the script imported Lightning's trainer
module (``lightning.pytorch.trainer.trainer``, or ``pytorch_lightning.trainer.trainer`` of the standalone
package; ``import lightning`` imports it). ``Trainer.__init__`` is wrapped so that each Trainer ends its
construction with a trainguard callback at the *front* of ``trainer.callbacks`` (so a step has ended before
``ModelCheckpoint``, always last, saves it). What the callback reports
(`trainguard.worker.frameworks.reporter`):

* ``on_train_start``: the resume point, ``trainer.global_step`` (0 when training starts from scratch; the
  loops are restored by then);
* ``on_train_batch_start``: due chaos faults fire; ``on_train_batch_end``: the step, numbered
  ``trainer.global_step`` (a batch that did not step the optimizer, with gradient accumulation, is no
  step), with ``trainer.current_epoch`` and the loss of a CPU loss tensor;
* ``on_load_checkpoint``: the checkpoint load, timed from the hook before it (``setup``, or ``on_fit_start``
  for strategies that restore after setup): reading the file and restoring the module;
* ``on_validation_end``: the next step's time counts from its end.

From ``setup`` until training starts, and within ``save_checkpoint``, the Trainer's checkpoint I/O is this
adapter's to report: the generic observation of ``torch.save``/``torch.load`` (`trainguard.worker.ckpt_io`)
stays quiet, so nothing is counted twice.

``Trainer.save_checkpoint`` (what ``ModelCheckpoint`` calls) is timed around: the whole save, state dump,
write and barrier, is a checkpoint save. The callback classes live at this module's top level (built on
first use for whichever Lightning package is imported), so a trainer pickled by a spawn launcher pickles.
"""

from __future__ import annotations

import functools
import importlib
import logging
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from trainguard.worker import ckpt_io
from trainguard.worker.frameworks.reporter import FrameworkReporter, as_loss

log = logging.getLogger(__name__)

FRAMEWORK = "lightning"
MARK = "_trainguard_wrapped"
"""Attribute set on every function this module wrapped (so nothing is wrapped twice)."""
PACKAGES = {"lightning.pytorch": "TrainguardCallback", "pytorch_lightning": "TrainguardCallbackPL"}
"""Lightning package -> the name of its callback class in this module."""
_CLASSES: dict[str, type] = {}


class _Hooks:
    """The callback's hooks; mixed into a subclass of the imported package's ``Callback``."""

    def __init__(self) -> None:
        super().__init__()
        self.reporter = FrameworkReporter(FRAMEWORK)
        self._mark: float | None = None
        """Monotonic time of the last hook before a checkpoint load (``setup``, ``on_fit_start``)."""
        self._claimed = False
        """From ``setup`` until training starts the Trainer's restore is this callback's to report: the
        ``torch.load`` in it is not observed again (`trainguard.worker.ckpt_io.claim`)."""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_claimed": False}  # a claim is this process's, not a copy's

    def _release(self) -> None:
        if self._claimed:
            self._claimed = False
            ckpt_io.release()

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._mark = time.monotonic()
        if not self._claimed:
            self._claimed = True
            ckpt_io.claim()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._release()

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._mark = time.monotonic()

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        now = time.monotonic()
        path = getattr(trainer, "ckpt_path", None)
        self.reporter.load_span(self._mark if self._mark is not None else now, now, str(path) if path else "")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._release()
        self.reporter.train_begin(int(getattr(trainer, "global_step", 0) or 0))

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.reporter.step_begin(int(trainer.global_step))

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        epoch = getattr(trainer, "current_epoch", None)
        self.reporter.step_end(int(trainer.global_step), epoch=float(epoch) if epoch is not None else None,
                               loss=as_loss(loss) if loss is not None else None)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.reporter.flush()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.reporter.pause_end()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.reporter.train_end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._release()
        self.reporter.flush()


def callback_class(package: str) -> type:
    """The trainguard callback class for a Lightning package (``lightning.pytorch`` or ``pytorch_lightning``)."""
    name = PACKAGES[package]
    cls = _CLASSES.get(name)
    if cls is None:
        base = importlib.import_module(f"{package}.callbacks").Callback
        cls = type(name, (_Hooks, base), {"__module__": __name__, "__qualname__": name,
                                          "__doc__": "Reports a Lightning Trainer's progress to trainguard."})
        _CLASSES[name] = cls
    return cls


def __getattr__(name: str) -> Any:
    # Unpickling a callback in another process finds its class here.
    for package, class_name in PACKAGES.items():
        if name == class_name:
            return callback_class(package)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def callback_of(trainer: Any) -> _Hooks | None:
    """The trainguard callback of a Trainer, if it has one."""
    for callback in getattr(trainer, "callbacks", None) or ():
        if isinstance(callback, _Hooks):
            return callback
    return None


def attach(trainer: Any, package: str) -> _Hooks | None:
    """Put the callback at the front of a Trainer's callbacks (once); None when it has no callback list."""
    found = callback_of(trainer)
    if found is not None:
        return found
    callbacks = getattr(trainer, "callbacks", None)
    if not isinstance(callbacks, list):
        log.info("trainguard: this Lightning Trainer has no callback list; steps come from the optimizer hooks")
        return None
    callback = callback_class(package)()
    callbacks.insert(0, callback)
    return callback


def _wrap_init(original: Callable[..., None], package: str) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            attach(self, package)
        except Exception as exc:  # the Trainer must be built whatever happens here
            log.warning("trainguard: no Lightning adapter for this Trainer (%s)", exc)

    setattr(__init__, MARK, True)
    return __init__


def _wrap_save(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def save_checkpoint(self: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
        callback = callback_of(self)
        if callback is None or callback.reporter.failed:
            return original(self, filepath, *args, **kwargs)
        reporter = callback.reporter
        reporter.save_begin(int(getattr(self, "global_step", 0) or 0))
        ok, error = True, ""
        try:
            with ckpt_io.quiet():  # reported here, not again by the torch.save in it
                return original(self, filepath, *args, **kwargs)
        except BaseException as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}"
            raise
        finally:
            reporter.save_end(path=str(filepath), ok=ok, error=error,
                              count_bytes=bool(getattr(self, "is_global_zero", False)))

    setattr(save_checkpoint, MARK, True)
    return save_checkpoint


def install(module: ModuleType) -> bool:
    """Wrap ``Trainer.__init__`` and ``Trainer.save_checkpoint`` of a just-imported Lightning trainer module."""
    package = module.__name__.removesuffix(".trainer.trainer")
    trainer_cls = getattr(module, "Trainer", None)
    init = getattr(trainer_cls, "__init__", None)
    if package not in PACKAGES or trainer_cls is None or init is None:
        log.info("trainguard: %s has no Trainer class; steps come from the optimizer hooks", module.__name__)
        return False
    if getattr(init, MARK, False):
        return True
    save = trainer_cls.__dict__.get("save_checkpoint")
    if callable(save) and not getattr(save, MARK, False):
        trainer_cls.save_checkpoint = _wrap_save(save)
    else:
        log.debug("trainguard: Lightning Trainer has no save_checkpoint; saves not timed")
    trainer_cls.__init__ = _wrap_init(init, package)
    return True
