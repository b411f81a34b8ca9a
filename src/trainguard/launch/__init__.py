"""The supervisor behind ``trainguard run``: torch.distributed.elastic's agent with trainguard's watchdog,
evidence gathering, health gate and restart policy. See docs/run.md."""

from __future__ import annotations

from trainguard.launch.config import SupervisorConfig
from trainguard.launch.watchdog import WatchdogConfig

__all__ = ["SupervisorConfig", "WatchdogConfig"]
