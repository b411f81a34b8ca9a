"""`trainguard.launch.shared_waiting`: one node per round reads the whole rendezvous state; the others read two
integers from a real TCPStore, and read the state themselves when no leader publishes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from trainguard.launch.shared_waiting import STALE_READS, SharedWaiting


@pytest.fixture()
def store() -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


class _State:
    """The wait list's length as torch's state would say it, and how often it was read."""

    def __init__(self) -> None:
        self.waiting = 0
        self.reads = 0

    def read(self) -> int:
        self.reads += 1
        return self.waiting


def test_followers_read_the_leaders_count_not_the_state(store: TCPStore) -> None:
    state = _State()
    leader = SharedWaiting(store, "job", 3, True, state.read)
    followers = [SharedWaiting(store, "job", 3, False, state.read) for _ in range(4)]
    # before the leader's first read, a follower reads the state itself
    assert followers[0].read() == 0 and followers[0].full_reads == 1
    for waiting in (0, 2, 2, 1, 0, 5):
        state.waiting = waiting
        assert leader.read() == waiting  # up, down, back to zero: deltas add up to the count
        assert [f.read() for f in followers] == [waiting] * 4
    assert leader.full_reads == 6
    # a count above zero is confirmed from the (signed) state: 4 such reads of the 6 (2, 2, 1, 5)
    assert [f.full_reads for f in followers] == [1 + 4, 4, 4, 4]
    # another round's keys are its own
    assert SharedWaiting(store, "job", 4, False, lambda: 7).read() == 7


def test_a_follower_reads_the_state_itself_once_the_leader_stops_publishing(store: TCPStore) -> None:
    state = _State()
    leader = SharedWaiting(store, "job", 0, True, state.read)
    follower = SharedWaiting(store, "job", 0, False, state.read)
    leader.read()
    follower.read()
    state.waiting = 1  # a node waits, and the leader is gone (in a rendezvous of its own, or dead)
    seen = [follower.read() for _ in range(STALE_READS)]
    assert seen[:-1] == [0] * (STALE_READS - 1)  # the leader's last count, for a few reads
    assert seen[-1] == 1 and follower.full_reads == 1
    leader.read()  # the leader is back: its count (1) is confirmed from the state
    assert follower.read() == 1 and follower.full_reads == 2
    state.waiting = 0
    leader.read()
    assert follower.read() == 0 and follower.full_reads == 2  # "nobody waits" needs no state read


def test_a_forged_count_costs_a_state_read_not_a_restart(store: TCPStore) -> None:
    # The integers are not signed (torch's state is): a count written by someone else is checked before use.
    state = _State()
    leader = SharedWaiting(store, "job", 2, True, state.read)
    follower = SharedWaiting(store, "job", 2, False, state.read)
    leader.read()
    store.add("trainguard/job/waiting/2/count", 5)  # a forger
    assert follower.read() == 0 and follower.full_reads == 1
