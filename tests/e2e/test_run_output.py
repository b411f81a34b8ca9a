"""Worker output cannot exhaust the agent or the disk: the console reads in bounded chunks and cuts
over-long lines and ``\\r`` runs, and each rank log is capped at ``--max-log-mb`` with one rotated file.

The break it reproduces: torch's console tailer read each line whole, so one 200 MB line without a newline
took the agent from about 280 MB to 1 GB (a 1 GB line to 3.4 GB), and rank logs grew without bound.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

FLOOD = Path(__file__).resolve().parent / "userscripts" / "flood.py"
CAP_MB = 32
MB = 1 << 20


def _status_kb(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


@pytest.mark.parametrize("mode", ["line", "cr", "lines"])
def test_a_flooding_worker_under_a_memory_bound_and_a_log_cap(tmp_path: Path, mode: str) -> None:
    marker, run_dir = tmp_path / "started", tmp_path / "run"
    err = (tmp_path / "stderr.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "trainguard", "run", "--standalone", "--nproc-per-node", "1",
                             "--no-health-checks", "--no-auto-instrument", "--max-log-mb", str(CAP_MB), "--run-dir",
                             str(run_dir), str(FLOOD), str(marker), "200", mode],
                            stdout=subprocess.DEVNULL, stderr=err)
    baseline = peak = None
    try:
        while proc.poll() is None:
            if baseline is None and marker.exists():
                baseline = _status_kb(proc.pid, "VmRSS")  # the agent, its workers started, before the flood
            hwm = _status_kb(proc.pid, "VmHWM")
            peak = hwm if hwm is not None else peak
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (tmp_path / "stderr.log").read_text()[-3000:]
    assert baseline is not None and peak is not None
    grew_mb = (peak - baseline) / 1024
    print(f"{mode}: agent RSS {baseline / 1024:.0f} MB before the flood, peak {peak / 1024:.0f} MB "
          f"(+{grew_mb:.1f} MB) for 200 MB of output")
    assert grew_mb < 64, grew_mb
    assert peak / 1024 < 400
    logs = run_dir / "logs" / "attempt-0"
    live, rotated = logs / "rank-0.stdout.log", logs / "rank-0.stdout.log.1"
    assert rotated.exists()
    # the newest part, plus at most what one rank writes between two passes of the pump
    assert live.stat().st_size <= CAP_MB * MB + 64 * MB, live.stat().st_size
    assert rotated.stat().st_size <= CAP_MB * MB + 64 * MB, rotated.stat().st_size
    newest = rotated.read_bytes()[-64:] + live.read_bytes()[-64:]
    assert newest.endswith(b"\ndone\n")


@pytest.mark.parametrize(("value", "says"), [("-1", "--max-log-mb must be a whole number from 0 to 65536"),
                                            ("70000", "--max-log-mb must be"), ("abc", "--max-log-mb")])
def test_a_bad_cap_is_a_usage_error_and_creates_nothing(tmp_path: Path, value: str, says: str) -> None:
    from tests.e2e.cli import trainguard

    res = trainguard("run", "--standalone", "--max-log-mb", value, "--run-dir", str(tmp_path / "run"), str(FLOOD),
                     timeout=60)
    assert res.code == 2, res.err
    assert says in res.err and "Traceback" not in res.err
    assert not (tmp_path / "run").exists()
