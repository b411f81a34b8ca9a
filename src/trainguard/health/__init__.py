"""Node health checks run before every (re)start: host, torch and GPU (NVML) checks with severities.

``high`` failures exclude the node now; ``low`` ones mean drain it later. `run_checks` never raises for
a failing check: it reports it. See docs/health.md.
"""

from __future__ import annotations

import importlib.util

from trainguard.health.base import (
    HIGH,
    LOW,
    CheckFn,
    CheckResult,
    HealthConfig,
    healthy,
    run_all,
    skipped,
)
from trainguard.health.gpu import GPU_CHECKS, check_gpus
from trainguard.health.host import (
    check_checkpoint_dir,
    check_clock,
    check_injected,
    check_memory,
    check_rdzv,
    check_run_dir,
    parse_endpoint,
)
from trainguard.health.nic import check_ib, check_nics
from trainguard.health.nvlink import check_nvlink_errors
from trainguard.health.storage import check_storage

__all__ = [
    "GPU_CHECKS",
    "HIGH",
    "LOW",
    "CheckFn",
    "CheckResult",
    "HealthConfig",
    "checks_for",
    "healthy",
    "parse_endpoint",
    "run_checks",
]


def _torch_missing(config: HealthConfig) -> list[CheckResult]:
    note = "torch is not installed (a dependency of trainguard: pip install 'torch>=2.13,<2.14')"
    return [skipped("torch_devices", HIGH, note), skipped("torch_collective", HIGH, note)]


def checks_for(config: HealthConfig) -> list[CheckFn]:
    """The checks `run_checks` runs for ``config``, in order (cheap ones first)."""
    checks: list[CheckFn] = [check_injected, check_run_dir, check_checkpoint_dir, check_memory, check_clock,
                             check_rdzv, check_storage, check_ib, check_nics]
    if config.torch_checks and importlib.util.find_spec("torch") is None:
        checks.append(_torch_missing)
    elif config.torch_checks:
        from trainguard.health.torch_checks import check_torch_collective, check_torch_devices

        checks += [check_torch_devices, check_torch_collective]
    checks += [check_gpus, check_nvlink_errors]
    return checks


def run_checks(config: HealthConfig) -> list[CheckResult]:
    """Run every check for ``config``; one result per check (GPU checks skipped without NVML)."""
    return run_all(config, checks_for(config))
