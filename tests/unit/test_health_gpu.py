"""GPU checks against a fake NVML with pynvml's interface: every GPU state, on any machine."""

from __future__ import annotations

import pytest

from trainguard.health import HIGH, LOW, CheckResult, HealthConfig
from trainguard.health.fake import FakeGpu, FakeNvml
from trainguard.health.gpu import GPU_CHECKS, check_gpus


def run(gpus: list[FakeGpu], **kw: object) -> dict[str, CheckResult]:
    nvml = FakeNvml(gpus)
    out = {r.name: r for r in check_gpus(HealthConfig(node="n", nvml=nvml, **kw))}  # type: ignore[arg-type]
    assert nvml.initialized == 0, "NVML must be shut down after the checks"
    return out


def test_all_good() -> None:
    res = run([FakeGpu() for _ in range(8)], expected_gpus=8)
    assert set(res) == {n for n, _ in GPU_CHECKS}
    assert all(r.ok and not r.skipped for r in res.values()), res
    assert res["gpu_count"].detail == "8 GPUs"


def test_missing_and_lost_gpus_fail_high() -> None:
    res = run([FakeGpu() for _ in range(7)], expected_gpus=8)
    assert not res["gpu_count"].ok and "expected 8" in res["gpu_count"].detail
    res = run([FakeGpu(), FakeGpu(lost=True)])
    assert not res["gpu_count"].ok and "GPU 1" in res["gpu_count"].detail and res["gpu_count"].severity == HIGH


def test_ecc_and_row_remapping() -> None:
    res = run([FakeGpu(), FakeGpu(uncorrected_ecc=3), FakeGpu(remapped_rows=(0, 2, 0, 1)),
               FakeGpu(remapped_rows=(1, 0, 1, 0))])
    assert not res["gpu_ecc"].ok and "GPU 1: 3 uncorrectable" in res["gpu_ecc"].detail
    assert not res["gpu_row_remap_failure"].ok and "GPU 2" in res["gpu_row_remap_failure"].detail
    assert res["gpu_row_remap_failure"].severity == HIGH
    pending = res["gpu_row_remap_pending"]
    assert not pending.ok and pending.severity == LOW and "GPU 3" in pending.detail and "GPU 2" not in pending.detail


def test_xid_events_hardware_high_application_low() -> None:
    res = run([FakeGpu(xids=[79]), FakeGpu()])
    assert not res["gpu_xid"].ok and res["gpu_xid"].severity == HIGH and "79" in res["gpu_xid"].detail
    res = run([FakeGpu(xids=[13, 43])])
    assert not res["gpu_xid"].ok and res["gpu_xid"].severity == LOW


def test_nvlink_thermal_pcie() -> None:
    down = [1] * 18
    down[4] = 0
    res = run([FakeGpu(nvlink=down), FakeGpu(temperature_c=95), FakeGpu(clocks_event_reasons=0x40),
               FakeGpu(pcie_width=(8, 16))])
    assert not res["gpu_nvlink"].ok and "GPU 0: NVLink links [4]" in res["gpu_nvlink"].detail
    thermal = res["gpu_thermal"]
    assert not thermal.ok and thermal.severity == LOW
    assert "GPU 1: 95 C" in thermal.detail and "GPU 2: clocks throttled (HW thermal slowdown)" in thermal.detail
    assert not res["gpu_pcie_width"].ok and "x8, capable of x16" in res["gpu_pcie_width"].detail


def test_unsupported_queries_are_skipped_not_failed() -> None:
    res = run([FakeGpu(nvlink=None, uncorrected_ecc=None, remapped_rows=None, pcie_width=None)] * 2)
    for name in ("gpu_nvlink", "gpu_ecc", "gpu_row_remap_failure", "gpu_pcie_width"):
        assert res[name].skipped and res[name].ok, name
    assert res["gpu_thermal"].ok and not res["gpu_thermal"].skipped


def test_no_nvml_means_every_gpu_check_is_skipped_with_a_note() -> None:
    res = {r.name: r for r in check_gpus(HealthConfig(node="n", nvml=FakeNvml(available=False)))}
    assert all(r.skipped and r.ok and "NVML unavailable" in r.detail for r in res.values())
    # the real pynvml: skipped where the driver is absent (this machine), checked where it is present
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        has_driver = True
    except pynvml.NVMLError:
        has_driver = False
    real = {r.name: r for r in check_gpus(HealthConfig(node="n"))}
    assert set(real) <= set(res)
    assert real["gpu_count"].skipped is not has_driver
    off = check_gpus(HealthConfig(node="n", gpu_checks=False))
    assert all(r.skipped and "turned off" in r.detail for r in off)


def test_nvml_that_cannot_count_still_reports_every_check() -> None:
    class Broken(FakeNvml):
        def nvmlDeviceGetCount(self) -> int:
            raise self.NVMLError(999)

    res = {r.name: r for r in check_gpus(HealthConfig(node="n", nvml=Broken([])))}
    assert set(res) == {n for n, _ in GPU_CHECKS}
    assert not res["gpu_count"].ok and res["gpu_count"].severity == HIGH
    assert all(r.skipped for n, r in res.items() if n != "gpu_count")


def test_without_re2_only_the_xid_check_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    # A source checkout on a machine without google-re2: the XID rules cannot load; ECC, NVLink, thermal,
    # PCIe and the rest must still report (they were lost to one "the check itself failed").
    import sys

    for name in [m for m in sys.modules if m == "trainguard.classify" or m.startswith("trainguard.classify.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "re2", None)
    res = run([FakeGpu()])
    assert res["gpu_xid"].skipped and "XID rules unavailable" in res["gpu_xid"].detail, res["gpu_xid"]
    assert set(res) == {n for n, _ in GPU_CHECKS}
    assert all(r.ok for n, r in res.items() if n != "gpu_xid"), res
