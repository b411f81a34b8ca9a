"""Argument definitions of ``trainguard run`` (torchrun's options, trainguard's own, those ``demo`` shares)
and the translation of configuration errors into the flags a user typed."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from typing import Any

from trainguard.errors import UsageError
from trainguard.launch.settings import SECTIONS, add_flags, field_flags

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
    """Options shared with ``trainguard demo`` (no sections: demo has few options)."""
    from trainguard.launch import SupervisorConfig, WatchdogConfig

    _run_options(parser, shared=True)
    add_flags(parser, SupervisorConfig, shared=True)
    add_flags(parser, WatchdogConfig, shared=True)
    _recovery_options(parser)
    _detection_options(parser)


def _run_options(group: argparse.ArgumentParser | argparse._ArgumentGroup, shared: bool = False) -> None:
    group.add_argument("--run-dir", help="run directory (default: runs/<fresh run id>)")
    group.add_argument("--inject", default=None, metavar="SPEC",
                       help="chaos schedule, e.g. 'crash@step=30,rank=1;hang@step=60,rank=2' (docs/run.md)")
    group.add_argument("--json", action="store_true", help="print one JSON result on stdout")
    if not shared:
        group.add_argument("--metrics-port", type=_metrics_listen, default=None, metavar="[ADDR:]PORT",
                           help="serve Prometheus metrics of the run at /metrics (127.0.0.1 unless ADDR; "
                                "docs/dashboard.md)")


def _recovery_options(group: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    # Default None: --shutdown-timeout sets the same field.
    group.add_argument("--stop-grace", type=float, default=None, metavar="SECONDS",
                       help="time a stopped worker gets between SIGTERM and SIGKILL (default 3)")


def _detection_options(group: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    # Default None: demo's default differs, and None lets the environment decide (docs/stragglers.md).
    group.add_argument("--sdc-check-every", dest="sdc_check_every", default=_env("sdc_check_every", None),
                       metavar="K", help="compare the data-parallel replicas' parameters every K optimizer steps "
                                         "to find silent data corruption; 0 = off (default 100, demo 10; "
                                         "docs/sdc.md)")
    group.add_argument("--straggler-policy", default=None, metavar="POLICY",
                       help="what to do about a slow rank: report (default), exclude-next-restart, or restart-now "
                            "(replace its node by a waiting spare now); docs/stragglers.md")
    group.add_argument("--straggler-probe-seconds", default=None, metavar="SECONDS",
                       help="seconds between straggler checks and flight-recorder probes; 0 = off (default 10)")
    group.add_argument("--telemetry-seconds", default=None, metavar="SECONDS",
                       help="seconds between temperature/clock/power samples; 0 = off (default 10)")


def _torchrun_options(torchrun: argparse._ArgumentGroup) -> None:
    """torchrun's options that set no one field as they are (parsed in `trainguard.cli.run`)."""
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
    torchrun.add_argument(*_names("--log-dir"), dest="log_dir", default=_env("log_dir", None),
                          help="worker logs go to LOG_DIR/<run id>/attempt-<k>/ instead of <run dir>/logs")
    torchrun.add_argument(*_names("--local-ranks-filter"), dest="local_ranks_filter",
                          default=_env("local_ranks_filter", ""),
                          help="only these local ranks' output on the console, e.g. 0,1")
    torchrun.add_argument(*_names("--start-method"), dest="start_method", default=_env("start_method", "spawn"),
                          choices=["spawn", "fork", "forkserver"],
                          help="accepted for compatibility: workers are commands, always started as processes")
    torchrun.add_argument(*_names("--shutdown-timeout"), dest="shutdown_timeout", type=int, default=None,
                          help="same as --stop-grace")
    torchrun.add_argument(*_names("--event-log-handler"), dest="event_log_handler",
                          default=_env("event_log_handler", "null"),
                          help="only 'null' (trainguard writes its own events)")
    for dest in REFUSED_OPTIONS:
        flag = "--" + dest.replace("_", "-")
        kind: dict[str, Any] = ({"action": "store_true"} if dest in ("run_path", "virtual_local_rank")
                                else {"default": None})
        torchrun.add_argument(*_names(flag), dest=dest, help=argparse.SUPPRESS, **kind)


def _node_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--node-id", default=None, help="this node's name (default: host name)")
    group.add_argument("--rdzv-last-call", type=int, default=None, metavar="SECONDS",
                       help="with MIN:MAX nodes, how long to wait for more nodes once MIN joined (default 2)")


def _worker_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--no-framework-adapters", action="store_true",
                       help="no Hugging Face / Lightning Trainer callbacks in the workers (TRAINGUARD_FRAMEWORKS=0): "
                            "steps come from the optimizer hooks alone")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option of ``trainguard run``, one help section per `trainguard.launch.settings.SECTIONS` key: the
    flags that set one config field as it is come from the field's `setting`, the rest are defined here."""
    from trainguard.health.drain import add_run_arguments as add_drain_arguments
    from trainguard.launch import SupervisorConfig, WatchdogConfig

    own: dict[str, Callable[[argparse._ArgumentGroup], None]] = {
        "run": _run_options, "torchrun": _torchrun_options, "nodes": _node_options, "recovery": _recovery_options,
        "detection": _detection_options, "workers": _worker_options, "health": add_drain_arguments,
    }
    for key, title in SECTIONS.items():
        group = parser.add_argument_group(title)
        if key in ("torchrun", "nodes"):  # their own options (--nnodes, --node-id) read best first
            own[key](group)
        add_flags(group, SupervisorConfig, key)
        add_flags(group, WatchdogConfig, key)
        if key not in ("torchrun", "nodes"):
            own[key](group)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="script.py [args] (or -- script.py [args]; a module with -m, a program with --no-python)")


def _metrics_listen(text: str) -> tuple[str, int]:
    from trainguard.web.metrics import parse_listen

    return parse_listen(text)


# Which option sets which `SupervisorConfig`/`WatchdogConfig` field: a config's `ValueError` names the field,
# the user sees the flag. The fields with their own flag name it in their `setting`; these are set from options
# that are parsed first (--nnodes, --rdzv-conf, ...).
_PARSED_FIELD_FLAGS = {
    "nproc_per_node": "--nproc-per-node", "min_nodes": "--nnodes", "max_nodes": "--nnodes",
    "last_call_seconds": "--rdzv-last-call", "join_timeout_seconds": "--rdzv-conf join_timeout",
    "stop_grace_seconds": "--stop-grace", "node_rank": "--node-rank",
    "rdzv_close_timeout_seconds": "--rdzv-conf close_timeout", "sdc_check_every": "--sdc-check-every",
    "local_ranks_filter": "--local-ranks-filter", "straggler_policy": "--straggler-policy",
    "straggler_probe_seconds": "--straggler-probe-seconds", "telemetry_seconds": "--telemetry-seconds",
    "run_id": "--rdzv-id", "node_id": "--node-id", "rdzv_backend": "--rdzv-backend",
    "rdzv_endpoint": "--rdzv-endpoint", "target_steps": "--steps",
}


def _field_flags() -> dict[str, str]:
    from trainguard.launch import SupervisorConfig, WatchdogConfig

    return {**field_flags(SupervisorConfig, WatchdogConfig), **_PARSED_FIELD_FLAGS}


FIELD_FLAGS = _field_flags()
# Field names with an underscore cannot occur in prose, so they are replaced anywhere; a one-word field
# only where a message starts with it.
_ANYWHERE = re.compile(r"\b(" + "|".join(sorted((f for f in FIELD_FLAGS if "_" in f), key=len, reverse=True)) + r")\b")
_LEADING = re.compile(r"^(" + "|".join(f for f in FIELD_FLAGS if "_" not in f) + r")\b")


def usage_error(exc: ValueError) -> UsageError:
    """A configuration's `ValueError` as the usage error (exit 2) the CLI prints, in terms of its flags."""
    text = str(exc).splitlines()[0] if str(exc).strip() else exc.__class__.__name__
    text = _LEADING.sub(lambda m: FIELD_FLAGS[m.group(1)], text)
    return UsageError(_ANYWHERE.sub(lambda m: FIELD_FLAGS[m.group(1)], text))
