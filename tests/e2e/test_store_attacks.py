"""Another local user (uid 65534, a real second uid via setpriv) writes into a running job's rendezvous store.

torch's TCPStore has no authentication. Before the store keys were signed, a forged straggler-leave
announcement made a healthy job under the default ``report`` policy leave "for a waiting spare" (exit 5),
and a failure claimed in advance made a real crash restart with no ``failure_detected`` or diagnosis. Under
``--standalone`` the store also listened on every interface. And torch's rendezvous state (a pickle, under
``torch.rendezvous.<run id>`` in the c10d store, ``/torch/elastic/rendezvous/<run id>`` in etcd) was unpickled
by the agent at every keep-alive: a forged one ran the attacker's code as the job's user within seconds.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.e2e._etcd import etcd_server  # noqa: F401 (a fixture)
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


# The forged state: a pickle whose loading runs a command (as the job's user, if the agent ever loads it).
# Written again and again for a few seconds, so that keep-alives and state reads of the agent meet it.
FORGE_STATE = r"""
import base64, os, pickle, sys, time
class Payload:
    def __reduce__(self):
        return (os.system, ("touch " + sys.argv[1],))
forged = base64.b64encode(pickle.dumps(Payload())).decode()
writes, until = 0, time.monotonic() + float(sys.argv[2])
if sys.argv[3] == "c10d":
    sys.path.insert(0, sys.argv[4])
    import datetime
    import torch.distributed as dist
    host, port, run = sys.argv[5], int(sys.argv[6]), sys.argv[7]
    store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=10))
    while time.monotonic() < until:
        store.set("torch.rendezvous." + run, forged)
        writes += 1
        time.sleep(0.1)
else:
    import urllib.parse, urllib.request
    url, body = sys.argv[4], urllib.parse.urlencode({"value": forged}).encode()
    while time.monotonic() < until:
        urllib.request.urlopen(urllib.request.Request(url, data=body, method="PUT"), timeout=5).close()
        writes += 1
        time.sleep(0.1)
print("forged", writes)
"""
FORGE_SECONDS = 8  # more than torch's keep-alive interval (5 s): every kind of read meets a forgery
REFUSED = "rendezvous state in the store was not signed by this job: ignored"
PLAIN_DDP = ROOT / "tests" / "e2e" / "unmodified" / "plain_ddp.py"


def _as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    python = _attacker_python()
    if shutil.which("setpriv") is None or python is None or psutil.Process().uids().real != 0:
        pytest.fail("this test needs root, setpriv and a system Python matching the project's")
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python,
                           "-c", FORGE_STATE, *argv], capture_output=True, text=True, timeout=60, cwd="/")


def _wait(what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the job ended while waiting for {what}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


def _steps(step_log: Path) -> dict[int, list[tuple[int, int]]]:
    """rank -> [(restart, step)] from plain_ddp's step log."""
    out: dict[int, list[tuple[int, int]]] = {}
    for path in step_log.parent.glob(step_log.name + ".*"):
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                out.setdefault(int(r["rank"]), []).append((int(r["restart"]), int(r["step"])))
    return out


def _forged_state_attack(tmp_path: Path, rdzv: tuple[str, ...], attack: Callable[[str, str], tuple[str, ...]],
                         signed_now: Callable[[], bool] | None = None) -> None:
    """Runs an unmodified 2-rank DDP job with ``rdzv``; once it trains, uid 65534 keeps writing a pickle that
    runs ``touch <marker>`` into the rendezvous state (``attack(marker, rendezvous line)`` gives the forger's
    arguments). The job must never run it, must say so on the console, and must train on to its stop."""
    run_dir, log, marker = tmp_path / "run", tmp_path / "agent.log", tmp_path / "pwned"
    step_log, stop = tmp_path / "steps" / "log", tmp_path / "stop"
    step_log.parent.mkdir()
    proc = start_trainguard(
        "run", *rdzv, "--nproc-per-node", "2", "--run-dir", str(run_dir), "--json", "--node-id", "vm-a",
        "--", str(PLAIN_DDP), "--steps", "100000", "--step-seconds", "0.02", "--ckpt-dir", str(tmp_path / "ckpt"),
        "--stop-file", str(stop), "--step-log", str(step_log), log=log)
    try:
        found: list[str] = []

        def rendezvous_line() -> bool:
            found[:] = re.findall(r"rendezvous \S+ \S+ id \S+", log.read_text())
            return bool(found)

        _wait("rendezvous line", rendezvous_line, proc, log, 60)
        _wait("training steps", lambda: len(_steps(step_log)) == 2, proc, log, 120)
        forger = _as_nobody(str(marker), str(FORGE_SECONDS), *attack(str(marker), found[0]))
        assert not marker.exists(), "the forged rendezvous state ran the attacker's command"
        assert forger.returncode == 0 and "forged" in forger.stdout, forger.stderr[-2000:]

        def refused() -> bool:
            assert not marker.exists(), "the forged rendezvous state ran the attacker's command"
            return REFUSED in log.read_text()

        _wait("refusal on the console", refused, proc, log, 30)
        if signed_now is not None:  # the agent's next compare-and-set replaced the forgery with a signed state
            _wait("signed state back in the store", signed_now, proc, log, 30)
        steps_after_attack = max(s for _, s in _steps(step_log)[0])
        _wait("more training steps", lambda: max(s for _, s in _steps(step_log)[0]) > steps_after_attack + 5,
              proc, log, 60)
        stop.touch()
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert not marker.exists(), "the forged rendezvous state ran the attacker's command"
    assert code == 0, text[-3000:]
    result = json_result(log)
    assert result["status"] == "completed", result
    assert text.count(REFUSED) == 1, text[-3000:]  # once per kind of refusal, not once per forged write
    records = events(run_dir)
    assert not of_type(records, "failure_detected"), of_type(records, "failure_detected")
    assert len(of_type(records, "attempt_started")) == 1  # never restarted: training went on through the attack
    steps = _steps(step_log)
    last = max(s for _, s in steps[0])
    for rank in (0, 1):  # every step of the one launch, on both ranks, up to the agreed stop
        assert steps[rank] == [(0, n) for n in range(1, last + 1)], rank


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_a_second_uid_cannot_run_code_through_the_c10d_rendezvous_state(tmp_path: Path) -> None:
    endpoint: list[str] = []

    def attack(marker: str, line: str) -> tuple[str, ...]:
        match = re.fullmatch(r"rendezvous c10d (127\.0\.0\.1):(\d+) id (\S+)", line)
        assert match, line
        endpoint[:] = [match.group(1), match.group(2), match.group(3)]
        return ("c10d", _site_packages(), *endpoint)

    def signed_now() -> bool:
        import datetime

        import torch.distributed as dist

        host, port, run_id = endpoint
        store = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=10))
        return bool(store.get(f"torch.rendezvous.{run_id}").startswith(base64.b64encode(b"trainguard-rdzv-1:")))

    _forged_state_attack(tmp_path, ("--standalone",), attack, signed_now)


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_a_second_uid_cannot_run_code_through_the_etcd_rendezvous_state(tmp_path: Path,
                                                                        request: pytest.FixtureRequest) -> None:
    if shutil.which("etcd") is None:
        pytest.skip("no etcd binary on PATH (scripts/setup installs Debian's etcd-server)")
    endpoint = str(request.getfixturevalue("etcd_server"))
    key = f"http://{endpoint}/v2/keys/torch/elastic/rendezvous/attacked"

    def signed_now() -> bool:
        with urllib.request.urlopen(key, timeout=5) as reply:
            value = json.loads(reply.read())["node"]["value"]
        return bool(value.encode().startswith(base64.b64encode(b"trainguard-rdzv-1:")))

    _forged_state_attack(tmp_path, ("--rdzv-backend", "etcd-v2", "--rdzv-endpoint", endpoint,
                                    "--rdzv-id", "attacked", "--nnodes", "1"),
                         lambda marker, line: ("etcd", key), signed_now)
