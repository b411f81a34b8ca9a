"""The fork server: one interpreter loads torch and the script's imports, then forks ranks on request; the agent
learns each rank's exit from the server's reports (the ranks are not its children). One real server per test
(it imports torch once, a few seconds) carries the assertions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from trainguard.launch.fork_server import ForkServer
from trainguard.launch.warm import WarmSpares

SCRIPT = '''
import gc, json, os, sys, time
import random
print(json.dumps({"rank": os.environ["RANK"], "argv": sys.argv[1:], "name": __name__, "pid": os.getpid(),
                  "sid": os.getsid(0), "torch_loaded_before": "torch" in sys.modules, "stdin": sys.stdin.read(),
                  "draw": random.random(), "frozen": gc.get_freeze_count()}), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if os.environ.get("SLEEP"):
    time.sleep(float(os.environ["SLEEP"]))
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
'''

READS_RANK = '''
import os
RANK = os.environ.get("RANK")
'''


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_ranks_forked_from_the_server_run_the_script_and_their_exits_reach_the_agent(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    server = ForkServer(("-u", str(script), "-u", "--lr", "3"), tmp_path / "spares")
    server.start()
    try:
        assert server.wait_ready(120), server.hello
        assert server.hello is not None and server.hello["unfit"] is None
        outs = [tmp_path / f"rank-{r}.stdout.log" for r in range(3)]
        errs = [tmp_path / f"rank-{r}.stderr.log" for r in range(3)]
        outs[0].write_text("earlier line\n")
        base = dict(os.environ)
        done = server.spawn({**base, "RANK": "0", "EXIT_CODE": "5"}, str(outs[0]), str(errs[0]))
        other = server.spawn({**base, "RANK": "1"}, str(outs[1]), str(errs[1]))
        slow = server.spawn({**base, "RANK": "2", "SLEEP": "600"}, str(outs[2]), str(errs[2]))
        assert done is not None and other is not None and slow is not None
        # Its exit's report wakes whoever waits for one (the agent's monitor round).
        assert server.wait_exit(120)
        # An exit code, as a cold rank's Popen would give it.
        assert done.wait(timeout=60) == 5
        assert other.wait(timeout=60) == 0
        lines = _lines(outs[0])
        assert lines[0] == "earlier line"  # appended, as the console tailer expects
        record = json.loads(lines[1])
        assert record["rank"] == "0" and record["argv"] == ["-u", "--lr", "3"] and record["name"] == "__main__"
        assert record["torch_loaded_before"] is True
        # The server's objects are in the collector's permanent generation: the rank's collections (and those
        # of its exit) do not walk, and so do not copy, the pages it shares with the server.
        assert record["frozen"] > 10_000
        assert record["pid"] == done.pid and record["sid"] == done.pid  # its own session: torch stops it by group
        assert record["stdin"] == ""  # not the server's request pipe
        assert "to stderr" in errs[0].read_text()
        assert json.loads(_lines(outs[1])[0])["draw"] != record["draw"]  # each fork reseeds Python's random
        # A running rank: wait with a timeout expires; a signal by torch's way (its process group) ends it.
        with pytest.raises(subprocess.TimeoutExpired):
            slow.wait(timeout=0.2)
        assert slow.poll() is None
        # Its /proc/<pid>/environ shows its own variables after the server's (tools find ranks by them).
        shown = Path(f"/proc/{slow.pid}/environ").read_bytes().split(b"\0")
        assert b"RANK=2" in shown and b"SLEEP=600" in shown and not any(b"TRAINGUARD_ENV_RESERVE" in v for v in shown)
        os.killpg(slow.pid, signal.SIGTERM)
        assert slow.wait(timeout=60) == -signal.SIGTERM
        slow.send_signal(signal.SIGKILL)  # after its exit was reported: nothing is signalled
        # A rank still running when the server ends dies with it, and is reported dead.
        orphan = server.spawn({**base, "RANK": "3", "SLEEP": "600"}, str(tmp_path / "o.log"), str(tmp_path / "e.log"))
        assert orphan is not None and orphan.poll() is None
        assert server.proc is not None
        server.proc.kill()
        assert orphan.wait(timeout=60) == -signal.SIGKILL
        assert server.spawn({**base, "RANK": "4"}, str(outs[2]), str(errs[2])) is None  # no server: start cold
    finally:
        server.close(1.0)


def test_a_server_whose_script_import_reads_its_rank_serves_with_that_import_left_for_after_the_fork(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "rankmod.py").write_text(READS_RANK)
    script = tmp_path / "job.py"
    script.write_text("import rankmod\nprint('rankmod saw', rankmod.RANK, flush=True)\n" + SCRIPT)
    pool = WarmSpares(0, ("-u", str(script)), tmp_path / "spares", grace_seconds=1.0, forks=True)
    assert pool.forks is not None
    pool.forks.start()
    try:
        # One server: torch loaded once; the child that loaded rankmod named it and ended, and another child of
        # the same server loaded the rest and serves.
        assert pool.forks.wait_ready(120), pool.forks.hello
        text = (tmp_path / "spares" / "fork-server.log").read_text()
        assert "unfit for a warm start: a module read RANK while loaded ahead; skip=rankmod" in text
        assert text.count("; serving") == 1
        said = [r.getMessage() for r in caplog.records if "now load after the fork" in r.getMessage()]
        assert said == ["fork server: a module read RANK while loaded ahead: rankmod now load after the fork "
                        "(torch stays loaded ahead)"]
        assert pool.ready() > 1 and pool.spares == []  # it serves: no spare interpreter started
        out, err = tmp_path / "r.log", tmp_path / "r.err"
        proc = pool.take({"RANK": "7"}, str(out), str(err))
        assert proc is not None and proc.wait(timeout=60) == 0, err.read_text()
        lines = out.read_text().splitlines()
        assert lines[0] == "rankmod saw 7" and json.loads(lines[1])["rank"] == "7"  # imported after the fork
    finally:
        pool.close()
    assert pool.forks is not None and not pool.forks.running()


LIGHTNING_JOB = '''
import sys
LOADED_AHEAD = "lightning" in sys.modules
import lightning
from torchmetrics.utilities.prints import rank_zero_only as metrics_gate
print(LOADED_AHEAD, lightning.pytorch.utilities.rank_zero.rank_zero_only.rank, metrics_gate.rank, flush=True)
'''


def test_a_framework_that_keeps_its_rank_from_import_is_loaded_ahead_and_each_fork_gets_its_own(
        tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    script = tmp_path / "job.py"
    script.write_text(LIGHTNING_JOB)
    server = ForkServer(("-u", str(script)), tmp_path / "spares")
    server.start()
    try:
        assert server.wait_ready(180), server.hello
        assert server.hello is not None and server.hello["unfit"] is None, server.hello
        base = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
        outs = []
        for rank in (1, 0):
            out = tmp_path / f"rank-{rank}.log"
            proc = server.spawn({**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}, str(out), str(out))
            assert proc is not None and proc.wait(timeout=120) == 0, out.read_text()
            outs.append(out.read_text().split())
        assert outs == [["True", "1", "1"], ["True", "0", "0"]]
    finally:
        server.close(1.0)


def test_a_process_without_the_reserved_room_writes_nothing_into_its_environ() -> None:
    from trainguard.worker.zygote import show_environment

    before = Path("/proc/self/environ").read_bytes()
    assert show_environment({"RANK": "5"}, dict(os.environ)) is False  # this process was not started with the room
    assert Path("/proc/self/environ").read_bytes() == before
