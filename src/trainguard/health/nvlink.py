"""NVLink error counters through NVML: replays, recoveries and CRC errors per link (``nvlink_errors``, low).

``gpu_nvlink`` (in `trainguard.health.gpu`) fails a node whose links are down; this check finds links that are
up but erring (a marginal link that slows every collective and ends in a down link): drain later. Counters count
since the driver loaded or they were reset (``nvidia-smi nvlink -e -r``). Tested against
`trainguard.health.fake.FakeNvml`; skipped where NVML or NVLink is absent.
"""

from __future__ import annotations

from typing import Any

from trainguard.health.base import LOW, CheckResult, HealthConfig, failed, passed, skipped
from trainguard.health.gpu import _load_nvml, _query

COUNTERS: tuple[tuple[str, int], ...] = (("replay", 0), ("recovery", 1), ("crc_flit", 2), ("crc_data", 3))
"""NVML's ``NVML_NVLINK_ERROR_DL_*`` counters (name, value)."""
NAME = "nvlink_errors"


def check_nvlink_errors(config: HealthConfig) -> list[CheckResult]:
    if not config.gpu_checks:
        return [skipped(NAME, LOW, "GPU checks turned off")]
    nvml, why = _load_nvml(config)
    if nvml is None:
        return [skipped(NAME, LOW, why)]
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return [skipped(NAME, LOW, f"NVML unavailable ({exc}): no NVIDIA driver or GPU on this host")]
    try:
        return [_judge(nvml, config.max_nvlink_errors)]
    finally:
        _query(nvml, nvml.nvmlShutdown)


def _judge(nvml: Any, limit: int) -> CheckResult:
    count, err = _query(nvml, nvml.nvmlDeviceGetCount)
    if count is None:
        return skipped(NAME, LOW, f"NVML cannot count GPUs: {err}")
    if not hasattr(nvml, "nvmlDeviceGetNvLinkErrorCounter"):
        return skipped(NAME, LOW, "this nvidia-ml-py has no NVLink error counters")
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
    bad, links = [], 0
    for i in range(count):
        h, _ = _query(nvml, nvml.nvmlDeviceGetHandleByIndex, i)
        if h is None:
            continue  # gpu_count reports lost GPUs
        for link in range(max_links):
            state, _ = _query(nvml, nvml.nvmlDeviceGetNvLinkState, h, link)
            if not state:
                continue  # absent or down: gpu_nvlink's business
            links += 1
            for name, counter in COUNTERS:
                value, _ = _query(nvml, nvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
                if value is not None and value > limit:
                    bad.append(f"GPU {i} link {link}: {value} {name} errors")
    if not links:
        return skipped(NAME, LOW, "no active NVLink on these GPUs")
    if bad:
        return failed(NAME, LOW, f"above {limit}: " + "; ".join(bad))
    return passed(NAME, LOW, f"{links} active links, error counters within {limit}")
