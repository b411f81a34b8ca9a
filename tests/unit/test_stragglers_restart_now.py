"""Straggler policy ``restart-now``: the leader's decision (spare waiting or fallback), the announcement reaching
the slow node's agent through a real TCPStore, and the command-line settings taking precedence over the
environment."""

from __future__ import annotations

import datetime
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_stragglers import synth
from tests.unit.test_stragglers_watch import _write_steps
from trainguard.core.events import Event, StragglerAction, StragglerDetected
from trainguard.core.protocol import RunLayout
from trainguard.errors import UsageError
from trainguard.launch.store_auth import StoreSigner
from trainguard.stragglers.handover import StoreHandover
from trainguard.stragglers.watch import AgentWatch, WatchSettings, check_options

SIGNER = StoreSigner(b"0123456789abcdef-test-secret")


class _Handler:
    """The two members of torch's c10d handler that `StoreHandover.spares_waiting` reads."""

    def __init__(self, redundant: int, waiting: int = 0) -> None:
        self._heartbeat_lock = threading.Lock()
        self._state_holder = self
        self.state = self
        self.redundancy_list = {f"spare{i}" for i in range(redundant)}
        self.wait_list = {f"late{i}" for i in range(waiting)}
        self.syncs = 0

    def sync(self) -> None:
        self.syncs += 1


@pytest.fixture
def store() -> Any:
    torch_dist = pytest.importorskip("torch.distributed")
    return torch_dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))


def _watches(tmp_path: Path, store: Any, handler: Any) -> tuple[AgentWatch, AgentWatch, list[Event]]:
    layout = RunLayout(tmp_path)
    layout.events_dir.mkdir(parents=True, exist_ok=True)
    emitted: list[Event] = []
    settings = WatchSettings("restart-now", 1.0, 0.0)
    leader = AgentWatch(layout, "h0", emitted.append, settings, sources=[],
                        handover=StoreHandover(lambda: store, "run", handler, SIGNER))
    slow = AgentWatch(layout, "h1", lambda e: None, settings, sources=[],
                      handover=StoreHandover(lambda: store, "run", handler, SIGNER))
    for w in (leader, slow):
        w.on_attempt(0)
    records, _, _ = synth(ranks=4, hosts=2, slow={3: 1.3}, onset=5)
    _write_steps(tmp_path, records)
    leader._read_steps()
    return leader, slow, emitted


def test_with_a_spare_waiting_the_slow_node_is_told_to_leave_now(tmp_path: Path, store: Any) -> None:
    handler = _Handler(redundant=1)
    leader, slow, emitted = _watches(tmp_path, store, handler)
    named = leader.check()
    assert [(r.rank, r.node, r.action) for r in named] == [(3, "h1", "restart-now")]
    (action,) = [e for e in emitted if isinstance(e, StragglerAction)]
    assert (action.policy, action.action, action.spares_waiting, action.node) == ("restart-now", "restart-now", 1, "h1")
    assert handler.syncs == 1  # the count is read fresh from the rendezvous state
    # The leader's own node is not the slow one: it stays. The slow node's next poll returns why it leaves.
    assert leader.poll(lambda: {}, True) is None
    reason = slow.poll(lambda: {}, False)
    assert reason is not None and reason.startswith("straggler: rank 3 slowed the job")
    assert "restart-now: 1 spare node(s) waiting" in reason
    assert slow.poll(lambda: {}, False) is None  # told once
    assert slow.exclusion_reasons(1) == [reason]  # its health gate at the restart
    assert leader.exclusion_reasons(1) == []
    # The peers see their workers fail next: a planned restart of attempt 0, not a failure of theirs.
    assert leader.planned_leave(0) == reason and leader.planned_leave(1) is None


def test_without_a_spare_it_falls_back_to_exclude_next_restart_and_says_so(tmp_path: Path, store: Any) -> None:
    leader, slow, emitted = _watches(tmp_path, store, _Handler(redundant=0))
    (named,) = leader.check()
    assert named.action == "exclude-next-restart"
    (action,) = [e for e in emitted if isinstance(e, StragglerAction)]
    assert (action.policy, action.action, action.spares_waiting) == ("restart-now", "exclude-next-restart", 0)
    assert "no spare waiting: falling back to exclude-next-restart" in action.detail
    assert slow.poll(lambda: {}, False) is None  # nobody leaves now
    assert leader.planned_leave(0) is None
    assert not store.check(["trainguard/run/straggler-leave/0"])


def test_spares_are_counted_from_both_torch_lists_and_unknown_state_counts_none() -> None:
    assert StoreHandover(lambda: None, "r", _Handler(redundant=2, waiting=1), SIGNER).spares_waiting() == 3
    assert StoreHandover(lambda: None, "r", object(), SIGNER).spares_waiting() == 0  # the static backend
    broken = _Handler(1)
    broken.sync = lambda: (_ for _ in ()).throw(RuntimeError("store gone"))  # type: ignore[method-assign]
    assert StoreHandover(lambda: None, "r", broken, SIGNER).spares_waiting() == 0
    assert StoreHandover(lambda: None, "r", broken, SIGNER).announced(0) is None


def test_report_and_exclude_policies_record_their_decision_too(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    layout.events_dir.mkdir(parents=True)
    emitted: list[Event] = []
    w = AgentWatch(layout, "h0", emitted.append, WatchSettings("report", 1.0, 0.0), sources=[])
    w.on_attempt(0)
    records, _, _ = synth(ranks=4, hosts=2, slow={3: 1.3}, onset=5)
    _write_steps(tmp_path, records)
    w._read_steps()
    w.check()
    assert [type(e) for e in emitted] == [StragglerDetected, StragglerAction]
    decision = emitted[1]
    assert isinstance(decision, StragglerAction) and (decision.action, decision.spares_waiting) == ("report", 0)


def test_flags_win_over_the_environment_and_bad_flags_are_usage_errors() -> None:
    env = {"TRAINGUARD_STRAGGLER_POLICY": "exclude-next-restart", "TRAINGUARD_STRAGGLER_PROBE_SECONDS": "3",
           "TRAINGUARD_TELEMETRY_SECONDS": "7"}
    assert WatchSettings.resolve(env=env) == WatchSettings("exclude-next-restart", 3.0, 7.0)
    assert WatchSettings.resolve("restart-now", 0.0, None, env) == WatchSettings("restart-now", 0.0, 7.0)
    assert check_options("restart-now", "2", "0") == ("restart-now", 2.0, 0.0)
    assert check_options(None, None, None) == (None, None, None)
    for bad in (("now", None, None), (None, "-1", None), (None, "0.1", None), (None, None, "inf"),
                (None, None, "nan"), (None, "x", None), (None, None, "86401")):
        with pytest.raises(UsageError):
            check_options(*bad)


def test_a_decision_nobody_could_be_told_of_falls_back(tmp_path: Path) -> None:
    leader, _, emitted = _watches(tmp_path, None, _Handler(redundant=1))  # no store yet: the announcement fails
    (named,) = leader.check()
    assert named.action == "exclude-next-restart"
    (action,) = [e for e in emitted if isinstance(e, StragglerAction)]
    assert (action.action, action.spares_waiting) == ("exclude-next-restart", 1)
    assert action.detail.startswith("could not tell node h1 to leave (no rendezvous store yet)")


def test_a_signed_announcement_is_ignored_under_another_policy(tmp_path: Path, store: Any) -> None:
    # The policy in force decides: a node running `report` never leaves, whatever the store says.
    layout = RunLayout(tmp_path)
    layout.events_dir.mkdir(parents=True, exist_ok=True)
    node = AgentWatch(layout, "h1", lambda e: None, WatchSettings("report", 1.0, 0.0), sources=[],
                      handover=StoreHandover(lambda: store, "run", _Handler(redundant=1), SIGNER))
    node.on_attempt(0)
    StoreHandover(lambda: store, "run", object(), SIGNER).announce(0, "h1", "rank 3 is 1.3x slower")
    assert node.poll(lambda: {}, False) is None
    assert node.exclusion_reasons(0) == []
