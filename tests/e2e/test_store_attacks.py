"""Another local user (uid 65534, a real second uid via setpriv) writes into a running job's rendezvous store.

torch's TCPStore has no authentication. Before the store keys were signed, a forged straggler-leave
announcement made a healthy job under the default ``report`` policy leave "for a waiting spare" (exit 5),
and a failure claimed in advance made a real crash restart with no ``failure_detected`` or diagnosis. Under
``--standalone`` the store also listened on every interface.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e._run_helpers import TINY, TRAIN_GPT, events, json_result, of_type, start_trainguard, store_up

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534

ATTACK = r"""
import json, sys, datetime
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
host, port, run, node = sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=10))
for rnd in range(4):
    prefix = f"torch.rendezvous.{run}.{rnd}/"
    for attempt in range(4):
        forged = {"node": node, "reason": "\x1b]8;;http://evil/\x1b\\click\x1b]8;;\x1b\\", "mac": "0" * 64}
        store.set(prefix + f"trainguard/{run}/straggler-leave/{attempt}", json.dumps(forged))
        store.add(prefix + f"trainguard/{run}/failure/{attempt}", 1)
print("attacked")
"""


def _site_packages() -> str:
    import torch

    return str(Path(torch.__file__).resolve().parents[1])


def _attacker_python() -> str | None:
    """A Python the second uid can execute that matches this one (the project's may live under /root)."""
    import sys

    for candidate in (f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}",):
        if Path(candidate).exists():
            return candidate
    return None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_second_uid_cannot_stop_or_blind_a_job_through_the_store(tmp_path: Path) -> None:
    python = _attacker_python()
    if shutil.which("setpriv") is None or python is None or psutil.Process().uids().real != 0:
        pytest.fail("this test needs root, setpriv and a system Python matching the project's")
    run_dir = tmp_path / "run"
    log = tmp_path / "agent.log"
    proc = start_trainguard(
        "run", "--standalone", "--nproc-per-node", "2", "--run-dir", str(run_dir), "--json",
        "--node-id", "vm-a", "--max-restarts", "2", "--inject", "crash@step=150,rank=1,attempt=0",
        "--", str(TRAIN_GPT), "--steps", "200", "--ckpt-every", "50", *TINY, log=log)
    try:
        deadline = time.time() + 60
        match = None
        while match is None and time.time() < deadline:
            match = re.search(r"rendezvous c10d (127\.0\.0\.1):(\d+) id (\S+)", log.read_text())
            time.sleep(0.1)
        assert match, log.read_text()[-2000:]
        host, port, run_id = match.group(1), int(match.group(2)), match.group(3)
        while not store_up(f"{host}:{port}"):
            assert time.time() < deadline and proc.poll() is None, log.read_text()[-2000:]
            time.sleep(0.1)
        # The store listens on loopback only, as the console says.
        listening = {c.laddr.ip for c in psutil.net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        assert listening == {"127.0.0.1"}, listening
        attack = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python,
                                 "-c", ATTACK, _site_packages(), host, str(port), run_id, "vm-a"],
                                capture_output=True, text=True, timeout=60, cwd="/")
        assert attack.returncode == 0 and "attacked" in attack.stdout, attack.stderr[-2000:]
        attacked_at = time.time()
        code = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert json_result(log)["status"] == "completed"
    records = events(run_dir)
    assert not of_type(records, "planned_interruption")
    assert not of_type(records, "node_excluded")
    # The real crash is recorded and diagnosed although the attacker "claimed" every attempt's failure first.
    failures = of_type(records, "failure_detected")
    assert [(f["attempt"], f["kind"]) for f in failures] == [(0, "crash")], failures
    assert failures[0]["time"] > attacked_at
    assert [d["attempt"] for d in of_type(records, "diagnosis")] == [0]
    assert "forged value under trainguard/" in text
    assert "\x1b]8;" not in text  # the attacker's text never reached the console
