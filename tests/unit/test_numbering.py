"""The job-wide attempt number from the rendezvous round: every agent of a round gets the same number, a spare
joining later continues it, a handler without rounds keeps the local count."""

from __future__ import annotations

from types import SimpleNamespace

import torch.distributed as dist

from trainguard.launch.attempts import Attempts
from trainguard.launch.numbering import JobNumbering


def _handler(store: dist.Store, round_: int) -> SimpleNamespace:
    """What `trainguard.torch_api.rendezvous` reads of torch's dynamic handler: its store and the state's round."""
    return SimpleNamespace(_store=store, _state_holder=SimpleNamespace(state=SimpleNamespace(round=round_)))


def test_agents_of_one_round_agree_and_a_late_node_takes_the_round_it_joined() -> None:
    store = dist.HashStore()
    # The store of a rendezvous id used before (etcd keeps rounds): the job starts at round 4, attempt 0.
    a, b, late = JobNumbering("job"), JobNumbering("job"), JobNumbering("job")
    assert [n.after_rendezvous(_handler(store, 4)) for n in (a, b, late)] == [0, 0, 0]
    # A crash: a and b form round 5 without the late node, which joins round 6 with them.
    assert [n.after_rendezvous(_handler(store, 5)) for n in (a, b)] == [1, 1]
    assert [n.after_rendezvous(_handler(store, 6)) for n in (a, b, late)] == [2, 2, 2]
    # A spare arriving now continues the job's numbers.
    assert JobNumbering("job").after_rendezvous(_handler(store, 7)) == 3


def test_a_job_requeued_into_the_same_run_dir_goes_on_from_its_attempts() -> None:
    store = dist.HashStore()  # the requeued job's fresh store: its rounds start at 0 again
    first, other = JobNumbering("job", lambda: 3), JobNumbering("job", lambda: 99)
    assert first.after_rendezvous(_handler(store, 0)) == 3
    assert other.after_rendezvous(_handler(store, 0)) == 3  # the first node's count holds for every node
    assert other.after_rendezvous(_handler(store, 1)) == 4


def test_the_ledger_takes_the_round_and_a_late_node_skips_the_round_it_missed() -> None:
    store = dist.HashStore()
    on_time, late = Attempts(3, 3), Attempts(3, 3)
    numbering = {id(on_time): JobNumbering("j"), id(late): JobNumbering("j")}
    for ledger in (on_time, late):
        ledger.rendezvous()
        ledger.numbered(numbering[id(ledger)].after_rendezvous(_handler(store, 0)))
    on_time.rendezvous()
    on_time.numbered(numbering[id(on_time)].after_rendezvous(_handler(store, 1)))
    for ledger in (on_time, late):
        ledger.rendezvous()  # the late node's own count says 1: the round says 2
        ledger.numbered(numbering[id(ledger)].after_rendezvous(_handler(store, 2)))
    assert on_time.number == late.number == 2


def test_an_in_process_restart_counts_without_a_round_and_the_next_round_does_not_go_back() -> None:
    ledger = Attempts(3, 3)
    ledger.rendezvous()
    assert ledger.numbered(0) == 0
    ledger.number += 1  # what an in-process restart does (no rendezvous)
    ledger.rendezvous()
    assert ledger.numbered(1) == 2


def test_a_handler_without_rounds_or_store_leaves_the_count_to_the_agent() -> None:
    assert JobNumbering("j").after_rendezvous(SimpleNamespace()) is None  # static rendezvous
    no_store = SimpleNamespace(_state_holder=SimpleNamespace(state=SimpleNamespace(round=0)))
    numbering = JobNumbering("j")
    assert numbering.after_rendezvous(no_store) is None
    assert numbering.after_rendezvous(_handler(dist.HashStore(), 1)) is None  # decided once per agent


def test_the_round_is_the_one_joined_even_when_a_keep_alive_read_a_later_one() -> None:
    # torch's own handler over a real TCPStore: after it joins, its keep-alive thread refreshes the state, and a
    # peer restarting for a late node opens the next round. Read then, the round was the next one; two nodes of one
    # round numbered it apart (a 3-node demo at load 12).
    from datetime import timedelta

    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    from trainguard.torch_api.rendezvous import remember_joined_rounds, round_of

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=20))
    params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{store.port}", run_id="job", min_nodes=1,
                                  max_nodes=1)
    handler = create_handler(store, C10dRendezvousBackend(store, "job"), params)
    try:
        assert remember_joined_rounds(handler) and not remember_joined_rounds(handler)  # once
        handler.next_rendezvous()
        joined = handler._state_holder.state.round
        handler._state_holder.state.round = joined + 1  # what a later read of the store brings
        assert round_of(handler) == joined
        assert JobNumbering("job").after_rendezvous(handler) == 0
    finally:
        handler.shutdown()
