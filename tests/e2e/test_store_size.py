"""Keys written into a running job's rendezvous store: torch's TCPStore cannot refuse them, the agent says so.

A probe wrote 256 MiB of keys into the store and the agent hosting it grew from 289 to 558 MB, silently.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.e2e._run_helpers import ROOT, json_result, start_trainguard, wait_until

PLAIN_DDP = ROOT / "tests" / "e2e" / "unmodified" / "plain_ddp.py"
WARNING = "the rendezvous store holds"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_store_filled_with_keys_is_reported_once_on_the_console(tmp_path: Path) -> None:
    run_dir, log, stop = tmp_path / "run", tmp_path / "agent.log", tmp_path / "stop"
    step_log = tmp_path / "steps" / "log"
    step_log.parent.mkdir()
    proc = start_trainguard(
        "run", "--standalone", "--nproc-per-node", "1", "--run-dir", str(run_dir), "--json", "--node-id", "vm-a",
        "--", str(PLAIN_DDP), "--steps", "100000", "--step-seconds", "0.02", "--ckpt-dir", str(tmp_path / "ckpt"),
        "--stop-file", str(stop), "--step-log", str(step_log), log=log)
    try:
        found: list[tuple[str, str]] = []

        def rendezvous_line() -> bool:
            found[:] = re.findall(r"rendezvous c10d (127\.0\.0\.1):(\d+) id", log.read_text())
            return bool(found)

        wait_until("rendezvous line", rendezvous_line, proc, log, 60)
        host, port = found[0]
        store = dist.TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=30))
        wait_until("a started job", lambda: any(p.stat().st_size for p in step_log.parent.iterdir()), proc, log, 120)
        assert WARNING not in log.read_text()  # a job's own keys are far below the limit
        for batch in range(30):  # 30,000 small keys: past the 20,000 a 1-rank job is allowed
            keys = [f"filler/{batch}/{i}" for i in range(1000)]
            store.multi_set(keys, [b"x" * 16] * len(keys))
        wait_until("the store-size warning", lambda: WARNING in log.read_text(), proc, log, 60)
        stop.touch()
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert json_result(log)["status"] == "completed"
    assert text.count(WARNING) == 1, text[-3000:]
    line = next(line for line in text.splitlines() if WARNING in line)
    counted = re.search(r"holds (\d+) keys", line)
    assert counted is not None and int(counted[1]) >= 30_000, line
