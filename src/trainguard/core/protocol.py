"""The worker↔agent protocol in one place: the environment a worker gets, the heartbeat record, the run layout.

Both sides import this module (the node agent, the in-rank library, the automatic instrumentation, the
demo's watcher and the tests), so a path or a field name is spelled once. It imports neither torch nor
anything that does: the automatic instrumentation loads it into every worker at start-up.

Times in heartbeats are ``time.monotonic()`` seconds (CLOCK_MONOTONIC, shared by every process of a
Linux host), so a step of the wall clock can neither fake a hang nor hide one. A heartbeat is only ever
compared with the monotonic clock of the node that wrote it.
"""

from __future__ import annotations

import math
import os
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HEARTBEAT_BYTES = 256
PROCESS_STATE_FILE = "process_state.json"
"""In an attempt's evidence folder: what the agent saw of each live rank when it gathered the evidence
(written by `trainguard.launch.evidence.gather`, read by `trainguard.localize.observed`). Its presence means
the agent's evidence is in: a rank's own dump on its way out must not replace what the decision used."""
"""Fixed size of a heartbeat file: rewritten in place with one ``pwrite`` per update."""
HEARTBEAT_VERSION = "v2"
MEMORY_GB_ENV = "TRAINGUARD_MEMORY_CHECKPOINT_GB"
"""Set by ``trainguard run --memory-checkpoint-gb``: the memory tier (GiB per node) of every
`trainguard.Checkpointer` whose config sets no ``memory_gb`` of its own."""
MEMORY_PLACEMENT_ENV = "TRAINGUARD_MEMORY_CHECKPOINT_PLACEMENT"
"""Set by ``trainguard run --memory-checkpoint-placement``: where the memory tier's replicas go (``ring``,
``clique:K``) for every `trainguard.Checkpointer` whose config sets no ``memory_placement`` of its own."""

SOURCES = ("none", "script", "optimizer")
"""Where a rank's step count comes from: nothing yet, ``trainguard.attach()`` steps, optimizer-step hooks."""

_TOKEN = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


# --- run directory layout ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RunLayout:
    """Where everything of one run lives (see docs/architecture.md for the tree)."""

    root: Path
    """The run directory."""
    logs_root: Path | None = None
    """Where ``attempt-<k>/`` log folders go (torchrun's ``--log-dir``); default ``<root>/logs``."""

    def __post_init__(self) -> None:
        # Callers hand in strings and os.PathLike; every member below is a Path.
        object.__setattr__(self, "root", Path(self.root))
        if self.logs_root is not None:
            object.__setattr__(self, "logs_root", Path(self.logs_root))

    @property
    def events_dir(self) -> Path:
        return self.root / "events"

    def event_file(self, writer: str) -> Path:
        """``events/<writer>.jsonl``; writers are ``agent-<node>`` and ``rank-<r>``."""
        return self.events_dir / f"{writer}.jsonl"

    def agent_events(self, node: str) -> Path:
        return self.event_file(f"agent-{node}")

    def rank_events(self, rank: int) -> Path:
        return self.event_file(f"rank-{rank}")

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / "checkpoints"

    def diagnostics_dir(self, attempt: int) -> Path:
        """Evidence of one attempt: flight-recorder dumps, stacks, log tails."""
        return self.root / "diagnostics" / f"attempt-{attempt}"

    @property
    def logs_base(self) -> Path:
        return self.logs_root if self.logs_root is not None else self.root / "logs"

    def logs_dir(self, attempt: int) -> Path:
        return self.logs_base / f"attempt-{attempt}"

    def rank_log(self, attempt: int, rank: int) -> Path:
        """A worker's stderr."""
        return self.logs_dir(attempt) / f"rank-{rank}.log"

    def rank_stdout(self, attempt: int, rank: int) -> Path:
        return self.logs_dir(attempt) / f"rank-{rank}.stdout.log"

    def rank_error_file(self, attempt: int, rank: int) -> Path:
        """torchelastic's ``TORCHELASTIC_ERROR_FILE`` of a worker (``@record`` tracebacks)."""
        return self.logs_dir(attempt) / f"rank-{rank}.error.json"

    @property
    def heartbeats_root(self) -> Path:
        return self.root / "heartbeats"

    def heartbeat_dir(self, node: str, attempt: int) -> Path:
        return self.heartbeats_root / node / f"attempt-{attempt}"

    def heartbeat_file(self, node: str, attempt: int, rank: int) -> Path:
        return self.heartbeat_dir(node, attempt) / heartbeat_name(rank)

    def rank_nodes(self, attempt: int) -> dict[int, str]:
        """Which node ran each rank in ``attempt``, from the heartbeat folders (the run dir may be shared)."""
        out: dict[int, str] = {}
        for path in self.heartbeats_root.glob(f"*/attempt-{attempt}/rank-*"):
            rank = rank_of(path.name, "rank-")
            if rank is not None:
                out[rank] = path.parent.parent.name
        return out

    def stragglers_dir(self, attempt: int) -> Path:
        """Probe evidence of the straggler watch in one attempt (``probe-<n>/`` folders)."""
        return self.root / "diagnostics" / "stragglers" / f"attempt-{attempt}"

    @property
    def chaos_dir(self) -> Path:
        """Markers of fired faults and ``unhealthy-<node>`` flags."""
        return self.root / "chaos"

    def unhealthy_flag(self, node: str) -> Path:
        """Left by an ``unhealthy`` fault: the node's health check fails while it exists."""
        return self.chaos_dir / f"unhealthy-{node}"

    @property
    def nodes_dir(self) -> Path:
        """Agent beats, lost-node markers and the agents' run-folder locks."""
        return self.root / "nodes"

    def node_beat(self, node: str) -> Path:
        return self.nodes_dir / f"{node}.beat"

    def lost_marker(self, node: str) -> Path:
        """Written once by the agent that recorded ``node`` as lost; a lost node that comes back leaves (exit 5)."""
        return self.nodes_dir / f"lost-{node}"

    def node_lock(self, node: str) -> Path:
        """The ``flock`` of the live agent of ``node``: one run per folder (docs/run.md)."""
        return self.nodes_dir / f"{node}.lock"


def heartbeat_name(rank: int) -> str:
    """A rank's heartbeat file name inside ``TRAINGUARD_HEARTBEAT_DIR`` (what a worker knows of the layout)."""
    return f"rank-{rank}"


def fr_trace_name(rank: int) -> str:
    """The flight-recorder pickle a rank's control thread writes into the evidence folder."""
    return f"fr_trace_rank_{rank}.pkl"


def stacks_name(rank: int) -> str:
    """All Python threads' stacks of a rank, written next to its flight-recorder pickle."""
    return f"stacks_rank_{rank}.txt"


def rank_of(name: str, prefix: str, suffix: str = "") -> int | None:
    """The rank in a file name such as ``rank-3`` or ``fr_trace_rank_3.pkl``; None if it is not one."""
    if not name.startswith(prefix) or not name.endswith(suffix):
        return None
    digits = name[len(prefix): len(name) - len(suffix)]
    if not digits.isdigit() or len(digits) > 7 or (len(digits) > 1 and digits[0] == "0"):
        return None
    return int(digits)


# --- worker environment -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerEnv:
    """What the agent tells each worker through ``TRAINGUARD_*`` environment variables."""

    run_dir: Path | None = None
    """The run directory (``TRAINGUARD_RUN_DIR``)."""
    attempt: int = 0
    """Attempt number, 0 for the first start (``TRAINGUARD_ATTEMPT``)."""
    node: str = ""
    """The agent's node id (``TRAINGUARD_NODE``)."""
    heartbeat_dir: Path | None = None
    """Folder of this attempt's heartbeat files (``TRAINGUARD_HEARTBEAT_DIR``)."""
    evidence_dir: Path | None = None
    """Where the control thread writes dumps and stacks; fixed at worker start, never taken from a
    request (``TRAINGUARD_EVIDENCE_DIR``)."""
    agent_pid: int | None = None
    """The only process allowed on the control socket (``TRAINGUARD_AGENT_PID``); None = no agent."""
    chaos: str = ""
    """The ``--inject`` schedule (``TRAINGUARD_CHAOS``)."""
    pg_timeout_seconds: float | None = None
    """Process-group timeout the agent asks for (``TRAINGUARD_PG_TIMEOUT_SECONDS``)."""
    auto: bool = True
    """Automatic instrumentation of scripts that never call ``trainguard.attach()`` (``TRAINGUARD_AUTO``)."""
    fr_prewarm: bool = True
    """Pay the first flight-recorder dump's symbolizer cost early (``TRAINGUARD_FR_PREWARM``)."""

    @property
    def under_agent(self) -> bool:
        return self.agent_pid is not None

    def to_environ(self) -> dict[str, str]:
        env = {
            "TRAINGUARD_AGENT": "1" if self.under_agent else "0",
            "TRAINGUARD_ATTEMPT": str(self.attempt),
            "TRAINGUARD_NODE": self.node,
            "TRAINGUARD_CHAOS": self.chaos,
            "TRAINGUARD_AUTO": "1" if self.auto else "0",
            "TRAINGUARD_FR_PREWARM": "1" if self.fr_prewarm else "0",
        }
        for key, path in (("TRAINGUARD_RUN_DIR", self.run_dir), ("TRAINGUARD_HEARTBEAT_DIR", self.heartbeat_dir),
                          ("TRAINGUARD_EVIDENCE_DIR", self.evidence_dir)):
            if path is not None:
                env[key] = str(path)
        if self.agent_pid is not None:
            env["TRAINGUARD_AGENT_PID"] = str(self.agent_pid)
        if self.pg_timeout_seconds is not None:
            env["TRAINGUARD_PG_TIMEOUT_SECONDS"] = repr(float(self.pg_timeout_seconds))
        return env

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        """Read the environment; a malformed value falls back to its default (the worker must never fail)."""
        env = os.environ if environ is None else environ

        def path(key: str) -> Path | None:
            value = env.get(key, "")
            return Path(value) if value else None

        def integer(key: str) -> int | None:
            value = env.get(key, "")
            return int(value) if value.isdigit() and len(value) < 12 else None

        timeout: float | None = None
        try:
            timeout = float(env["TRAINGUARD_PG_TIMEOUT_SECONDS"])
            if not (math.isfinite(timeout) and timeout > 0):
                timeout = None
        except (KeyError, ValueError):
            pass
        attempt = integer("TRAINGUARD_ATTEMPT")
        if attempt is None:
            attempt = integer("TORCHELASTIC_RESTART_COUNT") or 0
        agent_pid = integer("TRAINGUARD_AGENT_PID")
        return cls(
            run_dir=path("TRAINGUARD_RUN_DIR"),
            attempt=attempt,
            node=env.get("TRAINGUARD_NODE", ""),
            heartbeat_dir=path("TRAINGUARD_HEARTBEAT_DIR"),
            evidence_dir=path("TRAINGUARD_EVIDENCE_DIR"),
            agent_pid=agent_pid if agent_pid else None,
            chaos=env.get("TRAINGUARD_CHAOS", ""),
            pg_timeout_seconds=timeout,
            auto=env.get("TRAINGUARD_AUTO", "1") != "0",
            fr_prewarm=env.get("TRAINGUARD_FR_PREWARM", "1") != "0",
        )


# --- heartbeat ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Heartbeat:
    """A rank's progress as its heartbeat file says it, rewritten in place by the rank.

    All ``*_mono`` fields are ``time.monotonic()`` of the writing host.
    """

    step: int
    """Last completed step (0 before the first)."""
    steps_done: int
    """Steps completed in this attempt."""
    progress_mono: float
    """When the last step ended (the attempt's start of the rank before its first step)."""
    duration_seconds: float
    """Length of the last completed step."""
    phase: str
    """``init``, ``step``, ``idle``, ``checkpoint``, ``save`` (another save in progress), ``done`` or a script's own
    phase name."""
    phase_start_mono: float
    source: str = "none"
    """One of `SOURCES`: what counts this rank's steps."""
    collectives_done: int = 0
    """Collectives completed so far (all groups), when the rank's flight recorder is read."""
    pending_since_mono: float = 0.0
    """Since when a collective has been enqueued and not completed (0: none pending)."""
    alive_mono: float = 0.0
    """Last time the rank's background thread wrote; stale when the process is stopped or frozen."""

    def encode(self) -> bytes:
        for name in (self.phase, self.source):
            if not _TOKEN.match(name):
                raise ValueError(f"heartbeat token {name!r} is not a plain word")
        body = (
            f"{HEARTBEAT_VERSION} step={self.step} n={self.steps_done} t={self.progress_mono:.6f} "
            f"dur={self.duration_seconds:.6f} phase={self.phase} pt={self.phase_start_mono:.6f} "
            f"src={self.source} c={self.collectives_done} pend={self.pending_since_mono:.6f} "
            f"alive={self.alive_mono:.6f}"
        ).encode()
        # A reader racing the in-place rewrite may see old and new bytes mixed; the checksum rejects that.
        line = body + b" k=%08x\n" % zlib.crc32(body)
        if len(line) > HEARTBEAT_BYTES:
            raise ValueError("heartbeat longer than its fixed size")
        return line.ljust(HEARTBEAT_BYTES, b" ")

    @classmethod
    def decode(cls, data: bytes) -> Heartbeat | None:
        """Parse a heartbeat file's bytes; None when empty, torn, of another version or out of range."""
        raw = data[:HEARTBEAT_BYTES].rstrip(b"\0 \n")
        body, sep, crc = raw.rpartition(b" k=")
        if sep:  # written with a checksum (every writer of this module): verify it
            if len(crc) != 8 or crc.strip(b"0123456789abcdef") or int(crc, 16) != zlib.crc32(body):
                return None
            raw = body
        text = raw.decode("ascii", errors="replace")
        words = text.split()
        if not words or words[0] != HEARTBEAT_VERSION:
            return None
        parts = dict(p.split("=", 1) for p in words[1:] if "=" in p)
        try:
            beat = cls(
                step=int(parts["step"]), steps_done=int(parts["n"]), progress_mono=float(parts["t"]),
                duration_seconds=float(parts["dur"]), phase=parts["phase"], phase_start_mono=float(parts["pt"]),
                source=parts.get("src", "none"), collectives_done=int(parts.get("c", "0")),
                pending_since_mono=float(parts.get("pend", "0")), alive_mono=float(parts.get("alive", "0")),
            )
        except (KeyError, ValueError):
            return None
        floats = (beat.progress_mono, beat.duration_seconds, beat.phase_start_mono, beat.pending_since_mono,
                  beat.alive_mono)
        if not all(math.isfinite(x) and x >= 0 for x in floats) or min(beat.step, beat.steps_done) < 0:
            return None
        if beat.source not in SOURCES or not _TOKEN.match(beat.phase):
            return None
        return beat

    @property
    def has_progress_signal(self) -> bool:
        """Whether anything counts this rank's steps (a script with no signal is watched for crashes only)."""
        return self.source != "none"


def read_heartbeat(path: Path) -> Heartbeat | None:
    """The heartbeat in ``path``; None if it is missing, unreadable or not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not _is_regular(fd):
            return None
        return Heartbeat.decode(os.pread(fd, HEARTBEAT_BYTES, 0))
    except OSError:
        return None
    finally:
        os.close(fd)


def _is_regular(fd: int) -> bool:
    import stat

    return stat.S_ISREG(os.fstat(fd).st_mode)


# --- in-process restart -------------------------------------------------------------------------------

INPROCESS_STORE_ENV = "TRAINGUARD_INPROCESS_STORE"
"""``host:port`` of the agent's in-process store; set only when the agent runs with ``--in-process``."""
INPROCESS_TIMEOUT_ENV = "TRAINGUARD_INPROCESS_TIMEOUT_SECONDS"
"""How long a surviving rank waits for the agent's next attempt before it gives up and exits."""
INPROCESS_ATTEMPT_ENV = ("TRAINGUARD_ATTEMPT", "TRAINGUARD_HEARTBEAT_DIR", "TRAINGUARD_EVIDENCE_DIR")
"""The variables that change from one attempt to the next; survivors of an in-process restart take the new
attempt's values from the store (``env`` key) since the agent cannot change a running process's environment."""


def inprocess_key(attempt: int, name: str) -> str:
    """A key of the in-process store: ``next`` (the attempt that follows this one, set by the agent),
    ``env`` (JSON of `INPROCESS_ATTEMPT_ENV` for this attempt), ``joined`` (ranks that formed this attempt's
    process group), ``pg/`` (prefix of the process group's own keys)."""
    return f"trainguard/inprocess/attempt-{attempt}/{name}"

# --- warm spares ------------------------------------------------------------------------------------------

SPARE_SKIP_ENV = "TRAINGUARD_SPARE_SKIP"
"""Comma-separated top-level imports of the script a warm spare leaves for after its takeover: the agent's pool
learned from an earlier spare that loading them ahead reads a rank's variables."""
FORK_RESERVE_ENV = "TRAINGUARD_ENV_RESERVE"
"""A variable of blanks in the fork server's start-up environment: the room where each forked rank writes its own
variables, so that ``/proc/<pid>/environ`` shows them (`trainguard.worker.zygote.show_environment`)."""
FORK_RESERVE_BYTES = 32 * 1024
SPARE_UNFIT = "unfit for a warm start:"
"""Starts a spare's log line that tells the agent why it cannot take a rank warm (``...; skip=a,b``)."""
