"""`trainguard.launch.signals.StopSignals`: a stop signal swallowed by an ``except Exception`` guard is raised
again at the next phase boundary, and a second signal does not interrupt a stop that has begun."""

from __future__ import annotations

import signal

import pytest
from torch.distributed.elastic.multiprocessing.api import SignalException

from trainguard.launch.signals import StopSignals


def _swallowed(sig: signal.Signals) -> None:
    """What a guarded phase (a straggler probe, a telemetry sample, a classification) did with a signal."""
    try:  # noqa: SIM105 - the very shape of the guards that swallowed signals
        signal.raise_signal(sig)
    except Exception:
        pass


def test_a_swallowed_signal_is_raised_again_at_the_next_check() -> None:
    signals = StopSignals(["SIGTERM", "SIGINT"])
    signals.install()
    try:
        _swallowed(signal.SIGTERM)
        assert signals.first == signal.SIGTERM and signals.pending
        with pytest.raises(SignalException) as raised:
            signals.check()
        assert raised.value.sigval == signal.SIGTERM
        with pytest.raises(SignalException):  # until the stop has begun
            signals.check()
    finally:
        signals.restore()


def test_once_disarmed_signals_are_recorded_not_raised() -> None:
    signals = StopSignals(["SIGTERM", "SIGINT"])
    signals.install()
    try:
        _swallowed(signal.SIGTERM)
        signals.disarm()
        signal.raise_signal(signal.SIGINT)  # a second Ctrl-C during the stop: no exception
        signals.check()
        assert signals.count == 2 and signals.first == signal.SIGTERM
    finally:
        signals.restore()


def test_restore_puts_back_the_previous_handlers() -> None:
    before = signal.getsignal(signal.SIGTERM)
    signals = StopSignals(["SIGTERM"])
    signals.install()
    signals.install()  # again, as after torch registered its own handler
    assert signal.getsignal(signal.SIGTERM) == signals._handle
    signals.restore()
    assert signal.getsignal(signal.SIGTERM) == before


def test_unknown_names_are_ignored_and_torchs_setting_is_read() -> None:
    assert StopSignals.from_setting(None).signals == (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    assert StopSignals.from_setting("SIGUSR1, SIGNOPE").signals == (signal.SIGUSR1,)
