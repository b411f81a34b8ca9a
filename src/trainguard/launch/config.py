"""Configuration of one node's supervisor (what ``trainguard run`` builds from its options)."""

from __future__ import annotations

import math
import signal
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import UsageError
from trainguard.health.drain import DrainSettings
from trainguard.launch.watchdog import WatchdogConfig
from trainguard.names import check_name
from trainguard.numeric import in_range
from trainguard.protocol import RunLayout
from trainguard.sdc import DEFAULT_CHECK_EVERY, MAX_CHECK_EVERY
from trainguard.stragglers.watch import MAX_SECONDS, MIN_SECONDS
from trainguard.stragglers.watch import POLICIES as STRAGGLER_POLICIES


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
    in_process: bool = False
    """``--in-process``: after a failure only the failed ranks get new processes and the others re-enter their
    `trainguard.worker.inprocess.restartable` function (one node only; docs/run.md)."""
    in_process_timeout_seconds: float = 30.0
    """How long an in-process restart may take to re-form the process group before every worker is restarted."""
    warm_spares: int = 0
    """With ``in_process``: processes kept waiting with torch imported, to take a failed rank's place."""
    fresh_processes: bool = False
    """With ``in_process``: after a failure every local rank gets a new process (a warm spare while one waits)
    instead of the survivors re-entering their function: a whole-process restart without re-importing torch."""
    module: bool = False
    """torchrun's ``-m``: ``command[0]`` is a module, run as ``python -u -m module args``."""
    no_python: bool = False
    """torchrun's ``--no-python``: run ``command`` itself, not ``python -u command``."""
    rdzv_backend: str = "c10d"
    """``c10d`` (dynamic membership, store in the agent on the endpoint host), ``etcd-v2`` (dynamic
    membership, state in an etcd server) or ``static`` (fixed node count, each node's rank given by
    ``node_rank``)."""
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
    max_log_mb: int = 512
    """Cap of each worker log file (``--max-log-mb``, MiB): at the cap it is copied to ``<file>.1`` and
    truncated, so a stream keeps its newest part and one rotated file; 0: no cap."""
    """Prefix of each worker line on the console; ``${rank}``, ``${local_rank}``, ``${role_name}`` expand."""
    node_lost_timeout_seconds: float = 10.0
    """A peer agent whose beat (``nodes/<node>.beat``, rewritten every second) did not change for this long is
    recorded as lost (``node-lost``); see `trainguard.launch.nodes`."""
    straggler_policy: str | None = None
    """``report``, ``exclude-next-restart`` or ``restart-now`` (docs/stragglers.md); None: the environment's
    ``TRAINGUARD_STRAGGLER_POLICY`` or ``report``."""
    straggler_probe_seconds: float | None = None
    """Seconds between straggler checks and probes (0: off); None: the environment's or 10."""
    telemetry_seconds: float | None = None
    """Seconds between telemetry samples (0: off); None: the environment's or 10."""
    signals_to_handle: str | None = None
    """torchrun's ``--signals-to-handle``: comma-separated signal names the agent forwards to the workers
    (None: torch's default, SIGTERM,SIGINT,SIGHUP,SIGQUIT). Applied by `supervise` for its run only."""
    drain: DrainSettings | None = None
    """``--drain-bad-nodes``: drain nodes in the scheduler on node-level verdicts (`trainguard.health.drain`);
    None: never touch the scheduler."""

    def __post_init__(self) -> None:
        _check_ranges(self)
        _check_command(self)
        _check_rendezvous(self)
        _check_console(self)
        _check_optional(self)

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
        redirected = std_of(parse_std_spec(self.redirects, "redirects"), local_rank)
        teed = std_of(parse_std_spec(self.tee, "tee"), local_rank)
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


# Whole-number and seconds fields with their allowed ranges (inclusive): torchrun's and trainguard's limits.
_RANGES: dict[str, tuple[float, float]] = {
    "nproc_per_node": (1, 1024),
    "min_nodes": (1, 4096),
    "max_nodes": (1, 4096),
    "max_restarts": (0, 10_000),
    "max_no_progress_attempts": (1, 10_000),
    "monitor_interval_seconds": (0.01, 60),
    "last_call_seconds": (1, 86_400),  # as --rdzv-conf's other timeouts
    "join_timeout_seconds": (1, 86_400),
    "stop_grace_seconds": (0, 3600),
    "in_process_timeout_seconds": (1, 3600),
    "warm_spares": (0, 64),
    "node_rank": (0, 4095),
    "rdzv_close_timeout_seconds": (1, 86_400),
    "sdc_check_every": (0, MAX_CHECK_EVERY),
    # Below 2 s, one late beat of a busy agent would count as a lost node.
    "node_lost_timeout_seconds": (2, 3600),
    "max_log_mb": (0, 65_536),
}
_INTEGER_FIELDS = frozenset({"nproc_per_node", "min_nodes", "max_nodes", "max_restarts", "max_no_progress_attempts",
                             "last_call_seconds", "join_timeout_seconds", "node_rank", "rdzv_close_timeout_seconds",
                             "sdc_check_every", "warm_spares", "max_log_mb"})
RDZV_BACKENDS = ("c10d", "etcd-v2", "static")
"""Rendezvous backends the supervisor drives."""


def _check_ranges(cfg: SupervisorConfig) -> None:
    for name, (lo, hi) in _RANGES.items():
        value = getattr(cfg, name)
        integer = name in _INTEGER_FIELDS
        if not in_range(value, lo, hi, integer=integer):
            kind = "a whole number" if integer else "a number"
            raise ValueError(f"{name} must be {kind} from {lo:g} to {hi:g}, got {value!r}")
    if cfg.min_nodes > cfg.max_nodes:
        raise ValueError(f"min_nodes must not exceed max_nodes ({cfg.max_nodes}), got {cfg.min_nodes}")
    if cfg.target_steps is not None and not in_range(cfg.target_steps, 1, math.inf, integer=True):
        raise ValueError(f"target_steps must be None or a whole number >= 1, got {cfg.target_steps!r}")
    if not isinstance(cfg.watchdog, WatchdogConfig):
        raise ValueError(f"watchdog must be a WatchdogConfig, got {type(cfg.watchdog).__name__}")


def _check_command(cfg: SupervisorConfig) -> None:
    if not isinstance(cfg.command, tuple) or not cfg.command or not all(isinstance(c, str) for c in cfg.command):
        raise ValueError(f"command must be a non-empty tuple of strings, got {cfg.command!r}")
    if cfg.module and cfg.no_python:
        raise ValueError("module and no_python cannot both be set (as with torchrun's -m and --no-python)")
    for name in ("run_id", "node_id", "role"):
        try:
            check_name(name.replace("_", " "), getattr(cfg, name))
        except UsageError as exc:
            raise ValueError(f"{name}: {exc}") from None


def _check_rendezvous(cfg: SupervisorConfig) -> None:
    if cfg.rdzv_backend not in RDZV_BACKENDS:
        raise ValueError(f"rdzv_backend must be one of {', '.join(RDZV_BACKENDS)}, got {cfg.rdzv_backend!r}")
    if not isinstance(cfg.rdzv_endpoint, str) or not cfg.rdzv_endpoint.strip():
        raise ValueError("rdzv_endpoint must be host:port (the CLI picks a free local port when none is given)")
    if cfg.rdzv_backend == "static":
        if cfg.min_nodes != cfg.max_nodes:
            raise ValueError("min_nodes must equal max_nodes with the static rendezvous (a fixed node count)")
        if cfg.node_rank >= cfg.max_nodes:
            raise ValueError(f"node_rank must be below max_nodes ({cfg.max_nodes}), got {cfg.node_rank}")


def _check_console(cfg: SupervisorConfig) -> None:
    parse_std_spec(cfg.redirects, "redirects")
    parse_std_spec(cfg.tee, "tee")
    if not all(in_range(r, 0, math.inf, integer=True) for r in cfg.local_ranks_filter):
        raise ValueError(f"local_ranks_filter must hold local ranks (whole numbers >= 0), "
                         f"got {cfg.local_ranks_filter!r}")


def _check_optional(cfg: SupervisorConfig) -> None:
    if cfg.straggler_policy is not None and cfg.straggler_policy not in STRAGGLER_POLICIES:
        raise ValueError(f"straggler_policy must be None or one of {', '.join(STRAGGLER_POLICIES)}, "
                         f"got {cfg.straggler_policy!r}")
    for name in ("straggler_probe_seconds", "telemetry_seconds"):
        value = getattr(cfg, name)
        if value is not None and not (value == 0 or in_range(value, MIN_SECONDS, MAX_SECONDS)):
            raise ValueError(f"{name} must be None, 0 (off) or from {MIN_SECONDS:g} to {MAX_SECONDS:g} seconds, "
                             f"got {value!r}")
    if cfg.signals_to_handle is not None:
        parse_signals(cfg.signals_to_handle)
    if cfg.drain is not None and not isinstance(cfg.drain, DrainSettings):
        raise ValueError(f"drain must be None or a DrainSettings, got {type(cfg.drain).__name__}")
    if cfg.in_process and cfg.max_nodes > 1:
        raise ValueError("in_process supports one node only (its store lives in this node's agent), "
                         f"got max_nodes {cfg.max_nodes}")
    if cfg.fresh_processes and not cfg.in_process:
        raise ValueError("fresh_processes needs in_process")
    if cfg.warm_spares and (not cfg.in_process or cfg.no_python):
        raise ValueError("warm_spares needs in_process and a Python script or module (not no_python)")


def parse_signals(text: str) -> str:
    """torchrun's ``--signals-to-handle`` list, normalized (``SIGTERM,SIGINT``); `ValueError` naming the
    ``signals_to_handle`` field for an unknown or empty list."""
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    for name in names:
        if not name.startswith("SIG") or not isinstance(getattr(signal, name, None), signal.Signals):
            raise ValueError(f"signals_to_handle: unknown signal {name!r}")
    if not names:
        raise ValueError("signals_to_handle must name at least one signal, e.g. SIGTERM,SIGINT")
    return ",".join(names)


def parse_std_spec(text: str, field: str) -> int | dict[int, int]:
    """torchrun's stream selector: ``0``-``3`` for every local rank (1 stdout, 2 stderr, 3 both), or
    ``LOCAL_RANK:VALUE,...`` per local rank (unlisted ranks get 0). Raises `ValueError` naming ``field``
    (``redirects`` or ``tee``) otherwise."""
    value = text.strip()
    if value in ("0", "1", "2", "3"):
        return int(value)
    out: dict[int, int] = {}
    for part in value.split(","):
        rank, sep, bits = part.strip().partition(":")
        if not sep or not rank.isdigit() or len(rank) > 6 or bits not in ("0", "1", "2", "3") or int(rank) in out:
            raise ValueError(f"{field} must be 0-3 (1 stdout, 2 stderr, 3 both) or LOCAL_RANK:VALUE,... "
                             f"such as 0:3,1:2, got {text!r}")
        out[int(rank)] = int(bits)
    return out


def std_of(spec: int | dict[int, int], local_rank: int) -> int:
    """The stream bits a `parse_std_spec` result gives one local rank."""
    return spec if isinstance(spec, int) else spec.get(local_rank, 0)
