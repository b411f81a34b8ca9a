"""``trainguard health`` as the supervisor and operators run it: JSON list, exit codes, recorded events."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from trainguard.core.eventlog import read_events
from trainguard.core.events import HealthCheckResult


def tg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainguard", "health", *args],
                          capture_output=True, text=True, timeout=120)


def _nvml_usable() -> bool:
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # not installed (ImportError) or no driver (NVMLError)
        return False
    pynvml.nvmlShutdown()
    return True


def test_healthy_node_json_and_exit_0(tmp_path: Path) -> None:
    r = tg("--json", "--node", "n1", "--run-dir", str(tmp_path), "--checkpoint-dir", str(tmp_path / "ck"))
    assert r.returncode == 0, r.stdout + r.stderr
    docs = json.loads(r.stdout)
    assert all(set(d) == {"name", "severity", "ok", "detail", "skipped"} for d in docs)
    names = {d["name"]: d for d in docs}
    assert names["torch_collective"]["ok"] and not names["torch_collective"]["skipped"]
    # GPU checks run where NVML answers (then a sick GPU may fail the node), and are skipped elsewhere
    assert names["gpu_count"]["skipped"] == (not _nvml_usable())
    assert names["gpu_count"]["ok"] or not names["gpu_count"]["skipped"]
    assert {d["severity"] for d in docs} == {"high", "low"}


def test_injected_unhealthy_node_exits_1_and_records_events(tmp_path: Path) -> None:
    (tmp_path / "chaos").mkdir()
    (tmp_path / "chaos" / "unhealthy-n2").touch()
    r = tg("--node", "n2", "--run-dir", str(tmp_path), "--no-torch", "--record")
    assert r.returncode == 1
    assert "FAIL  injected" in r.stdout and "UNHEALTHY" in r.stdout
    events = read_events(tmp_path / "events" / "health-n2.jsonl")
    failed = [e for e in events if isinstance(e, HealthCheckResult) and not e.ok and e.severity == "high"]
    assert [e.name for e in failed] == ["injected"] and failed[0].host == "n2"


def test_unreachable_rendezvous_and_unwritable_checkpoint_dir_exit_1(tmp_path: Path) -> None:
    r = tg("--json", "--no-torch", "--rdzv-endpoint", "127.0.0.1:1", "--checkpoint-dir", "/sys/fs", "--timeout", "2")
    assert r.returncode == 1
    bad = {d["name"] for d in json.loads(r.stdout) if not d["ok"]}
    assert {"rdzv_reachable", "checkpoint_dir_writable"} <= bad


def test_bad_arguments_exit_2_with_one_line() -> None:
    for args in (["--rdzv-endpoint", "h:99999"], ["--timeout", "0"], ["--record"], ["--expected-gpus", "-1"]):
        r = tg("--no-torch", *args)
        assert r.returncode == 2, args
        assert r.stderr.count("\n") == 1 and r.stdout == ""
