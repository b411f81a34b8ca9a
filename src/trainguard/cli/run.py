"""``trainguard run``: supervise a training job on this node (crash and hang detection, evidence, restarts).

It takes torchrun's options with torchrun's spellings and meanings, so ``torchrun ARGS`` becomes
``trainguard run ARGS``; trainguard's own options come on top. Every argument is checked before
anything is created on disk. The options are defined in `trainguard.cli.run_args`, the rendezvous
rules in `trainguard.cli.run_rendezvous`; the configs check their own values.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.cli.run_args import REFUSED_OPTIONS, add_arguments, add_common, usage_error
from trainguard.cli.run_rendezvous import Rendezvous, decide_rendezvous
from trainguard.errors import InputError, StorageError, UsageError

__all__ = ["HELP", "add_arguments", "add_common", "build_config", "quiet_torch_logs", "run"]

HELP = "supervise a training job: launch, watch, gather evidence, restart from the last checkpoint"

log = logging.getLogger(__name__)

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


def parse_local_ranks(text: str) -> tuple[int, ...]:
    value = str(text).strip()
    if not value:
        return ()
    parts = [p.strip() for p in value.split(",")]
    if not all(p.isdigit() and len(p) <= 6 for p in parts):
        raise UsageError(f"--local-ranks-filter must be local ranks separated by commas, e.g. 0,1, got {text!r}")
    return tuple(sorted({int(p) for p in parts}))


def _stop_grace(args: argparse.Namespace) -> float | None:
    """``--stop-grace``, or torchrun's ``--shutdown-timeout`` (the same setting; both must agree)."""
    grace: float | None = getattr(args, "stop_grace", None)
    shutdown_timeout = getattr(args, "shutdown_timeout", None)
    if shutdown_timeout is not None:
        if grace is not None and float(shutdown_timeout) != grace:
            raise UsageError("--shutdown-timeout and --stop-grace disagree: give one")
        if not (0 <= shutdown_timeout <= 3600):
            raise UsageError("--shutdown-timeout must be between 0 and 3600 seconds")
        grace = float(shutdown_timeout)
    return grace


def check_schedule(faults: list[Any], world_size_max: int, auto_instrument: bool) -> None:
    """Refuse a chaos schedule that cannot fire in this job (a rank beyond the world size); warn about
    faults that fire only if the script calls ``trainguard.attach()`` (the script is not inspected)."""
    from trainguard.chaos import faults as chaos

    if not faults:
        return
    problems = chaos.check_schedule(faults, world_size_max)
    if problems:
        raise UsageError(f"--inject: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    for warning in chaos.schedule_warnings(faults, auto_instrument):
        print(f"trainguard run: warning: --inject: {warning}", file=sys.stderr)


def _rendezvous_timeouts(rdzv_conf: dict[str, str], last_call: int | None) -> tuple[dict[str, str], int, int, int]:
    """``--rdzv-conf`` without the timeouts the supervisor sets itself: (rest, last call, join, close)."""
    conf = dict(rdzv_conf)
    if "last_call_timeout" in conf and last_call is not None and int(conf["last_call_timeout"]) != last_call:
        raise UsageError("--rdzv-last-call and --rdzv-conf last_call_timeout disagree: give one")
    last_call_seconds = int(conf.pop("last_call_timeout", last_call if last_call is not None else 2))
    return conf, last_call_seconds, int(conf.pop("join_timeout", 600)), int(conf.pop("close_timeout", 10))


def _sdc_every(args: argparse.Namespace, faults: list[Any]) -> int:
    from trainguard.sdc.verdict import DEFAULT_CHECK_EVERY, check_every

    raw_every = getattr(args, "sdc_check_every", None)
    sdc_every = check_every(raw_every) if raw_every is not None else DEFAULT_CHECK_EVERY
    if sdc_every == 0 and any(f.kind == "sdc" for f in faults):
        print("trainguard run: warning: --inject: sdc faults fire but --sdc-check-every 0 turns the check off: "
              "nothing will detect them", file=sys.stderr)
    return sdc_every


def _run_dir_and_id(args: argparse.Namespace, nnodes: tuple[int, int], rdzv: Rendezvous) -> tuple[Path, str]:
    """The run directory (not created yet) and the rendezvous id every node must agree on."""
    from trainguard.core.names import check_name, new_run_id

    rdzv_id = getattr(args, "rdzv_id", None)
    if rdzv_id is not None:
        check_name("rendezvous id", rdzv_id)
    if args.run_dir:
        run_dir = Path(args.run_dir)
        return run_dir, rdzv_id or check_name("rendezvous id (the run dir's name; give --rdzv-id)",
                                              run_dir.resolve().name)
    run_id = new_run_id()
    while (Path("runs") / run_id).exists():  # another process drew the same id in the same second
        run_id = new_run_id()
    # Every node must agree on the id without talking first: torchrun's fixed default then.
    return Path("runs") / run_id, rdzv_id or ("none" if nnodes[1] > 1 and rdzv.backend == "c10d" else run_id)


def _make_folders(run_dir: Path, logs_root: Path | None) -> None:
    from trainguard.core.rundir import make_dirs

    try:
        make_dirs(run_dir)
        if logs_root is not None:
            make_dirs(logs_root)
    except StorageError as exc:
        raise StorageError(f"cannot create run directory: {exc}") from None


def build_config(args: argparse.Namespace, command: list[str], *, nproc: int, nnodes: tuple[int, int],
                 endpoint: str, node_id: str | None, target_steps: int | None = None,
                 health_checks: bool = True, rendezvous: Rendezvous | None = None,
                 check_input: Callable[[], None] | None = None) -> Any:
    """Check everything, then create the run directory (and ``--log-dir``) and return the config.

    Raises `UsageError` (exit 2) for any bad option before anything exists on disk (the configs check
    their own values; their `ValueError` is reworded in terms of the flags), `StorageError` (exit 4)
    when the folders cannot be created. ``check_input`` runs after the usage checks and before the
    folders are made (input errors, exit 3, come after usage errors)."""
    from trainguard.chaos import faults as chaos
    from trainguard.core.names import check_name
    from trainguard.health.drain import settings_from_args as drain_settings
    from trainguard.launch import SupervisorConfig, WatchdogConfig
    from trainguard.launch.settings import flag_values
    from trainguard.launch.supervisor import free_port
    from trainguard.stragglers.watch import check_options

    faults = chaos.parse_spec(args.inject)
    rdzv = rendezvous or Rendezvous("c10d", endpoint, 0, {})
    if not rdzv.endpoint and nnodes[1] > 1:
        raise UsageError("--rdzv-endpoint is required with more than one node")
    conf, last_call_seconds, join_timeout, close_timeout = _rendezvous_timeouts(
        rdzv.conf, getattr(args, "rdzv_last_call", None))
    ranks_filter = parse_local_ranks(getattr(args, "local_ranks_filter", "") or "")
    role = check_name("role", getattr(args, "role", "default"))
    node = check_name("node id", node_id or socket.gethostname())
    auto_instrument = not getattr(args, "no_auto_instrument", False)
    check_schedule(faults, nproc * nnodes[1], auto_instrument)
    straggler_policy, probe_seconds, telemetry_seconds = check_options(
        getattr(args, "straggler_policy", None), getattr(args, "straggler_probe_seconds", None),
        getattr(args, "telemetry_seconds", None))
    sdc_every = _sdc_every(args, faults)
    run_dir, rdzv_id = _run_dir_and_id(args, nnodes, rdzv)
    log_dir = getattr(args, "log_dir", None)
    logs_root = Path(log_dir).resolve() / rdzv_id if log_dir else None
    grace = _stop_grace(args)
    try:
        # The options that set one field as they are (`trainguard.launch.settings`), then the parsed ones.
        values = flag_values(args, SupervisorConfig)
        values.update(
            command=tuple(command), run_dir=run_dir.resolve(), run_id=rdzv_id, node_id=node, nproc_per_node=nproc,
            min_nodes=nnodes[0], max_nodes=nnodes[1], rdzv_endpoint=rdzv.endpoint or f"127.0.0.1:{free_port()}",
            # 0 attempts without progress would stop before the first restart could show any: it means 1.
            max_no_progress_attempts=values.get("max_no_progress_attempts", 1) or 1,
            watchdog=WatchdogConfig(**flag_values(args, WatchdogConfig)),
            chaos=chaos.format_spec(faults) if faults else "", health_checks=health_checks,
            target_steps=target_steps, last_call_seconds=last_call_seconds, join_timeout_seconds=join_timeout,
            auto_instrument=auto_instrument, logs_dir_override=logs_root, sdc_check_every=sdc_every,
            stop_grace_seconds=SupervisorConfig.stop_grace_seconds if grace is None else grace,
            rdzv_backend=rdzv.backend, node_rank=rdzv.node_rank, rdzv_conf=tuple(sorted(conf.items())),
            rdzv_close_timeout_seconds=close_timeout, role=role, local_ranks_filter=ranks_filter,
            straggler_policy=straggler_policy, straggler_probe_seconds=probe_seconds,
            telemetry_seconds=telemetry_seconds, drain=drain_settings(args),
        )
        cfg = SupervisorConfig(**values)
    except ValueError as exc:
        raise usage_error(exc) from None
    if check_input is not None:
        check_input()
    # Everything is checked: now the folders.
    _make_folders(run_dir, logs_root)
    return cfg


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
        # what the warm-spare pool learned about the script (once per job) changes how fast restarts are
        logging.getLogger("trainguard.launch.warm").setLevel(logging.WARNING)
        logging.getLogger("trainguard.launch.fork_server").setLevel(logging.WARNING)  # the same for the fork server
        # a rank the agent ended after its training (frozen in torch's teardown) must never go unsaid
        logging.getLogger("trainguard.launch.teardown").setLevel(logging.WARNING)


def run(args: argparse.Namespace) -> int:
    from trainguard.cli.console import Console, single_rank_prefixes
    from trainguard.cli.output import print_json
    from trainguard.launch.store_auth import check_environment

    check_environment()  # before the metrics port, the run folder or anything else exists
    for dest, why in REFUSED_OPTIONS.items():
        if getattr(args, dest, None) not in (None, False):
            raise UsageError(f"{why}")
    if str(args.event_log_handler).strip() != "null":
        raise UsageError("--event-log-handler: only 'null' is supported (trainguard writes its own event log)")
    command = split_command(args.command)
    check_command(command, module=args.module, no_python=args.no_python)
    nnodes = parse_nnodes(args.nnodes)
    nproc = parse_nproc(args.nproc_per_node)
    rdzv = decide_rendezvous(args, nnodes)
    from trainguard.web import metrics

    metrics_server = metrics.start(args.metrics_port)  # binds now: a taken port fails before anything is on disk
    cfg = build_config(args, command, nproc=nproc, nnodes=nnodes, endpoint=rdzv.endpoint, node_id=args.node_id,
                       health_checks=not args.no_health_checks, rendezvous=rdzv,
                       check_input=lambda: check_command_exists(command, module=args.module,
                                                                no_python=args.no_python))
    from trainguard.launch.runlock import hold_run_dir

    hold_run_dir(cfg.run_dir, cfg.node_id)  # a live run holds this folder: refused (exit 2) before anything runs
    if metrics_server is not None:
        metrics_server.follow(cfg.run_dir, cfg.node_id)
    from trainguard.launch.supervisor import supervise

    quiet_torch_logs(getattr(args, "verbose", 0))
    if getattr(args, "no_framework_adapters", False):
        from trainguard.worker.frameworks import ENV

        os.environ[ENV] = "0"  # the workers inherit the supervisor's environment
    # Agents of a multi-node job often share one terminal (srun, the multi-node demo): name the node.
    console = Console(cfg, quiet=args.quiet,
                      label="trainguard" if cfg.max_nodes == 1 else f"trainguard[{cfg.node_id}]")
    console.line(f"run dir {cfg.run_dir}, node {cfg.node_id}, {cfg.nproc_per_node} rank(s), "
                 f"rendezvous {cfg.rdzv_backend} {cfg.rdzv_endpoint} id {cfg.run_id}")
    from trainguard.torch_api.features import probe

    for line in probe().summary_lines():  # what this torch lacks, once, before anything starts
        console.line(line, always=True)
    console.start()
    try:
        # With --json, stdout carries exactly one JSON document: the workers' stdout lines that torch
        # tails onto the console go to stderr instead.
        # torch prefixes tracebacks and its C++ warnings with the rank in the workers: one prefix on the console.
        with single_rank_prefixes(), contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            result = supervise(cfg)
    finally:
        console.stop()
        if metrics_server is not None:
            metrics_server.close()
    console.summary(result)
    if args.json:
        print_json(result_json(cfg, result))
    return int(result.exit_code)
