"""In-process restart: `restartable` runs a training function again in the same interpreter after a peer fails.

Under ``trainguard run --in-process`` a rank whose collective breaks because a peer died (or was killed for
hanging) does not exit: it tears its process group down, waits for the agent to start the next attempt
(only the failed ranks get new processes), re-forms the group under that attempt's store prefix and calls
the function again, which restores from its checkpoint. Without ``--in-process`` (plain torchrun, or
``trainguard run`` without the flag) the wrapper only initializes and destroys the process group.
The store's keys are named and their values signed with the job secret (`SignedKeys`): any local user can
reach a TCPStore, and a forged ``next``/``env`` would send a rank into an attempt of someone else's making.
See docs/run.md ("In-process restart") and docs/security.md.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar, cast, overload

from trainguard.core import protocol
from trainguard.launch.store_auth import StoreSigner, job_signer
from trainguard.worker.group_sockets import GroupSockets

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

_PEER_WORDS = ("gloo", "nccl", "connection", "peer", "socket", "timed out", "timeout", "abort")
"""Words in a RuntimeError's message that say a collective broke (torch raises a plain RuntimeError for gloo)."""


class InProcessGaveUp(RuntimeError):
    """The agent started no new attempt within the timeout after a peer failure; the rank exits."""


class RegroupNow(BaseException):
    """Raised from `trainguard.Replica.completed` in the survivors' interim group once the new ranks have arrived:
    the wrapper ends the interim group and forms the whole one. A BaseException, so that a loop's own
    ``except Exception`` does not swallow it."""


class _Interim:
    """The survivors' group while the failed ranks' new processes start: its leader reads how many arrived."""

    def __init__(self, store: Any, arrived_key: str, new_ranks: int, leader: bool, device: Any) -> None:
        self.store = store
        self.arrived_key = arrived_key
        self.new_ranks = new_ranks
        self.leader = leader
        self.device = device
        self.steps = 0

    def due(self) -> bool:
        """Collective over the interim group: whether every new process has arrived (the leader's read, sent to
        all, so that every survivor leaves at the same step)."""
        import torch
        import torch.distributed as dist

        self.steps += 1
        flag = torch.zeros(1, device=self.device)
        if self.leader:
            flag[0] = float(int(self.store.add(self.arrived_key, 0)) >= self.new_ranks)
        dist.broadcast(flag, src=0)
        return bool(flag.item() > 0)


_INTERIM: _Interim | None = None
"""Set while this process trains in the survivors' interim group."""
_REPLICA_IN_USE = False
"""A `trainguard.Replica` marked a completed step in this process: the script can train on without the failed
ranks and heal them when they arrive."""


def note_replica_step(keep_training: bool) -> None:
    """Called by `trainguard.Replica.completed` after each step: in the interim group, `RegroupNow` once the new
    ranks are there. ``keep_training``: the replica wants the survivors to train on after a failure."""
    global _REPLICA_IN_USE
    _REPLICA_IN_USE = keep_training
    interim = _INTERIM
    if interim is not None and interim.due():
        raise RegroupNow()


class SignedKeys:
    """The in-process store's keys, bound to the job secret: each key's name carries a tag only holders of
    the secret can compute (so nobody else can write it), and each value carries an HMAC (so a value that
    got there some other way is refused, as if not yet written)."""

    def __init__(self, signer: StoreSigner) -> None:
        self._signer = signer
        self._refused = False

    def key(self, attempt: int, name: str) -> str:
        return self._signer.claim_key(protocol.inprocess_key(attempt, name))

    def pg_prefix(self, attempt: int) -> str:
        """Prefix of the process group's own keys in ``attempt``."""
        return self.key(attempt, "pg") + "/"

    def seal(self, attempt: int, name: str, value: str) -> bytes:
        return self._signer.sign(self.key(attempt, name), {"value": value})

    def open(self, attempt: int, name: str, raw: bytes) -> str | None:
        """The value `seal` made, or None (logged once per process) when it does not verify."""
        fields = self._signer.verify(self.key(attempt, name), raw, ("value",), report=False)
        if fields is not None:
            return fields["value"]
        if not self._refused:  # once: a forger writing in a loop must not flood the rank's log
            self._refused = True
            log.error("trainguard: ignored an unsigned or forged %r for attempt %d in the in-process store "
                      "(another local user may be writing to it)", name, attempt)
        return None


@dataclass(frozen=True)
class InProcessSettings:
    """What the agent tells a rank about in-process restarts (``TRAINGUARD_INPROCESS_*``)."""

    host: str
    """Host of the agent's in-process store."""
    port: int
    """Its TCP port."""
    timeout_seconds: float
    """How long to wait for the next attempt after a peer failure before exiting."""
    attempt: int
    """This process's attempt when it started (``TRAINGUARD_ATTEMPT``)."""
    rank: int
    """Global rank (``RANK``); the same in every attempt."""
    world_size: int
    """``WORLD_SIZE``; the same in every attempt."""
    run_dir: Path | None = None
    """The run directory, whose job secret signs the store (``TRAINGUARD_RUN_DIR``)."""

    @classmethod
    def from_environ(cls, env: dict[str, str] | None = None) -> InProcessSettings | None:
        """The settings, or None when the agent does not run in in-process mode (or a value is malformed)."""
        env = dict(os.environ) if env is None else env
        host, sep, port = env.get(protocol.INPROCESS_STORE_ENV, "").rpartition(":")
        if not sep or not port.isdigit():
            return None
        try:
            timeout = float(env.get(protocol.INPROCESS_TIMEOUT_ENV, "60"))
            return cls(host=host, port=int(port), timeout_seconds=max(1.0, timeout),
                       attempt=int(env.get("TRAINGUARD_ATTEMPT", "0")), rank=int(env.get("RANK", "0")),
                       world_size=int(env.get("WORLD_SIZE", "1")),
                       run_dir=Path(env["TRAINGUARD_RUN_DIR"]) if env.get("TRAINGUARD_RUN_DIR") else None)
        except ValueError:
            return None


def peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says a collective or the process group broke (a peer died, a connection closed),
    as opposed to an error of the rank's own code, which ends the process as before."""
    try:
        import torch.distributed as dist

        if isinstance(exc, dist.DistError):
            return True
    except ImportError:
        return False
    if not isinstance(exc, RuntimeError) or isinstance(exc, InProcessGaveUp):
        return False
    text = str(exc).lower()
    if any(word in text for word in _PEER_WORDS):
        return True
    tb = exc.__traceback__
    while tb is not None:  # raised from inside torch.distributed (a collective, DDP's reducer, a store)
        if f"{os.sep}torch{os.sep}distributed{os.sep}" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False


def _backend(backend: str | None) -> str:
    if backend:
        return backend
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def _teardown(backend: str) -> None:
    """Drop the default process group (and every group built on it) so a new one can be formed."""
    import torch.distributed as dist

    from trainguard.torch_api.c10d import abort_process_group

    if not dist.is_initialized():
        return
    try:
        if backend == "nccl":
            abort_process_group()  # pending NCCL work would block a plain destroy
        else:  # torch's own, not the script's (`autohooks.install_destroy_hook`): this rank trains on
            getattr(dist.destroy_process_group, "__wrapped__", dist.destroy_process_group)()
    except Exception as exc:  # a broken group may fail to close cleanly
        log.warning("trainguard: closing the broken process group: %s", exc)


def _leave_broken(backend: str, sockets: GroupSockets) -> None:
    """Leave a group that broke: on gloo, first end this rank's side of its connections, so that a live peer
    still blocked reading from this rank fails now (`trainguard.worker.group_sockets`), then tear it down."""
    if backend == "gloo":
        shut = sockets.end_writes()
        log.debug("trainguard: ended %d connection(s) of the broken group", shut)
    _teardown(backend)


def _last_words(exc: BaseException, rank: int) -> None:
    """The flight-recorder dump and stacks of the broken attempt, written before the process group goes (the
    agent's own request comes later, when there is no group left to dump): what a rank exiting on the same
    error would have written on its way out. Never raises."""
    folder = os.environ.get("TRAINGUARD_EVIDENCE_DIR")
    if not folder or not os.environ.get("TRAINGUARD_AGENT_PID"):
        return
    try:
        from trainguard.worker.control import write_evidence

        write_evidence(Path(folder), rank, preface=f"# collective broke; rank waits for the next attempt\n"
                                                    f"# {type(exc).__name__}: {str(exc).splitlines()[0][:300]}\n")
    except Exception as err:
        log.warning("trainguard: no evidence from the broken attempt (%s)", err)


def _signed_value(store: Any, keys: SignedKeys, attempt: int, name: str, deadline: float) -> str:
    """The signed value of ``name`` in ``attempt``, waiting for it until ``deadline`` (``time.monotonic()``);
    a value that does not verify counts as not yet written. `InProcessGaveUp` after the deadline."""
    key = keys.key(attempt, name)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise InProcessGaveUp(f"no signed {name!r} for attempt {attempt} in time")
        try:
            store.wait([key], timedelta(seconds=remaining))
        except Exception as exc:
            raise InProcessGaveUp(f"no {name!r} for attempt {attempt} within the timeout") from exc
        value = keys.open(attempt, name, store.get(key))
        if value is not None:
            return value
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))  # the agent's own write replaces it


def _enter_attempt(store: Any, keys: SignedKeys, attempt: int, deadline: float) -> None:
    """Take the new attempt's environment and drop this process's trainguard runtime, so the function's next
    ``trainguard.attach()`` writes heartbeats and events for the new attempt; the automatic hooks (a function
    that never calls ``attach()``) get the new attempt's runtime here (`autohooks.on_new_attempt`)."""
    updates = json.loads(_signed_value(store, keys, attempt, "env", deadline))
    if not isinstance(updates, dict):
        raise InProcessGaveUp(f"attempt {attempt}'s environment is not a JSON object")
    os.environ.update({k: str(v) for k, v in updates.items() if k in protocol.INPROCESS_ATTEMPT_ENV})
    _fresh_runtime()


def _fresh_runtime() -> None:
    """Close this process's trainguard runtime and its SDC check: the function's next ``attach()`` starts them
    anew, as in a new process (whose step counters, and the collectives they time, the others' must match)."""
    from trainguard.worker import runtime

    rt = runtime.current()
    if rt is not None:
        rt.close()
    sdc = sys.modules.get("trainguard.sdc.check")
    if sdc is not None:  # its optimizer hook holds the old runtime
        sdc.uninstall()
    autohooks = sys.modules.get("trainguard.worker.autohooks")
    if autohooks is not None:  # an unmodified loop (no attach()): its steps go on being counted
        autohooks.on_new_attempt()


def _next_attempt(store: Any, keys: SignedKeys, attempt: int, timeout_seconds: float) -> int:
    """Block until the agent names the attempt after ``attempt``; `InProcessGaveUp` after the timeout."""
    deadline = time.monotonic() + timeout_seconds
    try:
        value = _signed_value(store, keys, attempt, "next", deadline)
    except InProcessGaveUp as exc:
        raise InProcessGaveUp(f"no new attempt within {timeout_seconds:g}s after attempt {attempt} failed") from exc
    if not value.isdigit() or int(value) <= attempt:
        raise InProcessGaveUp(f"the agent named attempt {value!r} after attempt {attempt}")
    return int(value)


class _AbortWatch:
    """NCCL only: abort the communicators when the agent opens the next attempt while this rank is still
    inside the function. A gloo collective fails by itself when a peer dies (its sockets close) or leaves the
    broken group (`_leave_broken`); an NCCL one may wait for the process-group timeout. Untested here (no
    GPUs)."""

    def __init__(self, settings: InProcessSettings, keys: SignedKeys, attempt: int) -> None:
        self._settings = settings
        self._key = keys.key(attempt, "next")
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="trainguard-inprocess-abort", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        import torch.distributed as dist

        from trainguard.torch_api.c10d import abort_process_group

        try:  # its own connection: one store client is not shared between threads
            store = dist.TCPStore(self._settings.host, self._settings.port, is_master=False,
                                  timeout=timedelta(seconds=self._settings.timeout_seconds))
            while not self._done.is_set():
                try:
                    store.wait([self._key], timedelta(seconds=5))
                except Exception:  # not yet: look again unless the attempt ended
                    continue
                if not self._done.is_set() and dist.is_initialized():
                    log.warning("trainguard: the agent opened the next attempt; aborting this rank's collectives")
                    abort_process_group()
                return
        except Exception as exc:  # the watch is a speed-up; the agent's timeout and fallback still apply
            log.warning("trainguard: no abort watch (%s)", exc)

    def stop(self) -> None:
        self._done.set()


class _Restarter:
    """The loop behind `restartable` for one process."""

    def __init__(self, settings: InProcessSettings, backend: str) -> None:
        import torch.distributed as dist

        self.settings = settings
        self.backend = backend
        self.keys = SignedKeys(job_signer(settings.run_dir or Path(".")))
        self.store = dist.TCPStore(settings.host, settings.port, is_master=False,
                                   timeout=timedelta(seconds=settings.timeout_seconds))

    def _form_group(self, attempt: int) -> None:
        import torch.distributed as dist

        from trainguard.worker.library import pg_timeout

        s = self.settings
        pg_store = dist.PrefixStore(self.keys.pg_prefix(attempt), self.store)
        dist.init_process_group(self.backend, store=pg_store, rank=s.rank, world_size=s.world_size,
                                timeout=pg_timeout())
        self.store.add(self.keys.key(attempt, "joined"), 1)

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        attempt = self.settings.attempt
        if attempt > 0:  # a failed rank's new process: the survivors training meanwhile wait for this
            self.store.add(self.keys.key(attempt, "arrived"), 1)
        while True:
            watch = _AbortWatch(self.settings, self.keys, attempt) if self.backend == "nccl" else None
            sockets = GroupSockets()
            try:
                self._form_group(attempt)
                sockets.formed()
                result = fn(*args, **kwargs)
            except Exception as exc:
                if watch is not None:
                    watch.stop()
                if not peer_failure(exc):
                    raise
                failed_mono = time.monotonic()
                log.warning("trainguard: attempt %d broke on rank %d (%s: %s); waiting for the next attempt",
                            attempt, self.settings.rank, type(exc).__name__, str(exc).splitlines()[0][:200])
                _last_words(exc, self.settings.rank)
                _leave_broken(self.backend, sockets)
                attempt = _next_attempt(self.store, self.keys, attempt, self.settings.timeout_seconds)
                _enter_attempt(self.store, self.keys, attempt, time.monotonic() + self.settings.timeout_seconds)
                log.warning("trainguard: rank %d re-enters in attempt %d (%.2fs after the failure)",
                            self.settings.rank, attempt, time.monotonic() - failed_mono)
                if _REPLICA_IN_USE:
                    self._train_meanwhile(fn, args, kwargs, attempt)
                continue
            if watch is not None:
                watch.stop()
            _teardown(self.backend)
            return result

    def _train_meanwhile(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                         attempt: int) -> None:
        """Survivors of a script with a `trainguard.Replica`: train in a group of their own, renumbered, until the
        failed ranks' new processes arrive (`RegroupNow` at a completed step), as torchft's replica groups go on
        without a lost member. Any trouble forming it: the survivors just wait for the whole group, as before."""
        global _INTERIM
        import torch.distributed as dist

        s = self.settings
        deadline = time.monotonic() + s.timeout_seconds
        survivors = int(_signed_value(self.store, self.keys, attempt, "survivors", deadline))
        if not 0 < survivors < s.world_size:
            return
        rank = int(self.store.add(self.keys.key(attempt, "interim-rank"), 1)) - 1
        if rank >= survivors:
            return
        started = time.monotonic()
        sockets = GroupSockets()
        try:
            pg_store = dist.PrefixStore(self.keys.key(attempt, "interim") + "/", self.store)
            dist.init_process_group(self.backend, store=pg_store, rank=rank, world_size=survivors,
                                    timeout=timedelta(seconds=s.timeout_seconds))
            sockets.formed()
        except Exception as exc:
            log.warning("trainguard: no interim group of the survivors (%s); waiting for the whole group", exc)
            _teardown(self.backend)
            return
        from trainguard.worker.replica import wire_device

        _INTERIM = _Interim(self.store, self.keys.key(attempt, "arrived"), s.world_size - survivors, rank == 0,
                            wire_device(None))
        interim = _INTERIM
        log.warning("trainguard: rank %d trains on as rank %d of %d survivor(s) until the new process(es) arrive",
                    s.rank, rank, survivors)
        try:
            fn(*args, **kwargs)  # returns only when training ended meanwhile: the whole group still forms
        except RegroupNow:
            pass
        except Exception as exc:
            if not peer_failure(exc):
                raise
            log.warning("trainguard: the survivors' interim group broke (%s)", str(exc).splitlines()[0][:200])
            _leave_broken(self.backend, sockets)
        finally:
            _INTERIM = None
            _teardown(self.backend)
            _fresh_runtime()  # the new ranks start theirs now: counted from here, the periodic checks agree
        log.warning("trainguard: rank %d leaves the interim group after %d step(s) in %.2fs", s.rank, interim.steps,
                    time.monotonic() - started)


def _plain_run(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], backend: str) -> Any:
    """No in-process agent: the process group from torchrun's environment, one call, as a plain script."""
    import torch.distributed as dist

    from trainguard.worker.library import pg_timeout

    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=pg_timeout())
    try:
        return fn(*args, **kwargs)
    finally:
        _teardown(backend)


@overload
def restartable(fn: F, *, backend: str | None = None) -> F: ...


@overload
def restartable(fn: None = None, *, backend: str | None = None) -> Callable[[F], F]: ...


def restartable(fn: F | None = None, *, backend: str | None = None) -> F | Callable[[F], F]:
    """Make ``fn`` (the whole training: build, restore, loop) restartable in process.

    The wrapper creates the default process group before each call (``backend``: ``nccl`` with CUDA,
    else ``gloo``) and destroys it after; ``fn`` must not call ``init_process_group`` itself and must
    restore from its checkpoint on entry. Use as ``@restartable`` or ``@restartable(backend="gloo")``.
    An error of ``fn``'s own (not a broken collective) propagates as before and ends the process.
    """

    def wrap(f: F) -> F:
        @functools.wraps(f)
        def run(*args: Any, **kwargs: Any) -> Any:
            chosen = _backend(backend)
            settings = InProcessSettings.from_environ()
            if settings is None:
                return _plain_run(f, args, kwargs, chosen)
            return _Restarter(settings, chosen).run(f, args, kwargs)

        return cast(F, run)

    return wrap(fn) if fn is not None else wrap
