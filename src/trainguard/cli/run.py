"""``trainguard run``: supervise a training job on this node (crash and hang detection, evidence, restarts).

It takes torchrun's options with torchrun's spellings and meanings, so ``torchrun ARGS`` becomes
``trainguard run ARGS``; trainguard's own options come on top. Every argument is checked before
anything is created on disk.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.errors import InputError, StorageError, UsageError

HELP = "supervise a training job: launch, watch, gather evidence, restart from the last checkpoint"

log = logging.getLogger(__name__)

DEFAULT_C10D_PORT = 29400
"""torch's c10d rendezvous port when an endpoint names none."""
DEFAULT_MASTER_PORT = 29500
"""torchrun's ``--master-port`` default (static rendezvous)."""

# torchrun options trainguard does not honour, with why: refused with one line rather than ignored.
_REFUSED = {
    "run_path": "--run-path runs the script inside the agent process; trainguard supervises worker processes",
    "logs_specs": "--logs-specs replaces the log layout that trainguard's evidence reads",
    "numa_binding": "--numa-binding is not supported",
    "virtual_local_rank": "--virtual-local-rank is not supported",
    "duplicate_stdout_filters": "--duplicate-stdout-filters is not supported (worker logs are in the run directory)",
    "duplicate_stderr_filters": "--duplicate-stderr-filters is not supported (worker logs are in the run directory)",
}

# --rdzv-conf keys torch's c10d and static rendezvous read, and the kind of value each takes.
_RDZV_CONF_KEYS = {
    "join_timeout": "int", "last_call_timeout": "int", "close_timeout": "int", "read_timeout": "int",
    "timeout": "int", "keep_alive_interval": "int", "keep_alive_max_attempt": "int", "is_host": "bool",
    "store_type": "tcp",
}
_HOST = re.compile(r"[A-Za-z0-9_.-]{1,253}")
_IPV6 = re.compile(r"[0-9A-Fa-f:.%A-Za-z]{2,64}")


def _names(flag: str) -> list[str]:
    """A torchrun option's spellings: ``--nproc-per-node`` and ``--nproc_per_node``."""
    under = flag.replace("-", "_").replace("__", "--", 1)
    return [flag] if under == flag else [flag, under]


def _env(dest: str, default: Any) -> Any:
    """torchrun reads every launcher option from ``PET_<OPTION>`` when it is not on the command line."""
    return os.environ.get(f"PET_{dest.upper()}", default)


def _env_flag(dest: str) -> bool:
    return os.environ.get(f"PET_{dest.upper()}", "0").lower() in ("1", "true", "yes")


def add_common(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Options shared with ``trainguard demo``."""
    parser.add_argument("--run-dir", help="run directory (default: runs/<fresh run id>)")
    parser.add_argument("--inject", default=None, metavar="SPEC",
                        help="chaos schedule, e.g. 'crash@step=30,rank=1;hang@step=60,rank=2' (docs/run.md)")
    parser.add_argument(*_names("--max-restarts"), dest="max_restarts", type=int, default=_env("max_restarts", 3),
                        help="restart budget (default 3; torchrun's default is 0)")
    parser.add_argument("--hang-floor", type=float, default=4.0, metavar="SECONDS",
                        help="never call a hang sooner than this after the last step (default 4)")
    parser.add_argument("--hang-multiplier", type=float, default=3.0,
                        help="hang timeout = this x median step time, if above the floor (default 3)")
    parser.add_argument("--first-step-allowance", type=float, default=120.0, metavar="SECONDS",
                        help="time allowed from a (re)start to the first step (default 120)")
    parser.add_argument("--checkpoint-allowance", type=float, default=120.0, metavar="SECONDS",
                        help="time allowed inside a checkpoint phase (default 120)")
    parser.add_argument("--no-progress-attempts", type=int, default=3,
                        help="stop after this many failed attempts without a new checkpoint (default 3)")
    parser.add_argument("--stop-grace", type=float, default=None, metavar="SECONDS",
                        help="time a stopped worker gets between SIGTERM and SIGKILL (default 3)")
    parser.add_argument("--sdc-check-every", dest="sdc_check_every", default=_env("sdc_check_every", None),
                        metavar="K", help="compare the data-parallel replicas' parameters every K optimizer steps "
                                          "to find silent data corruption; 0 = off (default 100, demo 10; "
                                          "docs/sdc.md)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no trainguard progress lines and no worker output on the console (errors still show)")
    parser.add_argument("--json", action="store_true", help="print one JSON result on stdout")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    torchrun = parser.add_argument_group("torchrun options (same spellings and meanings)")
    torchrun.add_argument("--nnodes", default=_env("nnodes", "1"), help="nodes, N or MIN:MAX (default 1)")
    torchrun.add_argument(*_names("--nproc-per-node"), dest="nproc_per_node", default=_env("nproc_per_node", "1"),
                          help="ranks on this node: a number, or auto, cpu, gpu, xpu (default 1)")
    torchrun.add_argument("--standalone", action="store_true", default=_env_flag("standalone"),
                          help="single node: a c10d rendezvous on a free local port (rendezvous options ignored)")
    torchrun.add_argument(*_names("--rdzv-backend"), dest="rdzv_backend", default=_env("rdzv_backend", None),
                          help="c10d or static (default: c10d; static when --master-port, --master-addr or "
                               "--node-rank is given without --rdzv-endpoint, as torchrun)")
    torchrun.add_argument(*_names("--rdzv-endpoint"), dest="rdzv_endpoint", default=_env("rdzv_endpoint", ""),
                          help="host[:port] of the rendezvous (default: a free port on 127.0.0.1, single node only)")
    torchrun.add_argument(*_names("--rdzv-id"), dest="rdzv_id", default=_env("rdzv_id", None),
                          help="job id shared by all nodes (default: the run dir's name; 'none' with several "
                               "nodes and no --run-dir, as torchrun)")
    torchrun.add_argument(*_names("--rdzv-conf"), dest="rdzv_conf", default=_env("rdzv_conf", ""),
                          metavar="KEY=VALUE,...",
                          help="rendezvous settings: join_timeout, last_call_timeout, close_timeout, read_timeout, "
                               "timeout, keep_alive_interval, keep_alive_max_attempt, is_host")
    torchrun.add_argument(*_names("--master-addr"), dest="master_addr", default=_env("master_addr", None),
                          help="static rendezvous: address of node rank 0 (default 127.0.0.1)")
    torchrun.add_argument(*_names("--master-port"), dest="master_port", default=_env("master_port", None),
                          help="static rendezvous: port on node rank 0 (default 29500)")
    torchrun.add_argument(*_names("--node-rank"), dest="node_rank", default=_env("node_rank", None),
                          help="static rendezvous: this node's rank (default 0)")
    torchrun.add_argument(*_names("--local-addr"), dest="local_addr", default=_env("local_addr", None),
                          help="address other nodes reach this one at (default: torch's choice)")
    torchrun.add_argument(*_names("--monitor-interval"), dest="monitor_interval", type=float,
                          default=_env("monitor_interval", 0.1), metavar="SECONDS",
                          help="how often workers are polled (default 0.1)")
    torchrun.add_argument("-m", "--module", action="store_true", default=_env_flag("module"),
                          help="the script is a Python module: python -u -m MODULE args")
    torchrun.add_argument(*_names("--no-python"), dest="no_python", action="store_true",
                          default=_env_flag("no_python"), help="run the command itself, not python -u COMMAND")
    torchrun.add_argument(*_names("--log-dir"), dest="log_dir", default=_env("log_dir", None),
                          help="worker logs go to LOG_DIR/<run id>/attempt-<k>/ instead of <run dir>/logs")
    torchrun.add_argument("-r", "--redirects", default=_env("redirects", "0"),
                          help="keep these streams off the console: 0-3 (1 stdout, 2 stderr, 3 both) or "
                               "LOCAL_RANK:VALUE,... (log files always get everything)")
    torchrun.add_argument("-t", "--tee", default=_env("tee", "0"),
                          help="show these streams on the console even when redirected (same syntax)")
    torchrun.add_argument(*_names("--local-ranks-filter"), dest="local_ranks_filter",
                          default=_env("local_ranks_filter", ""),
                          help="only these local ranks' output on the console, e.g. 0,1")
    torchrun.add_argument("--role", default=_env("role", "default"), help="worker role name (default 'default')")
    torchrun.add_argument(*_names("--start-method"), dest="start_method", default=_env("start_method", "spawn"),
                          choices=["spawn", "fork", "forkserver"],
                          help="accepted for compatibility: workers are commands, always started as processes")
    torchrun.add_argument(*_names("--shutdown-timeout"), dest="shutdown_timeout", type=int, default=None,
                          help="same as --stop-grace")
    torchrun.add_argument(*_names("--signals-to-handle"), dest="signals_to_handle",
                          default=_env("signals_to_handle", None),
                          help="signals forwarded to the workers (default SIGTERM,SIGINT,SIGHUP,SIGQUIT)")
    torchrun.add_argument(*_names("--event-log-handler"), dest="event_log_handler",
                          default=_env("event_log_handler", "null"),
                          help="only 'null' (trainguard writes its own events)")
    for dest in _REFUSED:
        flag = "--" + dest.replace("_", "-")
        kind: dict[str, Any] = ({"action": "store_true"} if dest in ("run_path", "virtual_local_rank")
                                else {"default": None})
        torchrun.add_argument(*_names(flag), dest=dest, help=argparse.SUPPRESS, **kind)

    own = parser.add_argument_group("trainguard options")
    own.add_argument("--node-id", default=None, help="this node's name (default: host name)")
    own.add_argument("--rdzv-last-call", type=int, default=None, metavar="SECONDS",
                     help="with MIN:MAX nodes, how long to wait for more nodes once MIN joined (default 2)")
    own.add_argument("--no-health-checks", action="store_true", help="skip node health checks")
    own.add_argument("--metrics-port", type=_metrics_listen, default=None, metavar="[ADDR:]PORT",
                     help="serve Prometheus metrics of the run at /metrics (127.0.0.1 unless ADDR; docs/dashboard.md)")
    own.add_argument("--no-auto-instrument", action="store_true",
                     help="load nothing of trainguard into the workers (crash detection only for scripts "
                          "that never call trainguard.attach())")
    add_common(own)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="script.py [args] (or -- script.py [args]; a module with -m, a program with --no-python)")


def _metrics_listen(text: str) -> tuple[str, int]:
    from trainguard.metrics import parse_listen

    return parse_listen(text)


# --- checks (nothing here touches the disk) -----------------------------------------------------------


def parse_nnodes(text: str) -> tuple[int, int]:
    lo, sep, hi = str(text).partition(":")
    try:
        a, b = int(lo), int(hi if sep else lo)
    except ValueError:
        raise UsageError(f"--nnodes must be N or MIN:MAX, got {text!r}") from None
    if a < 1 or b < a or b > 4096:
        raise UsageError(f"--nnodes must satisfy 1 <= MIN <= MAX <= 4096, got {text!r}")
    return a, b


def parse_nproc(text: str) -> int:
    """torchrun's ``--nproc-per-node``: a number, or ``cpu`` (usable CPUs), ``gpu`` (CUDA devices),
    ``xpu`` (XPU devices), ``auto`` (the accelerator's devices, else usable CPUs)."""
    value = str(text).strip()
    if re.fullmatch(r"[0-9]{1,5}", value):
        n = int(value)
    elif value in ("cpu", "gpu", "xpu", "auto"):
        import torch

        if value == "cpu" or (value == "auto" and not torch.accelerator.is_available()):
            n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        elif value == "gpu":
            if not torch.cuda.is_available():
                raise UsageError("--nproc-per-node gpu: CUDA is not available on this node")
            n = torch.cuda.device_count()
        elif value == "xpu":
            if not torch.xpu.is_available():
                raise UsageError("--nproc-per-node xpu: XPU is not available on this node")
            n = torch.xpu.device_count()
        else:
            n = torch.accelerator.device_count()
    else:
        raise UsageError(f"--nproc-per-node must be a number or one of auto, cpu, gpu, xpu, got {text!r}")
    if not (1 <= n <= 1024):
        raise UsageError(f"--nproc-per-node must be between 1 and 1024, got {n}")
    return n


def parse_endpoint(text: str, flag: str, default_port: int) -> tuple[str, int]:
    """``host[:port]`` or ``[ipv6][:port]``; `UsageError` for anything else."""
    value = text.strip()
    bad = UsageError(f"{flag} must be HOST[:PORT] (IPv6 in brackets: [ADDR]:PORT), got {text!r}")
    if value.startswith("["):
        addr, sep, rest = value[1:].partition("]")
        if not sep or not _IPV6.fullmatch(addr) or ":" not in addr or (rest and not rest.startswith(":")):
            raise bad
        host, port_text = addr, rest[1:] if rest else None
    else:
        host, sep, port_text_ = value.partition(":")
        if ":" in port_text_ or not _HOST.fullmatch(host):
            raise bad
        port_text = port_text_ if sep else None
    if port_text is None:
        return host, default_port
    if not port_text.isdigit() or not (1 <= int(port_text) <= 65535):
        raise UsageError(f"{flag}: the port must be a number from 1 to 65535, got {text!r}")
    return host, int(port_text)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_rdzv_conf(text: str) -> dict[str, str]:
    """torchrun's ``--rdzv-conf KEY=VALUE,...`` restricted to the keys torch's rendezvous reads."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not key or not value:
            raise UsageError(f"--rdzv-conf must be KEY=VALUE,..., got {part!r}")
        kind = _RDZV_CONF_KEYS.get(key)
        if kind is None:
            raise UsageError(f"--rdzv-conf: unknown key {key!r} (known: {', '.join(sorted(_RDZV_CONF_KEYS))})")
        if kind == "int" and not (value.isdigit() and 1 <= int(value) <= 86_400):
            raise UsageError(f"--rdzv-conf: {key} must be a whole number of seconds from 1 to 86400, got {value!r}")
        if kind == "bool" and value.lower() not in ("1", "0", "true", "false", "yes", "no", "y", "n", "on", "off"):
            raise UsageError(f"--rdzv-conf: {key} must be true or false, got {value!r}")
        if kind == "tcp" and value.lower() != "tcp":
            raise UsageError(f"--rdzv-conf: store_type must be tcp (the endpoint is host:port), got {value!r}")
        out[key] = value
    return out


def parse_local_ranks(text: str) -> tuple[int, ...]:
    value = str(text).strip()
    if not value:
        return ()
    parts = [p.strip() for p in value.split(",")]
    if not all(p.isdigit() and len(p) <= 6 for p in parts):
        raise UsageError(f"--local-ranks-filter must be local ranks separated by commas, e.g. 0,1, got {text!r}")
    return tuple(sorted({int(p) for p in parts}))


def _int_arg(value: Any, flag: str, lo: int, hi: int) -> int:
    text = str(value).strip()
    if not re.fullmatch(r"-?[0-9]{1,9}", text) or not (lo <= int(text) <= hi):
        raise UsageError(f"{flag} must be a whole number from {lo} to {hi}, got {value!r}")
    return int(text)


def _signals(text: str) -> str:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if not name.startswith("SIG") or not isinstance(getattr(signal, name, None), signal.Signals):
            raise UsageError(f"--signals-to-handle: unknown signal {name!r}")
    if not names:
        raise UsageError("--signals-to-handle must name at least one signal, e.g. SIGTERM,SIGINT")
    return ",".join(names)


@dataclass(frozen=True)
class Rendezvous:
    """How this node meets the others, decided from torchrun's options."""

    backend: str
    """``c10d`` or ``static``."""
    endpoint: str
    """``host:port``; empty: a free port on 127.0.0.1 is picked when the run starts."""
    node_rank: int
    """This node's rank (static only)."""
    conf: dict[str, str]
    """``--rdzv-conf`` as given (checked)."""


def decide_rendezvous(args: argparse.Namespace, nnodes: tuple[int, int]) -> Rendezvous:
    """torchrun's rules: ``--standalone`` is c10d on a local port; an explicit ``--rdzv-backend`` wins;
    otherwise an endpoint means c10d (trainguard's documented default), and ``--master-*`` or
    ``--node-rank`` without one mean static, as torchrun's default backend does."""
    conf = parse_rdzv_conf(getattr(args, "rdzv_conf", "") or "")
    master_addr, master_port = getattr(args, "master_addr", None), getattr(args, "master_port", None)
    node_rank_text = getattr(args, "node_rank", None)
    endpoint_text = (getattr(args, "rdzv_endpoint", "") or "").strip()
    backend = getattr(args, "rdzv_backend", None)
    if getattr(args, "standalone", False):
        if nnodes[1] > 1:
            raise UsageError("--standalone runs one node: drop --nnodes or use --rdzv-endpoint instead")
        return Rendezvous("c10d", "", 0, conf)
    if backend is not None:
        backend = backend.strip().lower()
        if backend not in ("c10d", "static"):
            raise UsageError(f"--rdzv-backend {backend!r} is not supported: use c10d or static")
    elif not endpoint_text and (master_addr is not None or master_port is not None or node_rank_text is not None):
        backend = "static"
    else:
        backend = "c10d"
    node_rank = _int_arg(node_rank_text, "--node-rank", 0, 4095) if node_rank_text is not None else 0
    if master_port is not None:
        _int_arg(master_port, "--master-port", 1, 65535)
    if master_addr is not None:
        parse_endpoint(master_addr, "--master-addr", 0)
    if backend == "static":
        if nnodes[0] != nnodes[1]:
            raise UsageError("--rdzv-backend static needs a fixed node count (--nnodes N); use c10d for MIN:MAX")
        if node_rank >= nnodes[1]:
            raise UsageError(f"--node-rank must be below --nnodes ({nnodes[1]}), got {node_rank}")
        if endpoint_text:
            host, port = parse_endpoint(endpoint_text, "--rdzv-endpoint", DEFAULT_MASTER_PORT)
        else:
            host, _ = parse_endpoint(master_addr or "127.0.0.1", "--master-addr", 0)
            port = int(master_port) if master_port is not None else DEFAULT_MASTER_PORT
        return Rendezvous("static", _join(host, port), node_rank, conf)
    for flag, given in (("--master-addr", master_addr), ("--master-port", master_port),
                        ("--node-rank", node_rank_text)):
        if given is not None:  # torchrun ignores these with c10d too, and says so
            log.warning("%s is only used by the static rendezvous; ignored with c10d", flag)
    if not endpoint_text:
        if nnodes[1] > 1:
            raise UsageError("--rdzv-endpoint is required with more than one node "
                             "(or --master-addr/--master-port with --rdzv-backend static)")
        return Rendezvous("c10d", "", 0, conf)
    host, port = parse_endpoint(endpoint_text, "--rdzv-endpoint", DEFAULT_C10D_PORT)
    return Rendezvous("c10d", _join(host, port), 0, conf)


def check_supervisor_options(args: argparse.Namespace) -> None:
    """Range checks of the options ``run`` and ``demo`` share."""
    for name in ("max_restarts", "no_progress_attempts"):
        if getattr(args, name) < 0 or getattr(args, name) > 10_000:
            raise UsageError(f"--{name.replace('_', '-')} must be between 0 and 10000")
    for name in ("hang_floor", "hang_multiplier", "first_step_allowance", "checkpoint_allowance"):
        value = getattr(args, name)
        if not (0 < value < 1e6):
            raise UsageError(f"--{name.replace('_', '-')} must be a positive number of seconds")
    grace = getattr(args, "stop_grace", None)
    if grace is not None and not (0 <= grace <= 3600):
        raise UsageError("--stop-grace must be between 0 and 3600 seconds")


def check_schedule(faults: list[Any], world_size_max: int, auto_instrument: bool) -> None:
    """Refuse a chaos schedule that cannot fire in this job (a rank beyond the world size); warn about
    faults that fire only if the script calls ``trainguard.attach()`` (the script is not inspected)."""
    from trainguard import chaos

    if not faults:
        return
    problems = chaos.check_schedule(faults, world_size_max)
    if problems:
        raise UsageError(f"--inject: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    for warning in chaos.schedule_warnings(faults, auto_instrument):
        print(f"trainguard run: warning: --inject: {warning}", file=sys.stderr)


def build_config(args: argparse.Namespace, command: list[str], *, nproc: int, nnodes: tuple[int, int],
                 endpoint: str, node_id: str | None, target_steps: int | None = None,
                 health_checks: bool = True, rendezvous: Rendezvous | None = None,
                 check_input: Callable[[], None] | None = None) -> Any:
    """Check everything, then create the run directory (and ``--log-dir``) and return the config.

    Raises `UsageError` (exit 2) for any bad option before anything exists on disk, `StorageError`
    (exit 4) when the folders cannot be created. ``check_input`` runs after the usage checks and
    before the folders are made (input errors, exit 3, come after usage errors)."""
    from trainguard import chaos
    from trainguard.launch import SupervisorConfig, WatchdogConfig
    from trainguard.launch.config import parse_std_spec
    from trainguard.names import check_name, new_run_id

    check_supervisor_options(args)
    faults = chaos.parse_spec(args.inject)
    last_call = getattr(args, "rdzv_last_call", None)
    if last_call is not None and not (1 <= last_call <= 3600):
        raise UsageError("--rdzv-last-call must be between 1 and 3600 seconds")
    if not (1 <= nproc <= 1024):
        raise UsageError("--nproc-per-node must be between 1 and 1024")
    rdzv = rendezvous or Rendezvous("c10d", endpoint, 0, {})
    if not rdzv.endpoint and nnodes[1] > 1:
        raise UsageError("--rdzv-endpoint is required with more than one node")
    conf = dict(rdzv.conf)
    if "last_call_timeout" in conf and last_call is not None and int(conf["last_call_timeout"]) != last_call:
        raise UsageError("--rdzv-last-call and --rdzv-conf last_call_timeout disagree: give one")
    last_call_seconds = int(conf.pop("last_call_timeout", last_call if last_call is not None else 2))
    join_timeout = int(conf.pop("join_timeout", 600))
    close_timeout = int(conf.pop("close_timeout", 10))
    monitor = float(getattr(args, "monitor_interval", 0.1))
    if not (0.01 <= monitor <= 60):
        raise UsageError("--monitor-interval must be between 0.01 and 60 seconds")
    grace = getattr(args, "stop_grace", None)
    shutdown_timeout = getattr(args, "shutdown_timeout", None)
    if shutdown_timeout is not None:
        if grace is not None and float(shutdown_timeout) != grace:
            raise UsageError("--shutdown-timeout and --stop-grace disagree: give one")
        if not (0 <= shutdown_timeout <= 3600):
            raise UsageError("--shutdown-timeout must be between 0 and 3600 seconds")
        grace = float(shutdown_timeout)
    redirects = str(getattr(args, "redirects", "0"))
    tee = str(getattr(args, "tee", "0"))
    parse_std_spec(redirects, "--redirects")
    parse_std_spec(tee, "--tee")
    ranks_filter = parse_local_ranks(getattr(args, "local_ranks_filter", "") or "")
    role = check_name("role", getattr(args, "role", "default"))
    node = check_name("node id", node_id or socket.gethostname())
    rdzv_id = getattr(args, "rdzv_id", None)
    if rdzv_id is not None:
        check_name("rendezvous id", rdzv_id)
    auto_instrument = not getattr(args, "no_auto_instrument", False)
    check_schedule(faults, nproc * nnodes[1], auto_instrument)
    from trainguard.sdc import DEFAULT_CHECK_EVERY, check_every

    raw_every = getattr(args, "sdc_check_every", None)
    sdc_every = check_every(raw_every) if raw_every is not None else DEFAULT_CHECK_EVERY
    if sdc_every == 0 and any(f.kind == "sdc" for f in faults):
        print("trainguard run: warning: --inject: sdc faults fire but --sdc-check-every 0 turns the check off: "
              "nothing will detect them", file=sys.stderr)

    if args.run_dir:
        run_dir = Path(args.run_dir)
        if not rdzv_id:
            rdzv_id = check_name("rendezvous id (the run dir's name; give --rdzv-id)", run_dir.resolve().name)
    else:
        run_id = new_run_id()
        run_dir = Path("runs") / run_id
        # Every node must agree on the id without talking first: torchrun's fixed default then.
        rdzv_id = rdzv_id or ("none" if nnodes[1] > 1 and rdzv.backend == "c10d" else run_id)
    log_dir = getattr(args, "log_dir", None)
    logs_root = Path(log_dir).resolve() / rdzv_id if log_dir else None

    if check_input is not None:
        check_input()
    # Everything is checked: now the folders.
    from trainguard.rundir import make_dirs

    try:
        make_dirs(run_dir)
        if logs_root is not None:
            make_dirs(logs_root)
    except StorageError as exc:
        raise StorageError(f"cannot create run directory: {exc}") from None
    endpoint = rdzv.endpoint
    if not endpoint:
        from trainguard.launch.supervisor import free_port

        endpoint = f"127.0.0.1:{free_port()}"
    return SupervisorConfig(
        command=tuple(command), run_dir=run_dir.resolve(), run_id=rdzv_id, node_id=node, nproc_per_node=nproc,
        min_nodes=nnodes[0], max_nodes=nnodes[1], rdzv_endpoint=endpoint,
        max_restarts=args.max_restarts, max_no_progress_attempts=max(1, args.no_progress_attempts),
        monitor_interval_seconds=monitor,
        watchdog=WatchdogConfig(floor_seconds=args.hang_floor, multiplier=args.hang_multiplier,
                                first_step_allowance_seconds=args.first_step_allowance,
                                checkpoint_allowance_seconds=args.checkpoint_allowance),
        chaos=chaos.format_spec(faults) if faults else "", health_checks=health_checks,
        target_steps=target_steps, last_call_seconds=last_call_seconds, join_timeout_seconds=join_timeout,
        auto_instrument=auto_instrument, logs_dir_override=logs_root, sdc_check_every=sdc_every,
        **({"stop_grace_seconds": grace} if grace is not None else {}),
        module=bool(getattr(args, "module", False)), no_python=bool(getattr(args, "no_python", False)),
        rdzv_backend=rdzv.backend, node_rank=rdzv.node_rank, rdzv_conf=tuple(sorted(conf.items())),
        rdzv_close_timeout_seconds=close_timeout, local_addr=getattr(args, "local_addr", None), role=role,
        redirects=redirects, tee=tee, local_ranks_filter=ranks_filter, quiet=bool(getattr(args, "quiet", False)),
    )


def split_command(raw: list[str]) -> list[str]:
    """The training command from what follows the options: ``script.py args`` or ``-- script.py args``."""
    command = list(raw)
    if command and command[0] == "--":
        command = command[1:]
    return command


def check_command(command: list[str], *, module: bool, no_python: bool) -> None:
    """Usage errors of the command itself (exit 2)."""
    if not command:
        raise UsageError("no training command: use trainguard run [options] script.py [args] "
                         "(or -- script.py [args])")
    if module and no_python:
        raise UsageError("--module and --no-python cannot be used together (as with torchrun)")
    if module and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", command[0]):
        raise UsageError(f"-m: {command[0]!r} is not a Python module name")


def check_command_exists(command: list[str], *, module: bool, no_python: bool) -> None:
    """The script or program must be there (exit 3); a module is found by the workers' Python."""
    head = command[0]
    if module:
        return
    if no_python:
        if "/" in head:
            if not (Path(head).is_file() and os.access(head, os.X_OK)):
                raise InputError(f"{head}: no such executable program")
        elif shutil.which(head) is None:
            raise InputError(f"{head}: no such program on PATH")
    elif not Path(head).is_file():
        raise InputError(f"{head}: no such training script")


def result_json(cfg: Any, result: Any) -> dict[str, Any]:
    return {
        "run_dir": str(cfg.run_dir),
        "node": cfg.node_id,
        "status": result.status,
        "exit_code": result.exit_code,
        "reason": result.reason,
        "attempts": result.attempts,
        "completed_steps": result.completed_steps,
        "failures": [
            {"attempt": f.attempt, "kind": f.kind, "step": f.step, "ranks": list(f.ranks),
             "detection_latency_seconds": round(f.detection_latency_seconds, 3), "detail": f.detail}
            for f in result.failures
        ],
        "unfired_faults": list(getattr(result, "unfired_faults", ())),
    }


def quiet_torch_logs(verbose: int) -> None:
    """The elastic agent logs every worker failure and restart itself; trainguard's console lines say
    the same with the culprit and evidence, so torch's own lines show only with ``-v``."""
    if verbose == 0:
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
        logging.getLogger("trainguard.launch").setLevel(logging.ERROR)


def run(args: argparse.Namespace) -> int:
    from trainguard.cli.console import Console
    from trainguard.cli.output import print_json

    for dest, why in _REFUSED.items():
        if getattr(args, dest, None) not in (None, False):
            raise UsageError(f"{why}")
    if str(args.event_log_handler).strip() != "null":
        raise UsageError("--event-log-handler: only 'null' is supported (trainguard writes its own event log)")
    command = split_command(args.command)
    check_command(command, module=args.module, no_python=args.no_python)
    nnodes = parse_nnodes(args.nnodes)
    nproc = parse_nproc(args.nproc_per_node)
    rdzv = decide_rendezvous(args, nnodes)
    if args.signals_to_handle is not None:
        signals = _signals(args.signals_to_handle)
    from trainguard import metrics

    metrics_server = metrics.start(args.metrics_port)  # binds now: a taken port fails before anything is on disk
    cfg = build_config(args, command, nproc=nproc, nnodes=nnodes, endpoint=rdzv.endpoint, node_id=args.node_id,
                       health_checks=not args.no_health_checks, rendezvous=rdzv,
                       check_input=lambda: check_command_exists(command, module=args.module,
                                                                no_python=args.no_python))
    if metrics_server is not None:
        metrics_server.follow(cfg.run_dir, cfg.node_id)
    if args.signals_to_handle is not None:
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = signals  # read by torch when it starts the workers
    from trainguard.launch.supervisor import supervise

    quiet_torch_logs(getattr(args, "verbose", 0))
    console = Console(cfg, quiet=args.quiet)
    console.line(f"run dir {cfg.run_dir}, node {cfg.node_id}, {cfg.nproc_per_node} rank(s), "
                 f"rendezvous {cfg.rdzv_backend} {cfg.rdzv_endpoint} id {cfg.run_id}")
    console.start()
    try:
        # With --json, stdout carries exactly one JSON document: the workers' stdout lines that torch
        # tails onto the console go to stderr instead.
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            result = supervise(cfg)
    finally:
        console.stop()
        if metrics_server is not None:
            metrics_server.close()
    console.summary(result)
    if args.json:
        print_json(result_json(cfg, result))
    return int(result.exit_code)
