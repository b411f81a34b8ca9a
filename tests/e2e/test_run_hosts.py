"""A job over real links: three hosts made as network namespaces on a bridge (tests/e2e/_netns.py), the rendezvous
endpoint given as the first host's address (an interface other than the one its host name resolves to), and one
host cut off mid-run. The two others re-form and finish; the cut-off agent knows it, stops its workers and ends."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e._netns import HostNet
from tests.e2e._nodes import FAST_RDZV
from tests.e2e._run_helpers import STUCK_SECONDS, TINY, TRAIN_GPT, events, wait_until

STEPS = 40

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")]


def _agent(net: HostNet, name: str, run_dir: Path, log: Path, *options: str) -> subprocess.Popen[bytes]:
    host, first = net[name], net.hosts[0]
    cmd = [sys.executable, "-m", "trainguard", "run", "--nnodes", "2:3", "--nproc-per-node", "1",
           "--rdzv-endpoint", f"{first.address}:29400", "--rdzv-id", "hosts", "--node-id", name,
           "--local-addr", host.address, *FAST_RDZV, "--run-dir", str(run_dir), "--warm-spares", "0", *options,
           "--", str(TRAIN_GPT), "--steps", str(STEPS), "--ckpt-every", "4", *TINY]
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0"}
    return subprocess.Popen(net.command(host, cmd), stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


def test_a_host_cut_off_mid_run_ends_on_its_own_and_the_others_finish(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with HostNet(3) as net:
        logs = {h.name: tmp_path / f"{h.name}.log" for h in net.hosts}
        agents = {name: _agent(net, name, run_dir, log) for name, log in logs.items()}
        try:
            wait_until("step 8 on every host", lambda: {r["host"] for r in events(run_dir, "rank-")
                                                         if r["type"] == "step_completed" and r["step"] >= 8}
                       >= set(agents), agents["host0"], logs["host0"], STUCK_SECONDS)
            net.set_link(net["host2"], up=False)
            codes = {name: p.wait(timeout=STUCK_SECONDS) for name, p in agents.items()}
            texts = {name: log.read_text(errors="replace") for name, log in logs.items()}
            # The store was hosted by host0's agent although its host name resolves elsewhere.
            assert codes == {"host0": 0, "host1": 0, "host2": 1}, (codes, {n: t[-2000:] for n, t in texts.items()})
            assert re.search(r"summary: failed \(rendezvous lost: no answer from the rendezvous store at "
                             r"10\.201\.0\.10:29400 for \d+ s", texts["host2"]), texts["host2"][-2000:]
            assert net.pids(net["host2"]) == []  # its workers ended with it
            done = [r for r in events(run_dir, "rank-") if r["type"] == "step_completed" and r["step"] == STEPS]
            assert {r["host"] for r in done} == {"host0", "host1"}
            lost = [r for r in events(run_dir, "agent-") if r["type"] == "node_excluded"
                    or (r["type"] == "failure_detected" and "host2" in str(r))]
            assert lost, "the survivors recorded nothing about host2"
        finally:
            for p in agents.values():
                if p.poll() is None:
                    p.kill()


def test_a_slow_host_gets_the_job_s_attempt_numbers_and_the_job_one_interruption_per_fault(tmp_path: Path) -> None:
    """Once the three hosts train, host2 is left a fifth of a core behind a narrow link, and host0's rank crashes:
    host2 is late to the restart's rendezvous (a round may form without it, and another when it joins). Every
    agent must give a round the same number and the job must count one interruption (the joins are planned
    restarts, and a peer's worker failing on the connection a join closed is one of them)."""
    run_dir = tmp_path / "run"
    with HostNet(3) as net:
        logs = {h.name: tmp_path / f"{h.name}.log" for h in net.hosts}
        agents = {name: _agent(net, name, run_dir, log, "--inject", "crash@step=12,rank=0",
                               "--max-restarts", "4") for name, log in logs.items()}
        try:
            wait_until("step 2 on every host", lambda: {r["host"] for r in events(run_dir, "rank-")
                                                         if r["type"] == "step_completed" and r["step"] >= 2}
                       >= set(agents), agents["host0"], logs["host0"], STUCK_SECONDS)
            net.throttle_link(net["host2"], rate_kbit=2000)
            net.starve_cpu(net["host2"], percent=20)
            codes = {name: p.wait(timeout=STUCK_SECONDS * 4) for name, p in agents.items()}
            texts = {name: log.read_text(errors="replace")[-2000:] for name, log in logs.items()}
            assert codes == {"host0": 0, "host1": 0, "host2": 0}, (codes, texts)
        finally:
            for p in agents.values():
                if p.poll() is None:
                    p.kill()
    records = events(run_dir, "agent-")
    rounds: dict[int, set[tuple[str, int]]] = {}
    for r in records:
        if r["type"] == "attempt_started":
            rounds.setdefault(r["attempt"], set()).add((r["host"], r["world_size"]))
    # One number per round: the hosts that started an attempt all say the same world size, and it is how many
    # started it.
    for members in rounds.values():
        assert {w for _, w in members} == {len(members)}, rounds
    assert sorted(rounds) == list(range(len(rounds))), rounds
    assert rounds[0] == {("host0", 3), ("host1", 3), ("host2", 3)}, rounds
    assert rounds[max(rounds)] == {("host0", 3), ("host1", 3), ("host2", 3)}, rounds
    failures = [r for r in records if r["type"] == "failure_detected"]
    assert [(f["kind"], f["ranks"]) for f in failures] == [("crash", [0])], failures
    report = subprocess.run([sys.executable, "-m", "trainguard", "report", str(run_dir), "--json"],
                            capture_output=True, text=True, timeout=120, check=True)
    assert [i["kind"] for i in json.loads(report.stdout)["interruptions"]] == ["crash"], report.stdout[-3000:]
