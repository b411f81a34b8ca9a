"""Configuration of one node's supervisor (what ``trainguard run`` builds from its options)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import UsageError
from trainguard.launch.watchdog import WatchdogConfig
from trainguard.protocol import RunLayout
from trainguard.sdc import DEFAULT_CHECK_EVERY


@dataclass(frozen=True)
class SupervisorConfig:
    """Everything one node agent needs."""

    command: tuple[str, ...]
    """The training script (or module, or program) and its arguments; see ``module`` and ``no_python``."""
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
    module: bool = False
    """torchrun's ``-m``: ``command[0]`` is a module, run as ``python -u -m module args``."""
    no_python: bool = False
    """torchrun's ``--no-python``: run ``command`` itself, not ``python -u command``."""
    rdzv_backend: str = "c10d"
    """``c10d`` (dynamic membership, store in the agent on the endpoint host) or ``static`` (fixed
    node count, each node's rank given by ``node_rank``)."""
    node_rank: int = 0
    """This node's rank with the ``static`` backend (torchrun's ``--node-rank``); unused with c10d."""
    rdzv_conf: tuple[tuple[str, str], ...] = ()
    """Extra rendezvous settings handed to torch as they are (``read_timeout``, ``is_host``, ...)."""
    rdzv_close_timeout_seconds: int = 10
    """How long the rendezvous stays open for late nodes once it is closed (torch's ``close_timeout``)."""
    local_addr: str | None = None
    """Address other nodes use to reach this one (torchrun's ``--local-addr``); None: torch's choice."""
    role: str = "default"
    """Worker role name (torchrun's ``--role``): ``ROLE_NAME`` of the workers."""
    redirects: str = "0"
    """torchrun's ``--redirects``: streams (per local rank) kept off the console. Files are always written."""
    tee: str = "0"
    """torchrun's ``--tee``: streams (per local rank) shown on the console even when redirected."""
    local_ranks_filter: tuple[int, ...] = ()
    """Only these local ranks' output reaches the console (empty: all); files keep every rank."""
    quiet: bool = False
    """No worker output on the console (the files are still written)."""
    sdc_check_every: int = DEFAULT_CHECK_EVERY
    """Compare the data-parallel replicas' parameter fingerprints every this many optimizer steps (0: off);
    see docs/sdc.md. Handed to the workers as ``TRAINGUARD_SDC_EVERY``."""
    log_line_prefix: str = "[rank${rank}]: "
    """Prefix of each worker line on the console; ``${rank}``, ``${local_rank}``, ``${role_name}`` expand."""

    @property
    def layout(self) -> RunLayout:
        """The run directory's paths (`trainguard.protocol.RunLayout`)."""
        return RunLayout(self.run_dir, self.logs_dir_override)

    @property
    def checkpoint_dir(self) -> Path:
        return self.checkpoint_dir_override or self.run_dir / "checkpoints"

    def console_streams(self, local_rank: int) -> int:
        """Which of the worker's streams reach the console, as torch's ``Std`` bits (1 stdout, 2 stderr).

        torchrun's meaning: every stream shows unless redirected, and a tee'd stream shows anyway;
        ``local_ranks_filter`` then keeps only the listed local ranks; ``quiet`` shows nothing."""
        if self.quiet or (self.local_ranks_filter and local_rank not in self.local_ranks_filter):
            return 0
        redirected = std_of(parse_std_spec(self.redirects, "--redirects"), local_rank)
        teed = std_of(parse_std_spec(self.tee, "--tee"), local_rank)
        return ((3 & ~redirected) | teed) & 3

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


def parse_std_spec(text: str, flag: str) -> int | dict[int, int]:
    """torchrun's stream selector: ``0``-``3`` for every local rank (1 stdout, 2 stderr, 3 both), or
    ``LOCAL_RANK:VALUE,...`` per local rank (unlisted ranks get 0). Raises `UsageError` otherwise."""
    value = text.strip()
    if value in ("0", "1", "2", "3"):
        return int(value)
    out: dict[int, int] = {}
    for part in value.split(","):
        rank, sep, bits = part.strip().partition(":")
        if not sep or not rank.isdigit() or len(rank) > 6 or bits not in ("0", "1", "2", "3") or int(rank) in out:
            raise UsageError(f"{flag} must be 0-3 (1 stdout, 2 stderr, 3 both) or LOCAL_RANK:VALUE,... "
                             f"such as 0:3,1:2, got {text!r}")
        out[int(rank)] = int(bits)
    return out


def std_of(spec: int | dict[int, int], local_rank: int) -> int:
    """The stream bits a `parse_std_spec` result gives one local rank."""
    return spec if isinstance(spec, int) else spec.get(local_rank, 0)
