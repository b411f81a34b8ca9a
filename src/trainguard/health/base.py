"""The health-check protocol: configuration, one result per check, and the runner that never raises."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.core.events import HealthCheckResult

log = logging.getLogger(__name__)

HIGH = "high"
"""Exclude the node now (it would fail or corrupt the job)."""
LOW = "low"
"""Drain the node later (degraded, or will need service); the job may keep it for now."""


@dataclass(frozen=True)
class HealthConfig:
    """What to check on one node. Only ``node`` is required; each unset path or endpoint skips its checks."""

    node: str
    """Name of the node checked (``injected`` looks for ``<run_dir>/chaos/unhealthy-<node>``)."""
    run_dir: Path | None = None
    checkpoint_dir: Path | None = None
    rdzv_endpoint: str | None = None
    """``host:port`` of the rendezvous (c10d) endpoint; ``[v6addr]:port`` for IPv6."""
    torch_checks: bool = True
    """Device and gloo smoke tests (import torch: about 2 s the first time in a process)."""
    gpu_checks: bool = True
    """NVML checks; reported as skipped where NVML or a GPU is absent."""
    min_free_bytes: int = 1 << 30
    """Free space a run or checkpoint directory needs (high severity below)."""
    min_available_memory_bytes: int = 1 << 30
    """Available host memory below which ``memory`` fails (low severity)."""
    max_clock_error_seconds: float = 1.0
    """Largest clock error bound (NTP maxerror) accepted by ``clock_sync``."""
    timeout_seconds: float = 5.0
    """Limit for each probe that may block (a write to a hung file system, a TCP connect)."""
    expected_gpus: int | None = None
    """GPUs this node should have; None = at least one when NVML works."""
    max_gpu_temperature_c: int = 87
    nvml: Any = None
    """An object with pynvml's functions (tests pass `trainguard.health.fake.FakeNvml`); None = pynvml."""
    data_dirs: tuple[Path, ...] = ()
    """More directories the job reads or writes (datasets): ``storage_roundtrip``/``storage_latency`` probe them."""
    storage_probe_bytes: int = 1 << 20
    """Bytes written, synced and read back per directory by the storage check."""
    max_storage_latency_seconds: float = 2.0
    """A storage round trip slower than this fails ``storage_latency`` (low)."""
    sysfs_root: Path = Path("/sys")
    """Where the network checks read ``class/infiniband`` and ``class/net`` (tests: a recorded tree)."""
    nics: tuple[str, ...] = ()
    """Interfaces ``nic_link`` must find up; empty: every physical interface that is administratively up."""
    ib_devices: tuple[str, ...] = ()
    """InfiniBand devices that must exist (``mlx5_0``, ...); empty: whatever the host has."""
    max_ib_errors: int = 100
    """An InfiniBand error counter above this fails ``ib_port_errors`` (low); ``link_downed`` above 5 always does."""
    max_carrier_changes: int = 20
    """More carrier changes since boot fail ``nic_flaps`` (low): a flapping link."""
    max_nvlink_errors: int = 100
    """An NVLink replay/recovery/CRC counter above this fails ``nvlink_errors`` (low)."""


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check."""

    name: str
    severity: str
    """``high`` (exclude now) or ``low`` (drain later): what a failure of this check means."""
    ok: bool
    detail: str = ""
    skipped: bool = False
    """The check could not run here (no GPU, nothing configured); ``ok`` is True for skipped checks."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "severity": self.severity, "ok": self.ok, "detail": self.detail,
                "skipped": self.skipped}

    def to_event(self, node: str, attempt: int | None = None) -> HealthCheckResult:
        """The event record the supervisor writes for this result."""
        return HealthCheckResult(time=time.time(), host=node, name=self.name, severity=self.severity,
                                 ok=self.ok, detail=self.detail, skipped=self.skipped, attempt=attempt)


def passed(name: str, severity: str, detail: str = "") -> CheckResult:
    return CheckResult(name, severity, True, detail)


def failed(name: str, severity: str, detail: str) -> CheckResult:
    return CheckResult(name, severity, False, detail)


def skipped(name: str, severity: str, detail: str) -> CheckResult:
    return CheckResult(name, severity, True, detail, skipped=True)


CheckFn = Callable[[HealthConfig], list[CheckResult]]
"""A check: a function of the config returning one or more results (it may raise; the runner catches)."""


def run_all(config: HealthConfig, checks: Sequence[CheckFn]) -> list[CheckResult]:
    """Run ``checks`` in order; a check that raises becomes a failed low-severity result (a bug in a
    check must not exclude a healthy node, but must not pass silently either)."""
    out: list[CheckResult] = []
    for check in checks:
        name = getattr(check, "__name__", "check").removeprefix("check_")
        try:
            out.extend(check(config))
        except Exception as exc:
            log.debug("health check %s raised", name, exc_info=True)
            out.append(failed(name, LOW, f"the check itself failed: {exc.__class__.__name__}: {exc}"))
    return out


def healthy(results: Sequence[CheckResult]) -> bool:
    """True unless a high-severity check failed."""
    return not any(r.severity == HIGH and not r.ok for r in results)
