"""Collective progress from the flight recorder's per-group counters (`trainguard.worker.progress`)."""

from __future__ import annotations

from trainguard.worker.progress import CollectiveTracker


def status(enqueued: int, completed: int, group: str = "0") -> dict[str, dict[str, str]]:
    """One group's counters as the recorder's JSON dump writes them (numbers as text)."""
    return {group: {"last_enqueued_collective": str(enqueued), "last_completed_collective": str(completed),
                    "last_started_collective": "-1"}}


def test_a_pending_collective_is_dated_from_when_it_was_first_seen() -> None:
    t = CollectiveTracker()
    assert t.update(status(4, 4), 1.0).pending_since_mono == 0.0
    assert t.update(status(5, 4), 2.0).pending_since_mono == 2.0
    assert t.update(status(6, 4), 3.0).pending_since_mono == 2.0  # still the oldest, collective 5
    after = t.update(status(6, 5), 4.0)
    assert (after.collectives_done, after.pending_since_mono) == (5, 4.0)  # now 6 is the oldest


def test_what_was_enqueued_before_a_step_ended_is_over() -> None:
    """gloo counts DDP's last gradient bucket done only at the next backward: without the step's mark the rank
    looked waiting through an evaluation after the step."""
    t = CollectiveTracker()
    lagging = status(10, 9)
    assert t.update(lagging, 1.0).pending_since_mono == 1.0
    t.settle(lagging)  # the step ended with collective 10 enqueued
    settled = t.update(lagging, 2.0)
    assert (settled.collectives_done, settled.pending_since_mono) == (10, 0.0)
    # A collective of the next step is watched as before: a hang in it is still a wait.
    assert t.update(status(11, 9), 3.0).pending_since_mono == 3.0
    assert t.update(status(11, 9), 9.0).pending_since_mono == 3.0


def test_unreadable_counters_are_skipped() -> None:
    t = CollectiveTracker()
    t.settle({"0": {"last_enqueued_collective": "x"}, **status(3, 2, group="1")})
    got = t.update({"0": {}, **status(3, 2, group="1")}, 1.0)
    assert (got.collectives_done, got.pending_since_mono) == (3, 0.0)
