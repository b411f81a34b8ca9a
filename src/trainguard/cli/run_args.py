"""Argument definitions of ``trainguard run`` (torchrun's options, trainguard's own, those ``demo`` shares)
and the translation of configuration errors into the flags a user typed."""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from trainguard.errors import UsageError

# torchrun options trainguard does not honour, with why: refused with one line rather than ignored.
REFUSED_OPTIONS = {
    "run_path": "--run-path runs the script inside the agent process; trainguard supervises worker processes",
    "logs_specs": "--logs-specs replaces the log layout that trainguard's evidence reads",
    "numa_binding": "--numa-binding is not supported",
    "virtual_local_rank": "--virtual-local-rank is not supported",
    "duplicate_stdout_filters": "--duplicate-stdout-filters is not supported (worker logs are in the run directory)",
    "duplicate_stderr_filters": "--duplicate-stderr-filters is not supported (worker logs are in the run directory)",
}


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
    parser.add_argument("--straggler-policy", default=None, metavar="POLICY",
                        help="what to do about a slow rank: report (default), exclude-next-restart, or restart-now "
                             "(replace its node by a waiting spare now); docs/stragglers.md")
    parser.add_argument("--straggler-probe-seconds", default=None, metavar="SECONDS",
                        help="seconds between straggler checks and flight-recorder probes; 0 = off (default 10)")
    parser.add_argument("--telemetry-seconds", default=None, metavar="SECONDS",
                        help="seconds between temperature/clock/power samples; 0 = off (default 10)")
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
                          help="c10d, etcd-v2 or static (default: c10d; static when --master-port, --master-addr "
                               "or --node-rank is given without --rdzv-endpoint, as torchrun; etcd-v2 keeps the "
                               "rendezvous in an etcd server, docs/operations.md)")
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
    for dest in REFUSED_OPTIONS:
        flag = "--" + dest.replace("_", "-")
        kind: dict[str, Any] = ({"action": "store_true"} if dest in ("run_path", "virtual_local_rank")
                                else {"default": None})
        torchrun.add_argument(*_names(flag), dest=dest, help=argparse.SUPPRESS, **kind)

    own = parser.add_argument_group("trainguard options")
    own.add_argument("--node-id", default=None, help="this node's name (default: host name)")
    own.add_argument("--rdzv-last-call", type=int, default=None, metavar="SECONDS",
                     help="with MIN:MAX nodes, how long to wait for more nodes once MIN joined (default 2)")
    own.add_argument("--no-health-checks", action="store_true", help="skip node health checks")
    own.add_argument("--node-lost-timeout", type=float, default=10.0, metavar="SECONDS",
                     help="a peer agent silent this long is recorded as lost and the others re-form (default 10)")
    own.add_argument("--metrics-port", type=_metrics_listen, default=None, metavar="[ADDR:]PORT",
                     help="serve Prometheus metrics of the run at /metrics (127.0.0.1 unless ADDR; docs/dashboard.md)")
    own.add_argument("--max-log-mb", type=int, default=512, metavar="MIB",
                     help="cap of each worker log file: at the cap it becomes <file>.1 (one rotated file kept) "
                          "and starts over; 0 = no cap (default 512)")
    own.add_argument("--no-auto-instrument", action="store_true",
                     help="load nothing of trainguard into the workers (crash detection only for scripts "
                          "that never call trainguard.attach())")
    own.add_argument("--no-framework-adapters", action="store_true",
                     help="no Hugging Face / Lightning Trainer callbacks in the workers (TRAINGUARD_FRAMEWORKS=0): "
                          "steps come from the optimizer hooks alone")
    own.add_argument("--in-process", action="store_true",
                     help="after a failure replace only the failed ranks; the others re-enter their "
                          "trainguard.worker.inprocess.restartable function (one node; docs/run.md)")
    own.add_argument("--in-process-timeout", type=float, default=30.0, metavar="SECONDS",
                     help="give an in-process restart this long, then restart every worker (default 30)")
    own.add_argument("--warm-spares", type=int, default=0, metavar="N",
                     help="with --in-process: keep N processes with torch imported to take failed ranks' places")
    own.add_argument("--fresh-processes", action="store_true",
                     help="with --in-process: after a failure give every rank a new process (warm spares first) "
                          "instead of re-entering the survivors' function")
    from trainguard.health.drain import add_run_arguments as add_drain_arguments

    add_drain_arguments(own)
    add_common(own)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="script.py [args] (or -- script.py [args]; a module with -m, a program with --no-python)")


def _metrics_listen(text: str) -> tuple[str, int]:
    from trainguard.web.metrics import parse_listen

    return parse_listen(text)


# Which option sets which `SupervisorConfig`/`WatchdogConfig` field: a config's `ValueError` names the field,
# the user sees the flag.
FIELD_FLAGS = {
    "nproc_per_node": "--nproc-per-node", "min_nodes": "--nnodes", "max_nodes": "--nnodes",
    "max_restarts": "--max-restarts", "max_no_progress_attempts": "--no-progress-attempts",
    "monitor_interval_seconds": "--monitor-interval", "last_call_seconds": "--rdzv-last-call",
    "in_process": "--in-process", "in_process_timeout_seconds": "--in-process-timeout",
    "warm_spares": "--warm-spares", "fresh_processes": "--fresh-processes",
    "join_timeout_seconds": "--rdzv-conf join_timeout", "stop_grace_seconds": "--stop-grace",
    "node_rank": "--node-rank", "rdzv_close_timeout_seconds": "--rdzv-conf close_timeout",
    "sdc_check_every": "--sdc-check-every", "node_lost_timeout_seconds": "--node-lost-timeout",
    "max_log_mb": "--max-log-mb",
    "redirects": "--redirects", "tee": "--tee", "local_ranks_filter": "--local-ranks-filter",
    "straggler_policy": "--straggler-policy", "straggler_probe_seconds": "--straggler-probe-seconds",
    "telemetry_seconds": "--telemetry-seconds", "signals_to_handle": "--signals-to-handle",
    "run_id": "--rdzv-id", "node_id": "--node-id", "role": "--role", "module": "--module",
    "no_python": "--no-python", "rdzv_backend": "--rdzv-backend", "rdzv_endpoint": "--rdzv-endpoint",
    "target_steps": "--steps", "floor_seconds": "--hang-floor", "multiplier": "--hang-multiplier",
    "first_step_allowance_seconds": "--first-step-allowance",
    "checkpoint_allowance_seconds": "--checkpoint-allowance",
}
# Field names with an underscore cannot occur in prose, so they are replaced anywhere; a one-word field
# only where a message starts with it.
_ANYWHERE = re.compile(r"\b(" + "|".join(sorted((f for f in FIELD_FLAGS if "_" in f), key=len, reverse=True)) + r")\b")
_LEADING = re.compile(r"^(" + "|".join(f for f in FIELD_FLAGS if "_" not in f) + r")\b")


def usage_error(exc: ValueError) -> UsageError:
    """A configuration's `ValueError` as the usage error (exit 2) the CLI prints, in terms of its flags."""
    text = str(exc).splitlines()[0] if str(exc).strip() else exc.__class__.__name__
    text = _LEADING.sub(lambda m: FIELD_FLAGS[m.group(1)], text)
    return UsageError(_ANYWHERE.sub(lambda m: FIELD_FLAGS[m.group(1)], text))
