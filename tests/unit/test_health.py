"""Host and torch health checks against the real machine: files, sockets, gloo."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from trainguard.core.eventlog import read_run
from trainguard.core.rundir import RunDir
from trainguard.health import HIGH, LOW, CheckResult, HealthConfig, healthy, parse_endpoint, run_checks
from trainguard.health.base import run_all
from trainguard.health.fleetdb import FleetDB
from trainguard.health.host import (
    check_checkpoint_dir,
    check_clock,
    check_memory,
    check_rdzv,
    clock_state,
    judge_clock,
)
from trainguard.health.lemon import score_hosts
from trainguard.health.torch_checks import check_torch_devices


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    names = [r.name for r in results]
    assert len(names) == len(set(names)), names
    return {r.name: r for r in results}


def _nvml_usable() -> bool:
    """Whether this machine has NVML (nvidia-ml-py and a driver): GPU checks then really run."""
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def test_healthy_node_passes(tmp_path: Path) -> None:
    cfg = HealthConfig(node="n0", run_dir=tmp_path / "run", checkpoint_dir=tmp_path / "ckpt", torch_checks=False,
                       gpu_checks=False)
    res = by_name(run_checks(cfg))
    assert healthy(res.values())
    for name in ("injected", "run_dir_writable", "run_dir_space", "checkpoint_dir_writable", "checkpoint_dir_space"):
        assert res[name].ok and not res[name].skipped and res[name].severity == HIGH
    assert res["rdzv_reachable"].skipped
    assert not (tmp_path / "run").exists(), "checks must not create the directories"


@pytest.mark.skipif(_nvml_usable(), reason="NVML works here: the GPU checks run (tests/unit/test_health_gpu.py)")
def test_gpu_checks_are_skipped_with_a_reason_without_nvml(tmp_path: Path) -> None:
    res = by_name(run_checks(HealthConfig(node="n0", run_dir=tmp_path, torch_checks=False)))
    gpu = [r for r in res.values() if r.name.startswith("gpu_")]
    assert len(gpu) == 8 and all(r.skipped and r.ok for r in gpu)
    assert "NVML" in gpu[0].detail or "nvidia-ml-py" in gpu[0].detail


def test_injected_flag_fails_high(tmp_path: Path) -> None:
    (tmp_path / "chaos").mkdir()
    (tmp_path / "chaos" / "unhealthy-node7").touch()
    res = by_name(run_checks(HealthConfig(node="node7", run_dir=tmp_path, torch_checks=False, gpu_checks=False)))
    assert not res["injected"].ok and res["injected"].severity == HIGH
    assert not healthy(res.values())
    other = by_name(run_checks(HealthConfig(node="node8", run_dir=tmp_path, torch_checks=False, gpu_checks=False)))
    assert other["injected"].ok


def test_unwritable_or_bogus_checkpoint_dirs_fail_high(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for path, text in [(Path("/sys/fs"), "cannot write"), (a_file, "not a directory"),
                       (a_file / "sub", "cannot write")]:
        res = by_name(check_checkpoint_dir(HealthConfig(node="n", checkpoint_dir=path)))
        assert not res["checkpoint_dir_writable"].ok, path
        assert text in res["checkpoint_dir_writable"].detail
        assert res["checkpoint_dir_writable"].severity == HIGH


def test_disk_space_threshold(tmp_path: Path) -> None:
    res = by_name(check_checkpoint_dir(HealthConfig(node="n", checkpoint_dir=tmp_path, min_free_bytes=1 << 60)))
    assert res["checkpoint_dir_writable"].ok
    assert not res["checkpoint_dir_space"].ok and "GiB free" in res["checkpoint_dir_space"].detail


def test_memory_and_clock_report_low_severity() -> None:
    [m] = check_memory(HealthConfig(node="n"))
    assert m.ok and m.severity == LOW
    [m] = check_memory(HealthConfig(node="n", min_available_memory_bytes=1 << 60))
    assert not m.ok and m.severity == LOW



@pytest.mark.parametrize(("state", "ok", "skip", "words"), [
    ((True, 0.004), True, False, "error bound 4 ms"),
    ((True, 2.5), False, False, "2.500 s exceeds 1 s"),
    ((False, 16.0), False, False, "not NTP-synchronized"),
    (None, True, True, "not readable"),
])
def test_clock_states_are_judged(state: tuple[bool, float] | None, ok: bool, skip: bool, words: str) -> None:
    c = judge_clock(state, max_error_seconds=1.0)
    assert (c.name, c.severity, c.ok, c.skipped) == ("clock_sync", LOW, ok, skip)
    assert words in c.detail


def test_clock_check_reports_this_hosts_kernel_state() -> None:
    state = clock_state()
    [c] = check_clock(HealthConfig(node="n", max_clock_error_seconds=0.5))
    assert c == judge_clock(state, 0.5)
    if state is not None:  # the kernel's own numbers, read twice: the verdict cannot differ
        assert c.ok == (state[0] and state[1] <= 0.5)


def test_rdzv_reachability_with_real_sockets() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        [ok] = check_rdzv(HealthConfig(node="n", rdzv_endpoint=f"127.0.0.1:{port}"))
        assert ok.ok and not ok.skipped
    finally:
        server.close()
    [bad] = check_rdzv(HealthConfig(node="n", rdzv_endpoint=f"127.0.0.1:{port}", timeout_seconds=1))
    assert not bad.ok and bad.severity == HIGH and "cannot connect" in bad.detail
    [bogus] = check_rdzv(HealthConfig(node="n", rdzv_endpoint="host:notaport"))
    assert not bogus.ok


def test_parse_endpoint() -> None:
    assert parse_endpoint("node1:29500") == ("node1", 29500)
    assert parse_endpoint("node1") == ("node1", 29400)
    assert parse_endpoint("[::1]:1234") == ("::1", 1234)
    for bad in ("", ":80", "h:0", "h:70000", "[::1", "h:x"):
        with pytest.raises(ValueError):
            parse_endpoint(bad)


def test_a_crashing_check_is_reported_not_raised() -> None:
    def check_broken(config: HealthConfig) -> list[CheckResult]:
        raise RuntimeError("boom")

    [r] = run_all(HealthConfig(node="n"), [check_broken])
    assert (r.name, r.ok, r.severity) == ("broken", False, LOW) and "boom" in r.detail


def test_torch_checks_run_a_real_gloo_collective() -> None:
    start = time.monotonic()
    res = by_name(run_checks(HealthConfig(node="n", gpu_checks=False)))
    assert res["torch_devices"].ok and res["torch_collective"].ok
    assert "all-reduce" in res["torch_collective"].detail
    assert time.monotonic() - start < 30


def test_torch_devices_are_held_to_the_expected_count() -> None:
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    [exact] = check_torch_devices(HealthConfig(node="n", expected_gpus=visible or None))
    assert exact.ok and exact.severity == HIGH, exact.detail
    [short] = check_torch_devices(HealthConfig(node="n", expected_gpus=visible + 1))
    assert not short.ok and short.severity == HIGH and f"expected {visible + 1}" in short.detail


def test_results_reach_the_fleet_history_as_the_lemon_score_reads_them(tmp_path: Path, fleet_db: str) -> None:
    """Results written as events, read back from disk and indexed: a failed check counts against the
    node (a low-severity one only as a drain-later finding); passed and skipped checks do not."""
    results = [CheckResult("injected", HIGH, False, "flag"), CheckResult("clock_sync", LOW, False, "drift"),
               CheckResult("gpu_ecc", HIGH, True, "", skipped=True), CheckResult("run_dir_writable", HIGH, True)]
    rd = RunDir(tmp_path / "run").create()
    with rd.writer("agent-node3") as w:
        w.write_all([r.to_event("node3", attempt=2) for r in results])
    back = [e for _, _, e in read_run(rd.root)]
    assert [(e.host, e.attempt, e.name, e.severity, e.ok, e.skipped, e.detail) for e in back] == [
        ("node3", 2, r.name, r.severity, r.ok, r.skipped, r.detail) for r in results]
    with FleetDB(fleet_db) as db:
        db.index_run(rd)
        history = db.host_history("node3")
    [score] = score_hosts(history)
    assert score.counts == {"check_failed": 1, "check_failed_low": 1}
