"""Checkpoint saves and restores of any training loop, seen at the public calls every framework ends in.

`trainguard.worker.ckpt_entries` wraps the save and load entry points (``torch.save``, ``torch.load``,
``torch.distributed.checkpoint``, safetensors, ``Accelerator.save_state``, ``Fabric.save``, ...); each wrapped
call runs `call`, which times it and, when `trainguard.worker.ckpt_rules` says it was a checkpoint, records it:

* a **save** writes ``checkpoint_save_started`` (when the call is known to be a checkpoint before it runs) and
  ``checkpoint_save_finished`` (its whole duration blocking; an async DCP save blocks for the call and is
  finished when its future is), numbered by the process's current step, with the heartbeat phase
  ``checkpoint`` meanwhile;
* a **restore** is one episode: the first checkpoint load, the loads after it, and the calls that apply a state
  (``load_state_dict`` of modules and optimizers, DCP's ``set_state_dict``) handed what those loads returned or
  filled in (matched by identity: the state is applied, not only read). The episode ends at the next optimizer
  step (or a save, a load more than `EPISODE_GAP_SECONDS` later, or the process's exit), where one
  ``checkpoint_loaded`` is written: its step from the loaded content, else the name, else the optimizer's
  restored step count (``step_source``).

A save or restore whose state was built by DCP's ``get_state_dict`` family, handed on unchanged, begins when
that call began (`prepared`); optimizer steps inside those calls and inside the calls that apply a state are
no training steps (`in_state_call`; the optimizer hooks skip them).

A call made inside another observed call (``Fabric.save`` calling ``torch.save``, Accelerate calling
safetensors) or while a framework adapter reports its own checkpoints (`quiet`, `claim`) is not recorded
again. The user's call always runs unchanged: its result and its exception are the caller's; a failure of
the observation is logged and swallowed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from trainguard.core.events import CheckpointLoaded, CheckpointSaveFinished, CheckpointSaveStarted
from trainguard.worker import ckpt_rules, runtime
from trainguard.worker.frameworks.reporter import path_bytes

log = logging.getLogger(__name__)

ENV = "TRAINGUARD_CHECKPOINT_IO"
"""``0`` turns the observation off (the entry points are left unwrapped)."""
EPISODE_GAP_SECONDS = 5.0
"""A checkpoint load starting this long after the last part of a restore begins another restore."""

ArgRef = tuple[int, str]
"""Where an argument is: (position, or -1 for keyword-only; keyword name)."""


@dataclass(frozen=True)
class EntryPoint:
    """One public save or load call that is observed."""

    entry: str
    """Its name in the records (``torch.save``, ``dcp.load``, ``accelerate.save_state``)."""
    kind: str
    """``save`` or ``load``."""
    framework: str
    """The library it belongs to, written as the records' ``framework``."""
    path: tuple[ArgRef, ...]
    """Where the file or folder is among the arguments, tried in order (an object's ``path`` attribute is read)."""
    content: tuple[ArgRef, ...] = ()
    """Arguments that hold what is saved, or the state a load fills in place."""
    always: bool = False
    """Every call is a checkpoint (`ckpt_rules` rule 1); its bytes are counted on rank 0 only (shared files)."""
    result_is_path: bool = False
    """The call returns the path it wrote (``Accelerator.save_state``)."""


@dataclass
class _Call:
    """One observed call in flight."""

    spec: EntryPoint
    start_mono: float
    start_wall: float
    path: str
    position: int | None
    """A file object's position before the call (its bytes are the difference)."""
    started: bool = False
    """``checkpoint_save_started`` was written."""
    phase: str = ""
    """The heartbeat phase before the call, when the call set its own (``checkpoint`` or `SAVE_PHASE`)."""


@dataclass
class _Episode:
    """One restore in progress: its loads and the state they were applied to."""

    start_mono: float
    start_wall: float
    end_mono: float
    end_wall: float
    path: str
    entry: str
    framework: str
    nbytes: int
    step: int | None = None
    step_source: str = ""
    epoch: float | None = None
    ids: set[int] = field(default_factory=set)
    """``id()`` of what the loads returned (and of its values): a ``load_state_dict`` of one applies the restore."""


SAVE_PHASE = "save"
"""The heartbeat phase inside a save not known to be a checkpoint when it begins (an export of the weights, a
file judged by its size only at the end): the rank writes, it is not stuck, and the agent gives it the checkpoint
allowance. Without it a rank-0 export the others wait for in a barrier was a hang after the busy allowance."""

PREPARED_KEPT = 4
"""How many recent state preparations (DCP's ``get_state_dict`` family) are remembered."""

_local = threading.local()
_prepared: list[tuple[float, float, tuple[Any, ...]]] = []
"""(monotonic start, wall start, the parts of the result) of recent state preparations not yet handed to a save or
load. The parts are held (they are references to the state's tensors, no copies) so that their ids stay theirs;
they are let go at the next optimizer step."""
_claims = 0
_lock = threading.Lock()
_episode: _Episode | None = None
_warned = False


def enabled(environ: dict[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get(ENV, "1").strip() != "0"


def _depth() -> int:
    return int(getattr(_local, "depth", 0))


def in_state_call() -> bool:
    """Whether this thread is inside a call that prepares or applies a state (DCP's ``get_state_dict`` and
    ``set_state_dict`` step the optimizer once with zero gradients to create its state: that is no training step)."""
    return int(getattr(_local, "state_calls", 0)) > 0


@contextlib.contextmanager
def _state_call() -> Iterator[None]:
    _local.state_calls = int(getattr(_local, "state_calls", 0)) + 1
    try:
        yield
    finally:
        _local.state_calls = int(getattr(_local, "state_calls", 0)) - 1


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Nothing observed in this thread meanwhile: the caller (an adapter, an outer call) reports it."""
    _local.depth = _depth() + 1
    try:
        yield
    finally:
        _local.depth = _depth() - 1


def claim() -> None:
    """A framework adapter reports the checkpoints from now until `release` (Lightning's fit: setup to training)."""
    global _claims
    with _lock:
        _claims += 1


def release() -> None:
    global _claims
    with _lock:
        _claims = max(0, _claims - 1)


def _failed(what: str, exc: BaseException) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("trainguard: checkpoint observation failed in %s (%s); the call itself went on", what, exc)
    else:
        log.debug("trainguard: checkpoint observation failed in %s (%s)", what, exc)


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], ref: ArgRef) -> Any:
    index, name = ref
    if name in kwargs:
        return kwargs[name]
    return args[index] if 0 <= index < len(args) else None


def path_of(value: Any) -> str:
    """A file or folder path from a call's argument (a path, an object with ``path`` or ``name``); else ``""``."""
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value) if not isinstance(value, bytes) else ""
    for attr in ("path", "name"):
        inner = getattr(value, attr, None)
        if isinstance(inner, (str, os.PathLike)):
            return os.fspath(inner) if not isinstance(inner, bytes) else ""
    return ""


def _file_position(value: Any) -> int | None:
    if isinstance(value, (str, os.PathLike)) or not callable(getattr(value, "tell", None)):
        return None
    try:
        return int(value.tell())
    except Exception:
        return None


def call(spec: EntryPoint, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run ``fn(*args, **kwargs)`` for the user, observing it as ``spec`` says."""
    rt = runtime.current()
    if rt is None or rt.closed or _depth() > 0 or _claims > 0:
        return fn(*args, **kwargs)
    observed: _Call | None = None
    try:
        observed = _begin(rt, spec, args, kwargs)
    except Exception as exc:
        _failed(spec.entry, exc)
    _local.depth = _depth() + 1
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        _local.depth = _depth() - 1
        if observed is not None:
            with contextlib.suppress(Exception):
                _end(rt, observed, args, kwargs, None, f"{type(exc).__name__}: {exc}")
        raise
    _local.depth = _depth() - 1
    if observed is not None:
        try:
            _end(rt, observed, args, kwargs, result, "")
        except Exception as exc:
            _failed(spec.entry, exc)
    return result


def _begin(rt: runtime.Runtime, spec: EntryPoint, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
    target = next((v for v in (_arg(args, kwargs, ref) for ref in spec.path) if v is not None), None)
    observed = _Call(spec, time.monotonic(), time.time(), path_of(target), _file_position(target))
    if spec.kind != "save":
        return observed
    content = tuple(_arg(args, kwargs, ref) for ref in spec.content)
    if _prepared:
        begun = _prepared_start(content)
        if begun is not None:
            observed.start_mono, observed.start_wall = begun
    if ckpt_rules.is_checkpoint(always=spec.always, content=content, path=observed.path, nbytes=0):
        close_episode()  # a save ends any restore before it
        observed.started = True
        observed.phase = rt.phase
        rt.set_phase("checkpoint")
        rt.emit(CheckpointSaveStarted(time=observed.start_wall, host=rt.host, attempt=rt.attempt, rank=rt.rank,
                                      step=rt.step, framework=spec.framework, entry=spec.entry))
    elif rt.phase not in ("checkpoint", SAVE_PHASE):
        observed.phase = rt.phase
        rt.set_phase(SAVE_PHASE)
    return observed


def _bytes(rt: runtime.Runtime, observed: _Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    if observed.position is not None:
        target = next((v for v in (_arg(args, kwargs, ref) for ref in observed.spec.path) if v is not None), None)
        with contextlib.suppress(Exception):
            return max(0, int(target.tell()) - observed.position)  # type: ignore[union-attr]
        return 0
    if not observed.path or (observed.spec.always and rt.rank != 0):
        return 0
    return path_bytes(observed.path)


def _end(rt: runtime.Runtime, observed: _Call, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
         error: str) -> None:
    spec = observed.spec
    if spec.result_is_path and isinstance(result, (str, os.PathLike)) and not error:
        observed.path = os.fspath(result) if not isinstance(result, bytes) else observed.path
    if spec.kind == "save":
        _end_save(rt, observed, args, kwargs, result, error)
    elif not error:
        _end_load(rt, observed, args, kwargs, result)


def _end_save(rt: runtime.Runtime, observed: _Call, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
              error: str) -> None:
    blocking = max(0.0, time.monotonic() - observed.start_mono)
    if not observed.started and observed.phase and rt.phase == SAVE_PHASE:
        rt.set_phase(observed.phase)
    nbytes = 0 if error else _bytes(rt, observed, args, kwargs)
    if not observed.started and (error or nbytes < ckpt_rules.min_bytes()):
        return  # not a checkpoint: a small file, an export
    spec, step = observed.spec, rt.step

    def finish(total: float, ok: bool, why: str) -> None:
        rt.emit(CheckpointSaveFinished(time=time.time(), host=rt.host, attempt=rt.attempt, rank=rt.rank, step=step,
                                       blocking_seconds=blocking, total_seconds=max(total, blocking), bytes=nbytes,
                                       path=observed.path, ok=ok, error=why[:500], framework=spec.framework,
                                       entry=spec.entry))

    if observed.started and rt.phase == "checkpoint":
        rt.set_phase(observed.phase or "step")
    add_done = getattr(result, "add_done_callback", None)
    if error or not callable(add_done):
        finish(blocking, not error, error)
        return

    def done(future: Any) -> None:  # an async save: durable when its future is done
        try:
            failure = future.exception() if callable(getattr(future, "exception", None)) else None
            finish(time.monotonic() - observed.start_mono, failure is None, "" if failure is None else repr(failure))
        except Exception as exc:
            _failed(spec.entry, exc)

    add_done(done)


def _content_ids(objs: tuple[Any, ...]) -> set[int]:
    ids: set[int] = set()
    for obj in objs:
        if obj is None:
            continue
        ids.add(id(obj))
        values = getattr(obj, "values", None)
        if callable(values) and isinstance(obj, dict):
            for value in list(values())[:256]:
                ids.add(id(value))
    return ids


def _end_load(rt: runtime.Runtime, observed: _Call, args: tuple[Any, ...], kwargs: dict[str, Any],
              result: Any) -> None:
    global _episode
    spec = observed.spec
    content = (result, *(_arg(args, kwargs, ref) for ref in spec.content))
    nbytes = _bytes(rt, observed, args, kwargs)
    if not ckpt_rules.is_checkpoint(always=spec.always, content=content, path=observed.path, nbytes=nbytes):
        return
    begun = _prepared_start(content) if _prepared else None
    if begun is not None:
        observed.start_mono, observed.start_wall = min(begun, (observed.start_mono, observed.start_wall))
    step, epoch = ckpt_rules.step_in_content(*content)
    named = ckpt_rules.step_in_path(observed.path) if step is None else None
    now_mono, now_wall = time.monotonic(), time.time()
    with _lock:
        episode = _episode
        if episode is not None and observed.start_mono - episode.end_mono > EPISODE_GAP_SECONDS:
            _episode = None
            _emit_episode(episode, None)
            episode = None
        if episode is None:
            episode = _Episode(observed.start_mono, observed.start_wall, now_mono, now_wall, observed.path,
                               spec.entry, spec.framework, 0)
            _episode = episode
        episode.end_mono, episode.end_wall = now_mono, now_wall
        episode.nbytes += nbytes
        episode.ids |= _content_ids(content)
        if episode.step_source != "content" and step is not None:
            episode.step, episode.step_source = step, "content"
        elif not episode.step_source and named is not None:
            episode.step, episode.step_source = named, "name"
        if episode.epoch is None:
            episode.epoch = epoch


def prepared(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A call that builds the state a save writes or a load fills (DCP's ``get_state_dict``): when what it returns
    is then handed to an observed save or load, the save or restore began with it."""
    start_mono, start_wall = time.monotonic(), time.time()
    with _state_call():
        result = fn(*args, **kwargs)
    try:
        if _depth() == 0 and runtime.current() is not None:
            parts = result if isinstance(result, tuple) else (result,)
            with _lock:
                _prepared.append((start_mono, start_wall, tuple(p for p in parts if p is not None)))
                del _prepared[:-PREPARED_KEPT]
    except Exception as exc:
        _failed("a state preparation", exc)
    return result


def _prepared_start(content: tuple[Any, ...]) -> tuple[float, float] | None:
    """When the preparation of (part of) ``content`` began, if a recent one built it."""
    ids = _content_ids(content)
    with _lock:
        used = [entry for entry in _prepared if any(id(part) in ids for part in entry[2])]
        for entry in used:  # a preparation begins one save or restore
            _prepared.remove(entry)
    return min((mono, wall) for mono, wall, _ in used) if used else None


def applied(candidates: tuple[Any, ...], fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A call that applies a state (``load_state_dict``, DCP's ``set_state_dict``): part of the restore in progress
    when one of ``candidates`` (its arguments) is something that restore loaded."""
    episode = _episode
    if episode is None or _depth() > 0 or not any(id(c) in episode.ids for c in candidates):
        with _state_call():
            return fn(*args, **kwargs)
    with quiet(), _state_call():
        result = fn(*args, **kwargs)
    with _lock:
        if _episode is episode:
            episode.end_mono, episode.end_wall = time.monotonic(), time.time()
    return result


def on_step(optimizer: Any) -> None:
    """The optimizer is about to step: a restore in progress is over (its step count is the last resort)."""
    if in_state_call():
        return
    if _prepared:
        with _lock:
            _prepared.clear()
    if _episode is not None:
        close_episode(optimizer)


def close_episode(optimizer: Any = None) -> None:
    """Write the restore in progress, if any (``optimizer``: the one whose restored step count may say the step)."""
    global _episode
    with _lock:
        episode, _episode = _episode, None
    if episode is not None:
        _emit_episode(episode, optimizer)


def _emit_episode(episode: _Episode, optimizer: Any) -> None:
    rt = runtime.current()
    if rt is None or rt.closed:
        return
    try:
        if not episode.step_source and optimizer is not None:
            from trainguard.worker.autohooks import optimizer_step

            own = optimizer_step(optimizer)
            if own > 0:
                episode.step, episode.step_source = own, "optimizer"
        source = episode.step_source or "unknown"
        rt.emit(CheckpointLoaded(time=episode.end_wall, host=rt.host, attempt=rt.attempt, rank=rt.rank,
                                 step=episode.step if episode.step is not None else 0,
                                 seconds=max(0.0, episode.end_mono - episode.start_mono), path=episode.path,
                                 bytes=episode.nbytes, framework=episode.framework, entry=episode.entry,
                                 step_source=source, epoch=episode.epoch))
    except Exception as exc:
        _failed("a restore's record", exc)


def reset() -> None:
    """Forget any restore in progress, preparations and claims (tests)."""
    global _episode, _claims
    _episode, _claims = None, 0
    _prepared.clear()
    _local.depth = 0
    _local.state_calls = 0
