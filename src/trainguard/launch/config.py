"""Configuration of one node's supervisor (what ``trainguard run`` builds from its options)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainguard.launch.watchdog import WatchdogConfig
from trainguard.protocol import RunLayout


@dataclass(frozen=True)
class SupervisorConfig:
    """Everything one node agent needs."""

    command: tuple[str, ...]
    """The training script and its arguments (``.py`` files run with this Python)."""
    run_dir: Path
    run_id: str
    """Rendezvous id shared by all nodes of the job."""
    node_id: str
    """This node's name in events, health checks and chaos (default: the host name)."""
    nproc_per_node: int = 1
    min_nodes: int = 1
    max_nodes: int = 1
    rdzv_endpoint: str = ""
    """``host:port`` of the c10d rendezvous store."""
    max_restarts: int = 3
    max_no_progress_attempts: int = 3
    """Stop after this many failed attempts in a row that saved no new checkpoint."""
    monitor_interval_seconds: float = 0.1
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    chaos: str = ""
    """The ``--inject`` schedule (already validated)."""
    checkpoint_dir_override: Path | None = None
    health_checks: bool = True
    gpu_checks: bool = True
    """GPU health checks (they skip themselves where NVML or GPUs are absent)."""
    fleet_db: str | None = None
    target_steps: int | None = None
    last_call_seconds: int = 2
    """How long the rendezvous waits for more nodes once ``min_nodes`` joined."""
    join_timeout_seconds: int = 600
    auto_instrument: bool = True
    """Load trainguard's worker side into every worker at start-up (no script change needed)."""
    logs_dir_override: Path | None = None
    """torchrun's ``--log-dir``: where ``attempt-<k>/`` log folders go instead of ``<run dir>/logs``."""
    stop_grace_seconds: float = 3.0
    """How long a worker being stopped gets between SIGTERM (after SIGCONT) and SIGKILL."""

    @property
    def layout(self) -> RunLayout:
        """The run directory's paths (`trainguard.protocol.RunLayout`)."""
        return RunLayout(self.run_dir, self.logs_dir_override)

    @property
    def checkpoint_dir(self) -> Path:
        return self.checkpoint_dir_override or self.run_dir / "checkpoints"

    def pg_timeout_seconds(self) -> float:
        """Process-group timeout handed to the workers: well above the longest hang timeout."""
        return 2 * self.watchdog.max_timeout_seconds() + 60

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for k, v in out.items():
            if isinstance(v, Path):
                out[k] = str(v)
        out["command"] = list(self.command)
        return out
