"""A worker's last heartbeat says ``done`` when its interpreter shuts down, before torch's teardown.

Without it, a finished rank whose teardown outlasts the heartbeat thread (seconds on a loaded host) reads to
the agent as a frozen process, and a healthy job that already finished was once restarted as hung.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainguard.core.protocol import read_heartbeat

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import atexit, sys, time
    from trainguard.worker import runtime

    # registered first, so it runs last: stands for a slow teardown after trainguard's own exit handler
    atexit.register(lambda: print("teardown", flush=True))
    rt = runtime.acquire()
    rt.start_background()
    rt.complete_step(1, 0.01, source="optimizer")
    assert rt.phase != "done"
    print("trained", flush=True)
    sys.exit(int(sys.argv[1]))
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("code", [0, 3])
def test_the_last_heartbeat_is_done_once_the_script_is_over(tmp_path: Path, code: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_") and k != "RANK"}
    env.update(PYTHONPATH=str(ROOT / "src"), TRAINGUARD_RUN_DIR=str(tmp_path / "run"),
               TRAINGUARD_HEARTBEAT_DIR=str(tmp_path / "hb"), RANK="0")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(code)], env=env, capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == code, done.stderr
    assert done.stdout.split() == ["trained", "teardown"]
    beat = read_heartbeat(tmp_path / "hb" / "rank-0")
    assert beat is not None and beat.phase == "done" and beat.steps_done == 1


LAST_WORDS = textwrap.dedent("""
    import datetime, sys
    import torch, torch.distributed as dist
    from trainguard.worker import runtime

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    dist.all_reduce(torch.ones(2))
    rt = runtime.acquire()
    rt.start_control()
    raise RuntimeError("the rank fails on its way out")
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("gathered", [False, True])
def test_last_words_never_replace_the_evidence_the_agent_gathered(tmp_path: Path, gathered: bool) -> None:
    # A rank that dies of an uncaught exception dumps on its way out (the survivors' view of a broken
    # collective), unless the agent already gathered this attempt's evidence: that dump would replace the one
    # its decision used (a Lightning rank, resumed from SIGSTOP and stopped, once made diagnose say desync).
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    if gathered:
        (evidence / "process_state.json").write_text('{"stopped": [0], "unanswered": [], "answered": []}')
        (evidence / "fr_trace_rank_0.pkl").write_bytes(b"the agent's dump")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_") and k != "RANK"}
    env.update(PYTHONPATH=str(ROOT / "src"), TRAINGUARD_RUN_DIR=str(tmp_path / "run"), RANK="0",
               TRAINGUARD_EVIDENCE_DIR=str(evidence), TRAINGUARD_AGENT_PID=str(os.getpid()))
    done = subprocess.run([sys.executable, "-c", LAST_WORDS], env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 1 and "on its way out" in done.stderr, done.stderr
    dump = (evidence / "fr_trace_rank_0.pkl").read_bytes()
    if gathered:
        assert dump == b"the agent's dump"
    else:
        assert len(dump) > 100 and "written on exit" in (evidence / "stacks_rank_0.txt").read_text()
