"""Helpers for tests that run several node agents on this machine (loopback rendezvous, one shared run dir)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from tests.e2e._run_helpers import STUCK_SECONDS, TINY, TRAIN_GPT, events, start_trainguard

HOLD = Path(__file__).resolve().parent / "userscripts" / "hold_attempt.py"

FAST_RDZV = ["--rdzv-conf", "keep_alive_interval=1", "--node-lost-timeout", "4", "--rdzv-last-call", "3"]
"""Short keep-alive (3 x 1 s) and node-lost timeout: a lost node is let go of in seconds, not 15 s."""


class Agents:
    """Agents of one job started one by one; `stop_all` kills what is left, orphaned workers included."""

    def __init__(self, tmp_path: Path, *, nnodes: str, nproc: int, endpoint: str, steps: int, inject: str,
                 extra: tuple[str, ...] = (), hold_attempt: int | None = None) -> None:
        self.tmp = tmp_path
        self.run_dir = tmp_path / "run"
        self.endpoint = endpoint
        # with hold_attempt, the script waits before its first step in that attempt (userscripts/hold_attempt.py)
        script = [str(HOLD), str(TRAIN_GPT)] if hold_attempt is not None else [str(TRAIN_GPT)]
        self.env = {"TG_TEST_HOLD_ATTEMPT": str(hold_attempt)} if hold_attempt is not None else {}
        self.args = ["run", "--nnodes", nnodes, "--nproc-per-node", str(nproc), "--rdzv-endpoint", endpoint,
                     "--rdzv-id", "nodes", "--run-dir", str(self.run_dir), "--json", "--inject", inject,
                     *extra, "--", *script, "--steps", str(steps), "--ckpt-every", "2", *TINY]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, node: str) -> None:
        self.procs[node] = start_trainguard(*self.args[:1], "--node-id", node, *self.args[1:],
                                            log=self.tmp / f"{node}.log", env=self.env)

    def wait(self, what: str, cond: Callable[[], bool], timeout: float = STUCK_SECONDS) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if cond():
                return
            dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
            assert not dead, f"agents exited while waiting for {what}: {dead}: {self.tails()}"
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}: {self.tails()}")

    def finish(self, timeout: float = STUCK_SECONDS) -> dict[str, int]:
        return {node: p.wait(timeout=timeout) for node, p in self.procs.items()}

    def tails(self) -> dict[str, str]:
        return {n: (self.tmp / f"{n}.log").read_text(errors="replace")[-2500:] for n in self.procs}

    def result(self, node: str) -> dict[str, Any]:
        text = (self.tmp / f"{node}.log").read_text(errors="replace")
        return dict(json.loads(text[text.rindex("\n{\n") + 1:]))

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        kill_workers_of(self.run_dir)


def kill_workers_of(run_dir: Path) -> None:
    """SIGKILL every process whose environment names this run directory (workers an agent left behind)."""
    wanted = str(run_dir.resolve())
    for proc in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and proc.environ().get("TRAINGUARD_RUN_DIR") == wanted:
                os.kill(proc.pid, signal.SIGKILL)


def started(run_dir: Path, node: str) -> bool:
    """The node's agent started workers (an ``attempt_started`` record)."""
    with contextlib.suppress(ValueError, OSError):
        return any(r["type"] == "attempt_started" for r in events(run_dir, f"agent-{node}"))
    return False


@contextlib.contextmanager
def agents(*args: Any, **kwargs: Any) -> Iterator[Agents]:
    job = Agents(*args, **kwargs)
    try:
        yield job
    finally:
        job.stop_all()


def assert_every_node_counted_once(run_dir: Path, db_path: Path, nodes: set[str]) -> None:
    """Events of every node land once in the fleet database (indexing twice adds nothing), and a clock offset is
    estimated for each node against the reference host (all on this machine's one clock: close to 0)."""
    from trainguard.accounting.goodput import compute_goodput
    from trainguard.core.clocks import estimate_offsets, reference_host
    from trainguard.core.eventlog import read_run
    from trainguard.health.fleetdb import FleetDB

    records = read_run(run_dir)
    assert {r.host for _, _, r in records} >= nodes
    with FleetDB(db_path) as db:
        first = db.index(run_dir)
        again = db.index(run_dir)
        assert (first.events, first.new_events, again.new_events) == (len(records), len(records), 0)
        assert db.event_count() == len(records)
        assert set(db.hosts()) >= nodes
    events = [r for _, _, r in records]
    reference = reference_host(events)
    offsets = estimate_offsets(events, reference)
    assert reference in nodes and set(offsets) >= nodes and all(abs(offsets[n]) < 0.5 for n in nodes), offsets
    # The report applies them: only the reference host has no offset of its own.
    assert set(compute_goodput(run_dir).clock_offsets_seconds) <= nodes - {reference}
