"""The signals that stop a run (SIGTERM, SIGINT, ...), held until the agent has acted on them.

torch's elastic agent turns a signal into a ``SignalException`` raised wherever its main thread happens to
be, and forgets it. ``SignalException`` is an ``Exception``: a signal landing inside any ``except
Exception`` guard on the main thread (a straggler probe, a telemetry sample, the classification of a
failure, a health check, the fleet database) was consumed there as "the probe failed" and the job trained
on. `StopSignals` keeps the first signal until the stop it asks for has begun: `check`, called at every
phase boundary of the agent (each monitor round, each rendezvous, each start of workers), raises it again,
so a swallowed signal costs at most the rest of the phase it landed in. Once the stop is underway
(`disarm`), further signals are recorded and do not interrupt it: a second Ctrl-C must not leave workers
half-stopped.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
"""torch's default ``TORCHELASTIC_SIGNALS_TO_HANDLE``."""


def signal_exception(sig: signal.Signals) -> Exception:
    """torch's ``SignalException`` for ``sig`` (what its own agent loop knows how to stop on)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    return SignalException(f"Process {os.getpid()} got signal: {sig}", sigval=sig)


class StopSignals:
    """Catches the stop signals of one `supervise` call and keeps the first until the stop has begun."""

    def __init__(self, names: Iterable[str] = DEFAULT_SIGNALS) -> None:
        self.signals = tuple(s for s in (getattr(signal, n.strip(), None) for n in names)
                             if isinstance(s, signal.Signals))
        self.first: signal.Signals | None = None
        """The first stop signal received (None: none yet)."""
        self.first_mono: float | None = None
        self.count = 0
        """Stop signals received so far."""
        self.armed = True
        """Whether a received signal is still to be raised (False once the stop it asked for has begun)."""
        self._saved: dict[signal.Signals, Any] = {}

    @classmethod
    def from_setting(cls, setting: str | None) -> StopSignals:
        """From torchrun's ``--signals-to-handle`` (None: torch's default list)."""
        return cls(setting.split(",") if setting else DEFAULT_SIGNALS)

    # --- handler ----------------------------------------------------------------------------------

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        self.count += 1
        if self.first is None:
            self.first, self.first_mono = sig, time.monotonic()
        if self.armed:
            raise signal_exception(sig)
        log.warning("%s received while the run is stopping: the stop goes on", sig.name)

    def install(self) -> None:
        """Make this object the handler of its signals (again: torch re-registers its own handler every time it
        starts workers). Only the main thread can; elsewhere this does nothing."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in self.signals:
            try:
                previous = signal.signal(sig, self._handle)
            except (OSError, ValueError, RuntimeError) as exc:
                log.debug("cannot handle %s: %s", sig.name, exc)
                continue
            if sig not in self._saved:
                self._saved[sig] = previous

    def restore(self) -> None:
        """Put back the handlers that were there before the first `install` (end of `supervise`)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._saved.items():
            try:
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
            except (OSError, ValueError, RuntimeError, TypeError) as exc:
                log.debug("cannot restore %s: %s", sig.name, exc)
        self._saved.clear()

    @property
    def active(self) -> bool:
        """Whether this object handles its signals now (installed, from the main thread)."""
        return bool(self._saved)

    # --- the agent's side -----------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """A stop signal arrived and its stop has not begun."""
        return self.first is not None and self.armed

    def check(self) -> None:
        """Raise the stop signal again if one arrived and was not acted on (it was swallowed by a guard)."""
        if self.pending and self.first is not None:
            log.warning("%s was received %.1fs ago and not acted on yet: stopping now", self.first.name,
                        time.monotonic() - (self.first_mono or time.monotonic()))
            raise signal_exception(self.first)

    def disarm(self) -> None:
        """The stop has begun (or the run is over): record further signals, raise nothing."""
        self.armed = False
