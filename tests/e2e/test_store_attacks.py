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
import contextlib
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
from tests.e2e._run_helpers import TINY, TRAIN_GPT, events, json_result, of_type, start_trainguard, store_up, wait_until

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534

ATTACK = r"""
import json, sys, datetime
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
print("ready", flush=True)  # torch imported: the attack itself then takes milliseconds
host, port, run, node = sys.stdin.readline().split()
port = int(port)
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
    # The attacker imports torch before the job starts, and attacks the moment the store is up: long before the
    # crash at step 150 (started after the store was up, a CI run at load reached that step while the attacker was
    # still importing torch, and the claim came after the real failure instead of before it).
    attacker = subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python,
                                 "-c", ATTACK, _site_packages()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd="/")
    assert attacker.stdout is not None and attacker.stdin is not None
    assert attacker.stdout.readline().strip() == "ready", attacker.communicate(timeout=60)[1][-2000:]
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
        out, err = attacker.communicate(f"{host} {port} {run_id} vm-a\n", timeout=60)
        assert attacker.returncode == 0 and "attacked" in out, err[-2000:]
        attacked_at = time.time()
        code = proc.wait(timeout=240)
    finally:
        for p in (proc, attacker):
            if p.poll() is None:
                p.kill()
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

        wait_until("rendezvous line", rendezvous_line, proc, log, 60)
        wait_until("training steps", lambda: len(_steps(step_log)) == 2, proc, log, 120)
        forger = _as_nobody(str(marker), str(FORGE_SECONDS), *attack(str(marker), found[0]))
        assert not marker.exists(), "the forged rendezvous state ran the attacker's command"
        assert forger.returncode == 0 and "forged" in forger.stdout, forger.stderr[-2000:]

        def refused() -> bool:
            assert not marker.exists(), "the forged rendezvous state ran the attacker's command"
            return REFUSED in log.read_text()

        wait_until("refusal on the console", refused, proc, log, 30)
        if signed_now is not None:  # the agent's next compare-and-set replaced the forgery with a signed state
            wait_until("signed state back in the store", signed_now, proc, log, 30)
        steps_after_attack = max(s for _, s in _steps(step_log)[0])
        wait_until("more training steps", lambda: max(s for _, s in _steps(step_log)[0]) > steps_after_attack + 5,
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


# --- every channel of a single-node job: the in-process store, the control sockets, the workers' store -------

INPROCESS_SCRIPT = ROOT / "src" / "trainguard" / "examples" / "train_gpt_inprocess.py"

# Imports torch first (seconds), says "ready", then takes the in-process store's port from stdin and rewrites,
# in a loop, every attempt's ``next`` (go to attempt 5) and attempt 5's environment (the attacker's folders).
HIJACK = r"""
import json, sys, time, datetime
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
print("ready", flush=True)
port = int(sys.stdin.readline())
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
env = json.dumps({"TRAINGUARD_ATTEMPT": "5", "TRAINGUARD_HEARTBEAT_DIR": sys.argv[2],
                  "TRAINGUARD_EVIDENCE_DIR": sys.argv[3]})
first = True
while True:
    for attempt in range(5):
        store.set(f"trainguard/inprocess/attempt-{attempt}/next", "5")
    store.set("trainguard/inprocess/attempt-5/env", env)
    if first:
        print("writing", time.time(), flush=True)
        first = False
    time.sleep(0.01)
"""


def _as_nobody_popen(script: str, *argv: str) -> subprocess.Popen[str]:
    python = _attacker_python()
    if shutil.which("setpriv") is None or python is None or psutil.Process().uids().real != 0:
        pytest.fail("this test needs root, setpriv and a system Python matching the project's")
    return subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python,
                             "-c", script, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd="/")


def _line(attacker: subprocess.Popen[str], word: str) -> str:
    """The attacker's next stdout line, which must start with ``word`` (readline waits for the attacker)."""
    assert attacker.stdout is not None
    line = attacker.stdout.readline()
    if not line.startswith(word):
        attacker.kill()
        raise AssertionError(f"attacker said {line!r}: {attacker.communicate()[1][-2000:]}")
    return line


def _worker_env(proc: subprocess.Popen[bytes], name: str) -> str | None:
    """``name`` in the environment of one of the job's workers, once one runs."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                value = child.environ().get(name)
                if value:
                    return str(value)
    return None


def _listening(port: int) -> set[str]:
    return {c.laddr.ip for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_second_uid_cannot_steer_an_in_process_restart(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "agent.log"
    evil_hb, evil_ev = tmp_path / "evil-heartbeats", tmp_path / "evil-evidence"
    attacker = _as_nobody_popen(HIJACK, _site_packages(), str(evil_hb), str(evil_ev))
    proc = None
    try:
        _line(attacker, "ready")  # torch imported: it writes within milliseconds of learning the port
        proc = start_trainguard(
            "run", "--nproc-per-node", "2", "--run-dir", str(run_dir), "--json", "--no-health-checks",
            "--max-restarts", "2", "--hang-floor", "3", "--in-process", "--inject", "crash@step=10,rank=1",
            "--", str(INPROCESS_SCRIPT), "--steps", "16", "--ckpt-every", "4", "--seed", "3", *TINY, log=log)
        found: list[str] = []

        def store_known() -> bool:
            value = _worker_env(proc, "TRAINGUARD_INPROCESS_STORE")
            found[:] = [value] if value else []
            return bool(found)

        wait_until("the in-process store in a worker's environment", store_known, proc, log, 120)
        port = int(found[0].rpartition(":")[2])
        listening = _listening(port)
        assert attacker.stdin is not None
        attacker.stdin.write(f"{port}\n")
        attacker.stdin.flush()
        writing_since = float(_line(attacker, "writing").split()[1])
        code = proc.wait(timeout=300)
    finally:
        attacker.kill()
        attacker.wait()
        if proc is not None and proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert json_result(log)["status"] == "completed"
    records = events(run_dir)
    [failure] = of_type(records, "failure_detected")
    assert failure["kind"] == "crash" and failure["time"] > writing_since  # the forgeries were there first
    # Recovered in process into the agent's attempt 1: no fallback to a whole restart, no attempt 5.
    assert [(r["attempt"], r["status"]) for r in of_type(records, "inprocess_recovery")] == [(1, "recovered")]
    assert [a["recovery"] for a in of_type(records, "attempt_started")] == ["", "in-process"]
    assert {e["attempt"] for e in events(run_dir, "rank-") if "attempt" in e} == {0, 1}
    log0 = (run_dir / "logs" / "attempt-0" / "rank-0.log").read_text()
    assert "rank 0 re-enters in attempt 1" in log0 and "attempt 5" not in log0
    assert not evil_hb.exists() and not evil_ev.exists()  # the attacker's environment reached no rank
    assert listening == {"127.0.0.1"}, listening  # and only local users could try


# Binds the control-channel names of the next pids (``\0trainguard-<pid>``), says "squatting", and answers every
# connection with a reply of the wrong shape.
SQUAT = r"""
import resource, selectors, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
count = min(int(sys.argv[1]), hard - 64)
first = int(open("/proc/sys/kernel/ns_last_pid").read()) + 1
sel = selectors.DefaultSelector()
for pid in range(first, first + count):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind("\0trainguard-%d" % pid)
    except OSError:
        s.close()
        continue
    s.listen(64)
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
print("squatting", first, first + count, flush=True)
while True:
    for key, _ in sel.select():
        try:
            conn, _ = key.fileobj.accept()
        except OSError:
            continue
        with conn:
            conn.settimeout(1)
            try:
                conn.sendall(b'{"ok": true, "step": "x", "files": "nope"}\n')
            except OSError:
                pass
"""
SQUATTED_PIDS = 6000


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_second_uid_squatting_the_control_channel_names_is_never_heard(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "agent.log"
    squatter = _as_nobody_popen(SQUAT, str(SQUATTED_PIDS))
    try:
        first, last = (int(x) for x in _line(squatter, "squatting").split()[1:3])
        proc = start_trainguard(
            "run", "--nproc-per-node", "2", "--run-dir", str(run_dir), "--json", "--no-health-checks",
            "--max-restarts", "2", "--hang-floor", "3", "--inject", "hang@step=6,rank=0,attempt=0",
            "--", str(TRAIN_GPT), "--steps", "12", "--ckpt-every", "3", *TINY, log=log)
        try:
            code = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    finally:
        squatter.kill()
        squatter.wait()
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "agent error" not in text
    assert json_result(log)["status"] == "completed"
    records = events(run_dir)
    logs = [(run_dir / "logs" / "attempt-0" / f"rank-{r}.log").read_text() for r in (0, 1)]
    # The squat hit: the ranks' own names were taken, and they listened under others.
    assert all("channel name of pid" in t for t in logs), [t[-1500:] for t in logs]
    assert not any("no control channel" in t for t in logs)
    taken = [int(m) for t in logs for m in re.findall(r"channel name of pid (\d+) was taken", t)]
    assert len(taken) == 2 and all(first <= p < last for p in taken), (taken, first, last)
    [failure] = of_type(records, "failure_detected")
    assert failure["kind"] == "hang" and failure["ranks"] == [0]
    # The evidence is the real ranks': both answered, and each wrote its own stacks.
    diag = run_dir / "diagnostics" / "attempt-0"
    assert json.loads((diag / "process_state.json").read_text())["answered"] == [0, 1]
    for rank in (0, 1):
        assert (diag / f"stacks_rank_{rank}.txt").stat().st_size > 0
    assert [a["attempt"] for a in of_type(records, "attempt_started")] == [0, 1]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_single_node_jobs_stores_listen_on_loopback_only(tmp_path: Path) -> None:
    """The workers' process-group store and the in-process store of a one-node job: 127.0.0.1 only."""
    run_dir, log = tmp_path / "run", tmp_path / "agent.log"
    step_log, stop = tmp_path / "steps" / "log", tmp_path / "stop"
    step_log.parent.mkdir()
    proc = start_trainguard(
        "run", "--standalone", "--nproc-per-node", "2", "--run-dir", str(run_dir), "--json", "--node-id", "vm-a",
        "--no-health-checks", "--in-process",
        "--", str(PLAIN_DDP), "--steps", "100000", "--step-seconds", "0.02", "--ckpt-dir", str(tmp_path / "ckpt"),
        "--stop-file", str(stop), "--step-log", str(step_log), log=log)
    try:
        wait_until("training steps", lambda: len(_steps(step_log)) == 2, proc, log, 120)
        master = _worker_env(proc, "MASTER_PORT")
        inprocess = _worker_env(proc, "TRAINGUARD_INPROCESS_STORE")
        assert master and inprocess, (master, inprocess)
        for port in (int(master), int(inprocess.rpartition(":")[2])):
            assert _listening(port) == {"127.0.0.1"}, (port, _listening(port))
        assert _worker_env(proc, "MASTER_ADDR") == "127.0.0.1"
        stop.touch()
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, log.read_text()[-3000:]
