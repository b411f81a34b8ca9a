"""Which ranks a crash is blamed on, from the exit codes of the ranks that ended."""

from __future__ import annotations

import signal

from trainguard.launch.blame import crash_culprits


def test_killed_rank_is_blamed_not_the_rank_that_aborted_after_it() -> None:
    # Seen in CI: rank 1 SIGKILLed, rank 0's gloo aborted on "Connection reset by peer" (SIGABRT).
    assert crash_culprits({0: -signal.SIGABRT, 1: -signal.SIGKILL}) == ([1], "crash")


def test_abort_alone_is_the_culprit() -> None:
    assert crash_culprits({2: -signal.SIGABRT, 3: 1}) == ([2], "crash")


def test_signal_outranks_error_exit() -> None:
    assert crash_culprits({0: 1, 1: -signal.SIGSEGV}) == ([1], "crash")


def test_error_exits_only() -> None:
    assert crash_culprits({0: 1, 3: 2}) == ([0, 3], "exit")


def test_a_survivor_stopped_by_sigterm_is_not_blamed_with_the_killed_rank() -> None:
    # Seen in CI on a busy host: rank 3 SIGKILLed by a fault, rank 2 (same node) stopped by the agent's SIGTERM
    # before the exit codes were read; the failure record blamed both.
    assert crash_culprits({2: -signal.SIGTERM, 3: -signal.SIGKILL}) == ([3], "crash")
    # every rank stopped by SIGTERM (a scheduler's stop): they are all that is known
    assert crash_culprits({0: -signal.SIGTERM, 1: -signal.SIGTERM}) == ([0, 1], "crash")
