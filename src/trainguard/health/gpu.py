"""GPU checks through NVML (nvidia-ml-py): count, ECC, row remapping, XIDs, NVLink, thermal, PCIe.

The checks talk to an object with pynvml's functions (`NvmlApi`): the real ``pynvml`` module, or
`trainguard.health.fake.FakeNvml` in tests. Without NVML (no driver, no GPU) every check is skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from trainguard.health.base import HIGH, LOW, CheckResult, HealthConfig, failed, passed, skipped

GPU_CHECKS: tuple[tuple[str, str], ...] = (
    ("gpu_count", HIGH), ("gpu_ecc", HIGH), ("gpu_row_remap_failure", HIGH), ("gpu_row_remap_pending", LOW),
    ("gpu_xid", HIGH), ("gpu_nvlink", HIGH), ("gpu_thermal", LOW), ("gpu_pcie_width", LOW),
)
XID_WAIT_MS = 200
"""How long ``gpu_xid`` listens for critical XID events (NVML reports events from registration on)."""
_HW_SLOWDOWN = 0x8
_HW_THERMAL = 0x40
_SW_THERMAL = 0x20


class NvmlApi(Protocol):
    """The part of pynvml the checks use (same names and semantics)."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int: ...
    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None: ...
    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any: ...
    def nvmlEventSetFree(self, event_set: Any) -> None: ...
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int: ...
    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int: ...
    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int: ...


def _load_nvml(config: HealthConfig) -> tuple[Any, str]:
    if config.nvml is not None:
        return config.nvml, ""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install 'trainguard[gpu]')"
    return pynvml, ""


def _query(nvml: Any, fn: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
    """(value, None), or (None, reason) when NVML cannot answer ``fn(*args)``."""
    try:
        return fn(*args), None
    except nvml.NVMLError as exc:
        return None, str(exc) or exc.__class__.__name__


def check_gpus(config: HealthConfig) -> list[CheckResult]:
    """All NVML checks in one NVML session; skipped with a note where NVML is absent."""
    if not config.gpu_checks:
        return [skipped(n, s, "GPU checks turned off") for n, s in GPU_CHECKS]
    nvml, why = _load_nvml(config)
    if nvml is not None:
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            nvml, why = None, f"NVML unavailable ({exc}): no NVIDIA driver or GPU on this host"
    if nvml is None:
        return [skipped(n, s, why) for n, s in GPU_CHECKS]
    try:
        return _run(nvml, config)
    finally:
        _query(nvml, nvml.nvmlShutdown)


def _run(nvml: Any, config: HealthConfig) -> list[CheckResult]:
    count, err = _query(nvml, nvml.nvmlDeviceGetCount)
    if count is None:
        return [failed("gpu_count", HIGH, f"NVML cannot count GPUs: {err}")] + [
            skipped(n, s, "no GPU list from NVML") for n, s in GPU_CHECKS if n != "gpu_count"]
    out: list[CheckResult] = []
    handles: list[tuple[int, Any]] = []
    lost: list[str] = []
    for i in range(count):
        h, err = _query(nvml, nvml.nvmlDeviceGetHandleByIndex, i)
        if h is None:
            lost.append(f"GPU {i}: {err}")
        else:
            handles.append((i, h))
    want = config.expected_gpus
    if lost or (want is not None and count < want) or count == 0:
        problems = lost + ([f"{count} GPUs, expected {want}"] if want is not None and count < want else [])
        out.append(failed("gpu_count", HIGH, "; ".join(problems) or "NVML sees no GPU"))
    else:
        out.append(passed("gpu_count", HIGH, f"{count} GPUs"))
    out += _ecc_and_remap(nvml, handles)
    out.append(_xids(nvml, handles))
    out.append(_nvlink(nvml, handles))
    out.append(_thermal(nvml, handles, config.max_gpu_temperature_c))
    out.append(_pcie(nvml, handles))
    return out


def _summary(name: str, severity: str, bad: list[str], unsupported: int, total: int, good: str) -> CheckResult:
    if bad:
        return failed(name, severity, "; ".join(bad))
    if total and unsupported == total:
        return skipped(name, severity, "not supported by these GPUs")
    return passed(name, severity, good + (f" ({unsupported} GPUs could not report)" if unsupported else ""))


def _ecc_and_remap(nvml: Any, handles: list[tuple[int, Any]]) -> list[CheckResult]:
    uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    volatile = getattr(nvml, "NVML_VOLATILE_ECC", 0)
    ecc_bad, remap_fail, remap_pending = [], [], []
    ecc_na = remap_na = 0
    for i, h in handles:
        n, _ = _query(nvml, nvml.nvmlDeviceGetTotalEccErrors, h, uncorrected, volatile)
        if n is None:
            ecc_na += 1
        elif n > 0:
            ecc_bad.append(f"GPU {i}: {n} uncorrectable ECC errors since boot")
        rows, _ = _query(nvml, nvml.nvmlDeviceGetRemappedRows, h)
        if rows is None:
            remap_na += 1
            continue
        _corr, unc, pending, failure = rows
        if failure:
            remap_fail.append(f"GPU {i}: row remapping failed ({unc} rows remapped for uncorrectable errors)")
        if pending:
            remap_pending.append(f"GPU {i}: row remap pending, GPU reset needed")
    n = len(handles)
    return [
        _summary("gpu_ecc", HIGH, ecc_bad, ecc_na, n, "no uncorrectable ECC errors"),
        _summary("gpu_row_remap_failure", HIGH, remap_fail, remap_na, n, "no row-remap failures"),
        _summary("gpu_row_remap_pending", LOW, remap_pending, remap_na, n, "no pending row remaps"),
    ]


def _xids(nvml: Any, handles: list[tuple[int, Any]]) -> CheckResult:
    try:
        from trainguard.classify import default_rules
    except ImportError as exc:  # google-re2 missing: every other GPU check still runs
        return skipped("gpu_xid", HIGH, f"XID rules unavailable ({exc})")

    rules = default_rules()
    event_type = getattr(nvml, "nvmlEventTypeXidCriticalError", 0x8)
    es, err = _query(nvml, nvml.nvmlEventSetCreate)
    if es is None:
        return skipped("gpu_xid", HIGH, f"NVML events unavailable: {err}")
    try:
        for _, h in handles:
            _query(nvml, nvml.nvmlDeviceRegisterEvents, h, event_type, es)
        seen: list[tuple[str, int]] = []
        while len(seen) < 64:
            ev, _ = _query(nvml, nvml.nvmlEventSetWait_v2, es, XID_WAIT_MS)
            if ev is None:  # timeout: no (more) events
                break
            seen.append((str(getattr(ev, "device", "?")), int(ev.eventData)))
    finally:
        _query(nvml, nvml.nvmlEventSetFree, es)
    if not seen:
        return passed("gpu_xid", HIGH, f"no critical XID events in {XID_WAIT_MS} ms")
    hardware = []
    for _dev, code in seen:
        rule = rules.xid_rule(code)
        if rule is None or rule.tier == "hardware":
            hardware.append(code)
    codes = ", ".join(str(c) for _, c in seen)
    if hardware:
        return failed("gpu_xid", HIGH, f"hardware XID events: {codes}")
    return failed("gpu_xid", LOW, f"application-caused XID events: {codes}")


def _nvlink(nvml: Any, handles: list[tuple[int, Any]]) -> CheckResult:
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
    bad, with_links = [], 0
    for i, h in handles:
        states = []
        for link in range(max_links):
            s, _ = _query(nvml, nvml.nvmlDeviceGetNvLinkState, h, link)
            if s is not None:
                states.append((link, s))
        if states:
            with_links += 1
        down = [link for link, s in states if not s]
        if down:
            bad.append(f"GPU {i}: NVLink links {down} inactive")
    if not with_links:
        return skipped("gpu_nvlink", HIGH, "no NVLink on these GPUs")
    return _summary("gpu_nvlink", HIGH, bad, 0, len(handles), f"all NVLink links active on {with_links} GPUs")


def _thermal(nvml: Any, handles: list[tuple[int, Any]], limit_c: int) -> CheckResult:
    sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
    # older nvidia-ml-py releases name it "throttle reasons"
    reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if reasons_fn is None:
        reasons_fn = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    bad, na, hottest = [], 0, None
    for i, h in handles:
        temp, _ = _query(nvml, nvml.nvmlDeviceGetTemperature, h, sensor)
        reasons, _ = _query(nvml, reasons_fn, h)
        if temp is None and reasons is None:
            na += 1
            continue
        if temp is not None:
            hottest = temp if hottest is None else max(hottest, temp)
            if temp >= limit_c:
                bad.append(f"GPU {i}: {temp} C (limit {limit_c} C)")
        if reasons is not None and reasons & (_HW_THERMAL | _HW_SLOWDOWN | _SW_THERMAL):
            names = [n for bit, n in ((_HW_THERMAL, "HW thermal slowdown"), (_HW_SLOWDOWN, "HW slowdown"),
                                      (_SW_THERMAL, "SW thermal slowdown")) if reasons & bit]
            bad.append(f"GPU {i}: clocks throttled ({', '.join(names)})")
    good = f"hottest GPU {hottest} C, no thermal throttling" if hottest is not None else "no thermal throttling"
    return _summary("gpu_thermal", LOW, bad, na, len(handles), good)


def _pcie(nvml: Any, handles: list[tuple[int, Any]]) -> CheckResult:
    bad, na = [], 0
    for i, h in handles:
        cur, _ = _query(nvml, nvml.nvmlDeviceGetCurrPcieLinkWidth, h)
        mx, _ = _query(nvml, nvml.nvmlDeviceGetMaxPcieLinkWidth, h)
        if cur is None or mx is None:
            na += 1
        elif cur < mx:
            bad.append(f"GPU {i}: PCIe link x{cur}, capable of x{mx}")
    return _summary("gpu_pcie_width", LOW, bad, na, len(handles), "PCIe links at full width")
