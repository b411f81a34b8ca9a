"""The agent's watch of the rendezvous store's size: a key count every few seconds, one console line."""

from __future__ import annotations

import logging

import pytest

from trainguard.launch.store_watch import MIN_KEY_LIMIT, StoreWatch


class _Store:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.keys = 10
        self.calls = 0

    def num_keys(self) -> int:
        self.calls += 1
        return self.keys


class _NoCount:
    def num_keys(self) -> int:
        raise NotImplementedError


def test_many_keys_are_reported_once_and_counted_at_most_every_interval(caplog: pytest.LogCaptureFixture) -> None:
    store, now = _Store(), [0.0]
    watch = StoreWatch(lambda: store, lambda: 4, interval=5.0, clock=lambda: now[0])
    assert watch.poll() is not None and watch.poll() is None  # the second look is too soon
    assert store.calls == 1
    store.keys = MIN_KEY_LIMIT + 1
    with caplog.at_level(logging.ERROR, logger="trainguard.launch.store_watch"):
        for _ in range(5):
            now[0] += 5.0
            watch.poll()
    lines = [r.getMessage() for r in caplog.records if "rendezvous store holds" in r.getMessage()]
    assert len(lines) == 1 and f"holds {MIN_KEY_LIMIT + 1} keys" in lines[0], lines
    assert store.calls == 2  # once warned, the store is not asked again


def test_the_limit_grows_with_the_job_and_a_store_without_a_count_is_left_alone() -> None:
    assert StoreWatch(lambda: None, lambda: 100_000).key_limit() > MIN_KEY_LIMIT
    watch = StoreWatch(lambda: _NoCount(), lambda: 1)
    assert watch.poll() is None and not watch.warned


def test_a_store_served_by_another_host_is_not_asked() -> None:
    # A remote store's round trip could stall the monitor loop behind a lost node; its host watches it.
    remote = _Store(host="192.0.2.1")  # TEST-NET-1: never an address of this machine
    remote.keys = MIN_KEY_LIMIT * 10
    watch = StoreWatch(lambda: remote, lambda: 1)
    assert watch.poll() is None and remote.calls == 0 and not watch.warned
