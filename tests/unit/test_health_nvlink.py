"""NVLink error counters through NVML, against the fake NVML (same functions and errors as pynvml)."""

from __future__ import annotations

from pathlib import Path

from trainguard.health import LOW, HealthConfig, run_checks
from trainguard.health.fake import FakeGpu, FakeNvml
from trainguard.health.nvlink import check_nvlink_errors


def one(nvml: FakeNvml, **kw: object) -> object:
    [r] = check_nvlink_errors(HealthConfig(node="n", nvml=nvml, **kw))  # type: ignore[arg-type]
    assert nvml.initialized == 0, "NVML must be shut down after the check"
    return r


def test_clean_links_pass() -> None:
    r = one(FakeNvml([FakeGpu() for _ in range(2)]))
    assert r.ok and not r.skipped and r.severity == LOW and "36 active links" in r.detail  # type: ignore[attr-defined]


def test_erring_links_fail_low_and_name_gpu_and_link() -> None:
    bad = FakeGpu(nvlink_errors={3: (0, 250, 0, 0), 7: (5000, 0, 12, 0)})
    down = FakeGpu(nvlink=[0] * 18, nvlink_errors={0: (9999, 9999, 9999, 9999)})  # down links: gpu_nvlink's
    r = one(FakeNvml([FakeGpu(), bad, down]))
    assert not r.ok and r.severity == LOW  # type: ignore[attr-defined]
    assert r.detail == "above 100: GPU 1 link 3: 250 recovery errors; GPU 1 link 7: 5000 replay errors"  # type: ignore[attr-defined]
    assert one(FakeNvml([bad]), max_nvlink_errors=10_000).ok  # type: ignore[attr-defined]


def test_skipped_without_nvlink_or_nvml() -> None:
    assert one(FakeNvml([FakeGpu(nvlink=None)])).skipped  # type: ignore[attr-defined]
    assert one(FakeNvml(available=False)).skipped  # type: ignore[attr-defined]
    [r] = check_nvlink_errors(HealthConfig(node="n", gpu_checks=False))
    assert r.skipped and "turned off" in r.detail


def test_run_checks_includes_the_new_checks_after_the_old_ones(tmp_path: Path) -> None:
    names = [r.name for r in run_checks(HealthConfig(node="n", run_dir=tmp_path, torch_checks=False,
                                                     nvml=FakeNvml([FakeGpu()])))]
    assert names.index("rdzv_reachable") < names.index("storage_roundtrip") < names.index("ib_port_state")
    assert names.index("nic_flaps") < names.index("gpu_count") < names.index("nvlink_errors") == len(names) - 1
