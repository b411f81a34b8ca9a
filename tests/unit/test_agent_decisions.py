"""The node agent as the adapter of `trainguard.launch.attempts`: torch's monitor round becomes an event and the
decision becomes processes replaced or stopped and records written.

Real agent, real worker processes (tiny Python children), a real in-process store; the seam that cannot run
here without torch's launcher is faked behind its own interface: `WorkerProcesses` (torch's process context)
and the monitor round of torch's base agent.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerSpec, WorkerState

from trainguard.core.eventlog import iter_events
from trainguard.core.events import AttemptEnded, AttemptStarted, FailureDetected, InProcessRecovery
from trainguard.launch.agent import GuardAgent
from trainguard.launch.config import SupervisorConfig
from trainguard.launch.failures import FailureRecorder
from trainguard.launch.watchdog import Verdict
from trainguard.sdc import verdict as sdc

pytestmark = pytest.mark.timeout(120)

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]
FAIL = [sys.executable, "-c", "import sys; sys.exit(3)"]


class FakeWorkers:
    """torch's process context as `trainguard.torch_api.elastic.WorkerProcesses` shows it."""

    def __init__(self, procs: dict[int, subprocess.Popen[bytes]]) -> None:
        self._procs = procs
        self.replaced: list[tuple[int, dict[str, str]]] = []

    def procs(self) -> dict[int, subprocess.Popen[bytes]]:
        return dict(self._procs)

    def env(self, local_rank: int) -> dict[str, str]:
        return {}

    def log_files(self, local_rank: int) -> tuple[str | None, str | None]:
        return None, None

    def replace(self, local_rank: int, env: dict[str, str], proc: subprocess.Popen[bytes] | None = None) -> int:
        assert self._procs[local_rank].poll() is not None, "replacing a process that still runs"
        self.replaced.append((local_rank, env))
        self._procs[local_rank] = subprocess.Popen(SLEEP)
        return self._procs[local_rank].pid


class Agent(GuardAgent):
    """`GuardAgent` over fake process context and a scripted base monitor round."""

    workers: FakeWorkers | None = None
    base_rounds: list[RunResult]

    def worker_processes(self) -> Any:
        return self.workers

    def torch_monitor(self, worker_group: WorkerGroup) -> RunResult:
        return self.base_rounds.pop(0) if self.base_rounds else RunResult(state=WorkerState.HEALTHY)

    def torch_restart_workers(self, worker_group: WorkerGroup) -> None:
        self.torch_restarts = getattr(self, "torch_restarts", 0) + 1


class NoRendezvous:
    """The rendezvous handler slot of the worker spec: nothing here rendezvouses."""

    def get_backend(self) -> str:
        return "static"

    def get_run_id(self) -> str:
        return "r"

    def shutdown(self) -> bool:
        return True


@pytest.fixture
def make_agent(tmp_path: Path) -> Iterator[Any]:
    made: list[tuple[Agent, FakeWorkers]] = []

    def make(*commands: list[str], **cfg_kw: Any) -> tuple[Agent, WorkerGroup, FakeWorkers]:
        cfg = SupervisorConfig(command=("train.py",), run_dir=tmp_path / "run", run_id="r", node_id="n",
                               rdzv_endpoint="127.0.0.1:1", nproc_per_node=len(commands), health_checks=False,
                               gpu_checks=False, stop_grace_seconds=1.0, **cfg_kw)
        cfg.layout.root.mkdir(parents=True, exist_ok=True)
        spec = WorkerSpec(role="trainer", local_world_size=len(commands), entrypoint=sys.executable,
                          args=("train.py",), rdzv_handler=NoRendezvous(), max_restarts=cfg.max_restarts)
        agent = Agent(spec, cfg)
        agent.base_rounds = []
        wg = WorkerGroup(spec)
        wg.group_rank, wg.group_world_size = 0, 1
        workers = FakeWorkers({i: subprocess.Popen(c) for i, c in enumerate(commands)})
        for w in wg.workers:
            w.global_rank, w.world_size, w.id = w.local_rank, len(commands), workers._procs[w.local_rank].pid
        agent.workers = workers
        agent.ledger.rendezvous()  # what `on_rendezvous` does before torch's rendezvous
        agent.open_attempt(wg, recovery="")
        made.append((agent, workers))
        return agent, wg, workers

    yield make
    for agent, workers in made:
        for p in workers._procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        agent.beat.stop("failed")
        if agent.spares is not None:
            agent.spares.close()
        agent.events.close()


def _events(agent: Agent) -> list[Any]:
    return [e for _, e in iter_events(agent.layout.agent_events("n"))]


def _wait_exited(workers: FakeWorkers, local_rank: int) -> None:
    workers._procs[local_rank].wait(timeout=30)


def test_a_crash_under_in_process_replaces_only_the_failed_rank_as_the_next_attempt(make_agent: Any) -> None:
    agent, wg, workers = make_agent(SLEEP, FAIL, in_process=True, max_restarts=3)
    survivor = workers._procs[0]
    _wait_exited(workers, 1)
    assert agent.on_monitor(wg).state == WorkerState.HEALTHY
    assert [lr for lr, _ in workers.replaced] == [1] and survivor.poll() is None  # the survivor kept running
    assert workers.replaced[0][1]["TRAINGUARD_ATTEMPT"] == "1"
    assert agent.attempt == 1 and agent.restarts_left() == 2
    assert agent.inprocess is not None
    store, keys = agent.inprocess.store, agent.inprocess.keys
    assert keys.open(0, "next", store.get(keys.key(0, "next"))) == "1"  # the survivors are told to go on
    events = _events(agent)
    failure = next(e for e in events if isinstance(e, FailureDetected))
    assert failure.attempt == 0 and failure.ranks == (1,)
    assert any(isinstance(e, AttemptEnded) and e.attempt == 0 and e.reason == "failure" for e in events)
    assert any(isinstance(e, AttemptStarted) and e.attempt == 1 and e.recovery == "in-process" for e in events)

    # Every rank joined the new group: recorded, and the restart stays charged.
    store.add(keys.key(1, "joined"), 2)
    assert agent.on_monitor(wg).state == WorkerState.HEALTHY
    recovered = [e for e in _events(agent) if isinstance(e, InProcessRecovery)]
    assert [(r.status, r.ranks, r.failure_kind) for r in recovered] == [("recovered", (1,), "exit")]
    assert agent.restarts_left() == 2 and agent.ledger.pending is None


def test_an_in_process_try_that_times_out_stops_every_worker_and_gives_its_restart_back(make_agent: Any) -> None:
    agent, wg, workers = make_agent(SLEEP, FAIL, in_process=True, max_restarts=3)
    _wait_exited(workers, 1)
    agent.on_monitor(wg)
    assert agent.restarts_left() == 2
    inprocess = agent.inprocess
    assert inprocess is not None and inprocess.pending is not None
    inprocess.pending = dataclasses.replace(inprocess.pending, deadline_mono=0.0)  # its timeout passed
    assert agent.on_monitor(wg).state == WorkerState.FAILED
    assert all(p.poll() is not None for p in workers._procs.values())
    assert agent.restarts_left() == 3 and inprocess.pending is None  # torch charges the whole-process restart
    fallback = [e for e in _events(agent) if isinstance(e, InProcessRecovery)]
    assert [e.status for e in fallback] == ["fallback"] and "formed the process group" in (fallback[0].detail or "")


def test_a_crash_with_no_restart_left_stops_the_survivors_and_says_why(make_agent: Any) -> None:
    agent, wg, workers = make_agent(SLEEP, FAIL, in_process=True, max_restarts=0)
    _wait_exited(workers, 1)
    assert agent.on_monitor(wg).state == WorkerState.FAILED
    assert workers.replaced == [] and all(p.poll() is not None for p in workers._procs.values())
    assert agent.restarts_left() == 0 and agent.stop_reason == "restart budget spent (0 restarts)"
    assert agent.attempt == 0


def test_a_crash_without_in_process_is_left_to_torchs_restart(make_agent: Any) -> None:
    agent, wg, workers = make_agent(SLEEP, FAIL, max_restarts=2)
    _wait_exited(workers, 1)
    agent.base_rounds.append(RunResult(state=WorkerState.FAILED))  # torch's own poll sees the failure too
    assert agent.on_monitor(wg).state == WorkerState.FAILED
    assert workers.replaced == [] and workers._procs[0].poll() is not None  # survivors stopped our way
    assert agent.restarts_left() == 2 and agent.attempt == 0  # torch's loop charges it (`on_restart_workers`)
    assert [e.ranks for e in _events(agent) if isinstance(e, FailureDetected)] == [(1,)]


def test_corruption_found_during_an_in_process_try_abandons_it(make_agent: Any) -> None:
    # Before, only a crash or a hang gave a pending in-process try up: after corruption's whole-process restart
    # the try stayed pending, and its timeout later stopped the healthy attempt that followed.
    agent, wg, workers = make_agent(SLEEP, FAIL, in_process=True, max_restarts=3)
    _wait_exited(workers, 1)
    agent.on_monitor(wg)
    assert agent.attempt == 1 and agent.inprocess is not None and agent.inprocess.pending is not None
    marker = sdc.SdcMarker(attempt=1, step=12, last_clean_step=10, last_clean_time=time.time() - 1,
                           time=time.time(), ranks=(0, 1), fingerprints=("0" * 16, "f" * 16), culprit_ranks=(1,),
                           majority=False, explanation="rank 1 differs")
    sdc.marker_path(agent.cfg.run_dir, 1).parent.mkdir(parents=True, exist_ok=True)
    sdc.marker_path(agent.cfg.run_dir, 1).write_bytes(marker.encode())
    assert agent.on_monitor(wg).state == WorkerState.FAILED
    assert agent.inprocess.pending is None and agent.ledger.pending is None
    assert agent.restarts_left() == 3  # the try is given back: torch charges the whole-process restart
    events = _events(agent)
    assert [e.kind for e in events if isinstance(e, FailureDetected)] == ["exit", "sdc"]
    assert [e.status for e in events if isinstance(e, InProcessRecovery)] == ["fallback"]


def test_a_hang_under_in_process_kills_and_replaces_the_blamed_rank(make_agent: Any) -> None:
    agent, wg, workers = make_agent(SLEEP, SLEEP, in_process=True, max_restarts=3)
    stuck, survivor = workers._procs[1], workers._procs[0]
    os.kill(stuck.pid, signal.SIGSTOP)  # a stopped rank: the blame rule names it from its process state
    deadline = time.monotonic() + 10
    while Path(f"/proc/{stuck.pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
        assert time.monotonic() < deadline, "the rank did not stop"
        time.sleep(0.01)
    now = time.monotonic()
    verdict = Verdict(ranks=(0, 1), onset_mono=now - 10, timeout_seconds=4.0, last_steps={0: 5, 1: 5},
                      reason="no step for 10s", stale_ranks=(1,))
    assert agent._on_hang(wg, verdict, time.time(), now).state == WorkerState.HEALTHY
    assert stuck.poll() is not None and survivor.poll() is None  # killed (it was still alive), the other kept
    assert [lr for lr, _ in workers.replaced] == [1]
    assert agent.attempt == 1 and agent.restarts_left() == 2
    assert agent.inprocess is not None and agent.inprocess.pending is not None
    assert agent.inprocess.pending.kind == "hang" and agent.inprocess.pending.ranks == (1,)
    assert [(e.kind, e.ranks) for e in _events(agent) if isinstance(e, FailureDetected)] == [("hang", (1,))]


@pytest.fixture
def store() -> Any:
    import datetime

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))


def _peer(agent: Agent, store: Any) -> FailureRecorder:
    """Another node's recorder over the same store (the job's secret: the same signer)."""
    return FailureRecorder(agent.cfg, lambda e: None, lambda: store, agent.signer)


def test_a_restart_for_a_node_waiting_to_join_is_planned_and_told_to_the_peers(make_agent: Any, store: Any) -> None:
    # Before, torch's membership change (a node waits to join: no worker failed) closed the attempt as a failure
    # and the peers were told nothing.
    agent, wg, _ = make_agent(SLEEP, max_restarts=2)
    agent.recorder.store = lambda: store
    agent.on_restart_workers(wg, counted=False)
    assert agent.torch_restarts == 1
    assert [e.reason for e in _events(agent) if isinstance(e, AttemptEnded)] == ["planned"]
    assert _peer(agent, store).rejoin_announced(0) == "a node waits to join the job"
    assert _peer(agent, store).rejoin_announced(1) is None
    assert agent.restarts_left() == 2


def test_a_peer_whose_own_failure_is_claimed_makes_the_restart_a_failure(make_agent: Any, store: Any) -> None:
    # The node waiting to join is the peer back after its failure: that failure's restart, nothing planned.
    agent, wg, _ = make_agent(SLEEP, max_restarts=2)
    agent.recorder.store = lambda: store
    assert _peer(agent, store).claim(0)
    agent.on_restart_workers(wg, counted=False)
    assert [e.reason for e in _events(agent) if isinstance(e, AttemptEnded)] == ["failure"]
    assert _peer(agent, store).rejoin_announced(0) is None


def test_an_error_exit_after_a_peer_restarted_for_a_joining_node_is_no_failure(make_agent: Any, store: Any) -> None:
    # Found in CI: a node joined, one agent restarted its round at once, and the other's worker failed on the
    # closed connection before that agent's next read of the rendezvous state (up to a second later): it was
    # recorded as a failure (kind "exit") and charged a restart.
    agent, wg, workers = make_agent(SLEEP, FAIL, max_restarts=2)
    wg.group_world_size = 2
    agent.recorder.store = lambda: store
    assert _peer(agent, store).announce_rejoin(0, "a node waits to join the job")
    _wait_exited(workers, 1)
    agent.base_rounds.append(RunResult(state=WorkerState.FAILED))
    assert agent.on_monitor(wg).state == WorkerState.FAILED
    assert workers._procs[0].poll() is not None  # the other worker stopped for the restart
    events = _events(agent)
    assert not [e for e in events if isinstance(e, FailureDetected)]
    assert [e.reason for e in events if isinstance(e, AttemptEnded)] == ["planned"]
    assert agent.restarts_left() == 3  # given back here; torch's loop charges the restart it makes next
