"""Configuration of one node's supervisor (what ``trainguard run`` builds from its options)."""

from __future__ import annotations

import math
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainguard.checkpoint.memory_placement import parse_placement
from trainguard.core.names import check_name
from trainguard.core.numeric import in_range
from trainguard.core.protocol import RunLayout
from trainguard.errors import UsageError
from trainguard.health.drain import DrainSettings
from trainguard.health.fleetdb.location import check_url, is_url, redact
from trainguard.launch.settings import Flag, check_bounds, setting
from trainguard.launch.watchdog import WatchdogConfig
from trainguard.sdc.verdict import DEFAULT_CHECK_EVERY, MAX_CHECK_EVERY
from trainguard.stragglers.watch import MAX_SECONDS, MIN_SECONDS
from trainguard.stragglers.watch import POLICIES as STRAGGLER_POLICIES


@dataclass(frozen=True)
class SupervisorConfig:
    """Everything one node agent needs.

    Each field's section, range and ``trainguard run`` flag are in its `trainguard.launch.settings.setting`:
    the flags, their defaults and the range checks are built from there."""

    command: tuple[str, ...] = setting(section="run")
    """The training script (or module, or program) and its arguments; see ``module`` and ``no_python``."""
    run_dir: Path = setting(section="run")
    run_id: str = setting(section="torchrun")
    """Rendezvous id shared by all nodes of the job."""
    node_id: str = setting(section="nodes")
    """This node's name in events, health checks and chaos (default: the host name)."""
    nproc_per_node: int = setting(1, section="torchrun", bounds=(1, 1024))
    min_nodes: int = setting(1, section="torchrun", bounds=(1, 4096))
    max_nodes: int = setting(1, section="torchrun", bounds=(1, 4096))
    rdzv_endpoint: str = setting("", section="torchrun")
    """``host:port`` of the c10d rendezvous store."""
    max_restarts: int = setting(3, section="recovery", bounds=(0, 10_000), flag=Flag(
        ("--max-restarts",), "restart budget", torchrun=True, default_note="3; torchrun's default is 0", shared=True))
    """Restarts of the workers before the run stops."""
    max_no_progress_attempts: int = setting(3, section="recovery", bounds=(1, 10_000), flag=Flag(
        ("--no-progress-attempts",), "stop after this many failed attempts without a new checkpoint", shared=True))
    """Stop after this many failed attempts in a row that saved no new checkpoint."""
    monitor_interval_seconds: float = setting(0.1, section="torchrun", bounds=(0.01, 60), flag=Flag(
        ("--monitor-interval",), "how often workers are polled", metavar="SECONDS", torchrun=True))
    watchdog: WatchdogConfig = setting(section="detection", factory=WatchdogConfig)
    """Hang detection (its fields have their own flags)."""
    chaos: str = setting("", section="run")
    """The ``--inject`` schedule (already validated)."""
    checkpoint_dir_override: Path | None = setting(None, section="run")
    health_checks: bool = setting(True, section="health", flag=Flag(
        ("--no-health-checks",), "skip node health checks", negate=True))
    gpu_checks: bool = setting(True, section="health")
    """GPU health checks (they skip themselves where NVML or GPUs are absent)."""
    fleet_db: str | None = setting(None, section="health", flag=Flag(
        ("--fleet-db",), "fleet database the lemon check reads: a SQLite file or a postgresql:// URL (its password "
        "from PGPASSWORD or ~/.pgpass, never on the command line; docs/fleetdb.md)", metavar="DB",
        default_note="$TRAINGUARD_DB, else ~/.local/share/trainguard/fleet.db"))
    """Where the fleet history is (None: ``$TRAINGUARD_DB`` or the default file)."""
    target_steps: int | None = setting(None, section="run")
    last_call_seconds: int = setting(2, section="nodes", bounds=(1, 86_400))  # as --rdzv-conf's other timeouts
    """How long the rendezvous waits for more nodes once ``min_nodes`` joined."""
    join_timeout_seconds: int = setting(600, section="torchrun", bounds=(1, 86_400))
    auto_instrument: bool = setting(True, section="workers", flag=Flag(
        ("--no-auto-instrument",), "load nothing of trainguard into the workers (crash detection only for scripts "
        "that never call trainguard.attach())", negate=True))
    """Load trainguard's worker side into every worker at start-up (no script change needed)."""
    logs_dir_override: Path | None = setting(None, section="torchrun")
    """torchrun's ``--log-dir``: where ``attempt-<k>/`` log folders go instead of ``<run dir>/logs``."""
    stop_grace_seconds: float = setting(3.0, section="recovery", bounds=(0, 3600))
    """How long a worker being stopped gets between SIGTERM (after SIGCONT) and SIGKILL."""
    memory_checkpoint_gb: float = setting(0.0, section="recovery", bounds=(0, 1_000_000), flag=Flag(
        ("--memory-checkpoint-gb",), "host memory per node for the checkpoints' memory tier, in GiB: every "
        "trainguard.Checkpointer that sets no memory_gb of its own keeps its newest checkpoint in memory and on a "
        "peer node and restores from there first (0: off; docs/checkpoint.md)", metavar="GB"))
    """Memory tier of the checkpointers of the job's scripts (``TRAINGUARD_MEMORY_CHECKPOINT_GB``); 0: off."""
    memory_checkpoint_placement: str = setting("ring", section="recovery", flag=Flag(
        ("--memory-checkpoint-placement",), "where the memory tier's replicas go, for every trainguard.Checkpointer "
        "that sets no memory_placement of its own: ring (the next node) or clique:K (every other node of its "
        "clique of K consecutive node ids; docs/checkpoint.md)", metavar="{ring,clique:K}"))
    """Replica placement of the memory tier (``TRAINGUARD_MEMORY_CHECKPOINT_PLACEMENT``): ``ring`` or ``clique:K``."""
    in_process: bool = setting(False, section="recovery", flag=Flag(
        ("--in-process",), "after a failure replace only the failed ranks; the others re-enter their "
        "trainguard.worker.inprocess.restartable function (one node; docs/run.md)"))
    """``--in-process``: after a failure only the failed ranks get new processes and the others re-enter their
    `trainguard.worker.inprocess.restartable` function (one node only; docs/run.md)."""
    in_process_timeout_seconds: float = setting(30.0, section="recovery", bounds=(1, 3600), flag=Flag(
        ("--in-process-timeout",), "give an in-process restart this long, then restart every worker",
        metavar="SECONDS"))
    """How long an in-process restart may take to re-form the process group before every worker is restarted."""
    warm_spares: int = setting(-1, section="recovery", bounds=(-1, 64), flag=Flag(
        ("--warm-spares",), "keep N interpreters per node with torch and the script's imports loaded, ready to "
        "take restarted ranks' places (0: off)", metavar="N",
        default_note="one per local rank, within a quarter of free memory at 1 GiB each"))
    """Interpreters kept waiting per node with torch and the script's top-level imports loaded, to take the
    places of restarted ranks (whole-process and in-process restarts); -1: one per local rank within a quarter
    of the node's available memory (`trainguard.launch.warm.auto_count`); 0: off."""
    fork_server: bool = setting(True, section="recovery", flag=Flag(
        ("--no-fork-server",), "start every rank as a new interpreter instead of forking it from one that has "
        "loaded torch and the script's imports (restarts then use warm spares)", negate=True))
    """Fork every rank, at the first start and every restart, from one interpreter per node that loaded torch and
    the script's top-level imports (`trainguard.launch.fork_server`); off with ``--warm-spares 0`` too."""
    fresh_processes: bool = setting(False, section="recovery", flag=Flag(
        ("--fresh-processes",), "with --in-process: after a failure give every rank a new process (warm spares "
        "first) instead of re-entering the survivors' function"))
    """With ``in_process``: after a failure every local rank gets a new process (a warm spare while one waits)
    instead of the survivors re-entering their function: a whole-process restart without re-importing torch."""
    module: bool = setting(False, section="torchrun", flag=Flag(
        ("-m", "--module"), "the script is a Python module: python -u -m MODULE args", torchrun=True))
    """torchrun's ``-m``: ``command[0]`` is a module, run as ``python -u -m module args``."""
    no_python: bool = setting(False, section="torchrun", flag=Flag(
        ("--no-python",), "run the command itself, not python -u COMMAND", torchrun=True))
    """torchrun's ``--no-python``: run ``command`` itself, not ``python -u command``."""
    rdzv_backend: str = setting("c10d", section="torchrun")
    """``c10d`` (dynamic membership, store in the agent on the endpoint host), ``etcd-v2`` (dynamic
    membership, state in an etcd server) or ``static`` (fixed node count, each node's rank given by
    ``node_rank``)."""
    node_rank: int = setting(0, section="torchrun", bounds=(0, 4095))
    """This node's rank with the ``static`` backend (torchrun's ``--node-rank``); unused with c10d."""
    rdzv_conf: tuple[tuple[str, str], ...] = setting((), section="torchrun")
    """Extra rendezvous settings handed to torch as they are (``read_timeout``, ``is_host``, ...)."""
    rdzv_close_timeout_seconds: int = setting(10, section="torchrun", bounds=(1, 86_400))
    """How long the rendezvous stays open for late nodes once it is closed (torch's ``close_timeout``)."""
    local_addr: str | None = setting(None, section="torchrun", flag=Flag(
        ("--local-addr",), "address other nodes reach this one at", torchrun=True, default_note="torch's choice"))
    """Address other nodes use to reach this one (torchrun's ``--local-addr``); None: torch's choice."""
    role: str = setting("default", section="torchrun", flag=Flag(
        ("--role",), "worker role name", torchrun=True, default_note="'default'"))
    """Worker role name (torchrun's ``--role``): ``ROLE_NAME`` of the workers."""
    redirects: str = setting("0", section="torchrun", flag=Flag(
        ("-r", "--redirects"), "keep these streams off the console: 0-3 (1 stdout, 2 stderr, 3 both) or "
        "LOCAL_RANK:VALUE,... (log files always get everything)", torchrun=True, default_note=""))
    """torchrun's ``--redirects``: streams (per local rank) kept off the console. Files are always written."""
    tee: str = setting("0", section="torchrun", flag=Flag(
        ("-t", "--tee"), "show these streams on the console even when redirected (same syntax)", torchrun=True,
        default_note=""))
    """torchrun's ``--tee``: streams (per local rank) shown on the console even when redirected."""
    local_ranks_filter: tuple[int, ...] = setting((), section="torchrun")
    """Only these local ranks' output reaches the console (empty: all); files keep every rank."""
    quiet: bool = setting(False, section="workers", flag=Flag(
        ("-q", "--quiet"), "no trainguard progress lines and no worker output on the console (errors still show)",
        shared=True))
    """No worker output on the console (the files are still written)."""
    sdc_check_every: int = setting(DEFAULT_CHECK_EVERY, section="detection", bounds=(0, MAX_CHECK_EVERY))
    """Compare the data-parallel replicas' parameter fingerprints every this many optimizer steps (0: off);
    see docs/sdc.md. Handed to the workers as ``TRAINGUARD_SDC_EVERY``."""
    log_line_prefix: str = setting("[rank${rank}]: ", section="workers")
    """Prefix of each worker line on the console; ``${rank}``, ``${local_rank}``, ``${role_name}`` expand."""
    max_log_mb: int = setting(512, section="workers", bounds=(0, 65_536), flag=Flag(
        ("--max-log-mb",), "cap of each worker log file: at the cap it becomes <file>.1 (one rotated file kept) "
        "and starts over; 0 = no cap", metavar="MIB"))
    """Cap of each worker log file (``--max-log-mb``, MiB): at the cap it is copied to ``<file>.1`` and
    truncated, so a stream keeps its newest part and one rotated file; 0: no cap."""
    # Below 2 s, one late beat of a busy agent would count as a lost node.
    node_lost_timeout_seconds: float = setting(10.0, section="nodes", bounds=(2, 3600), flag=Flag(
        ("--node-lost-timeout",), "a peer agent silent this long is recorded as lost and the others re-form",
        metavar="SECONDS"))
    """A peer agent whose beat (``nodes/<node>.beat``, rewritten every second) did not change for this long is
    recorded as lost (``node-lost``); see `trainguard.launch.nodes`."""
    straggler_policy: str | None = setting(None, section="detection")
    """``report``, ``exclude-next-restart`` or ``restart-now`` (docs/stragglers.md); None: the environment's
    ``TRAINGUARD_STRAGGLER_POLICY`` or ``report``."""
    straggler_probe_seconds: float | None = setting(None, section="detection")
    """Seconds between straggler checks and probes (0: off); None: the environment's or 10."""
    telemetry_seconds: float | None = setting(None, section="detection")
    """Seconds between telemetry samples (0: off); None: the environment's or 10."""
    signals_to_handle: str | None = setting(None, section="torchrun", flag=Flag(
        ("--signals-to-handle",), "signals forwarded to the workers", torchrun=True,
        default_note="SIGTERM,SIGINT,SIGHUP,SIGQUIT"))
    """torchrun's ``--signals-to-handle``: comma-separated signal names the agent forwards to the workers
    (None: torch's default, SIGTERM,SIGINT,SIGHUP,SIGQUIT). Applied by `supervise` for its run only."""
    drain: DrainSettings | None = setting(None, section="health")
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
        """The run directory's paths (`trainguard.core.protocol.RunLayout`)."""
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
        if self.fleet_db:  # written into the run's records: never a password
            out["fleet_db"] = redact(self.fleet_db)
        return out


RDZV_BACKENDS = ("c10d", "etcd-v2", "static")
"""Rendezvous backends the supervisor drives."""


def _check_ranges(cfg: SupervisorConfig) -> None:
    check_bounds(cfg)  # each number field's range, from its `setting`
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
    try:
        parse_placement(cfg.memory_checkpoint_placement)
    except ValueError as exc:
        raise ValueError(f"memory_checkpoint_placement: {exc}") from None
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
    if cfg.fleet_db is not None and is_url(cfg.fleet_db):
        try:
            check_url(cfg.fleet_db)
        except UsageError as exc:
            raise ValueError(str(exc)) from None
    if cfg.drain is not None and not isinstance(cfg.drain, DrainSettings):
        raise ValueError(f"drain must be None or a DrainSettings, got {type(cfg.drain).__name__}")
    if cfg.in_process and cfg.max_nodes > 1:
        raise ValueError("in_process supports one node only (its store lives in this node's agent), "
                         f"got max_nodes {cfg.max_nodes}")
    if cfg.fresh_processes and not cfg.in_process:
        raise ValueError("fresh_processes needs in_process")
    if cfg.warm_spares > 0 and cfg.no_python:
        raise ValueError("warm_spares needs a Python script or module (not no_python)")


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
