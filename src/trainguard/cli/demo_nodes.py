"""``trainguard demo --nodes N``: N node agents (``trainguard run`` processes) on this machine, meeting on a
loopback c10d rendezvous and sharing one run directory, so node-level faults can be watched without a cluster."""

from __future__ import annotations

import argparse
import json
import logging
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from trainguard.errors import UsageError
from trainguard.launch.lifetime import die_with_parent_command

log = logging.getLogger(__name__)

NODE_LOST_SECONDS = 5.0
"""The demo's ``--node-lost-timeout``: short, so a lost node is let go of quickly on one machine."""
KEEP_ALIVE_SECONDS = 1
"""torch's rendezvous keep-alive interval in the demo (3 missed = a dead node leaves the rendezvous)."""
LAST_CALL_SECONDS = 4
"""Agents start seconds apart on two busy cores: the first round waits this long for the last ones."""
NODE_FAULTS = ("node-crash", "agent-kill", "unhealthy")


def node_name(index: int) -> str:
    return f"node{index}"


def default_schedule(nodes: int, steps: int) -> str:
    """A rank crash about a third of the way in, then the last node crashes (agent and workers) at 2/3."""
    return f"crash@step={max(2, steps * 3 // 10)},rank=1;node-crash@step={max(3, steps * 2 // 3)},node={nodes - 1}"


def resolve_nodes(spec: str, nodes: int) -> tuple[str, int]:
    """The schedule with ``node=I`` (an index) written as the node's id, and how many nodes it takes away.

    Raises `UsageError` for an index or name that is not one of the demo's nodes."""
    from trainguard.chaos import faults as chaos

    faults = chaos.parse_spec(spec)
    parts = []
    lost: set[str] = set()
    for f in faults:
        text = f.to_spec()
        if f.kind in NODE_FAULTS:
            node = str(f.node)
            name = node_name(int(node)) if node.isdigit() else node
            if not re.fullmatch(r"node[0-9]+", name) or int(name[4:]) >= nodes:
                raise UsageError(f"--inject: {text}: node {node!r} is not one of the demo's nodes "
                                 f"(0 to {nodes - 1}, or node0 to node{nodes - 1})")
            text = text.replace(f"node={node}", f"node={name}")
            lost.add(name)
        parts.append(text)
    return ";".join(parts) or "none", len(lost)


@dataclass(frozen=True)
class AgentOutcome:
    """How one demo agent ended."""

    node: str
    exit_code: int
    """The process's exit status (negative: killed by that signal, as node-level chaos does)."""
    result: dict[str, Any] | None
    """Its ``--json`` result, None when it was killed before printing one."""


def _child_args(args: argparse.Namespace, cfg: Any, index: int, nnodes: str, endpoint: str) -> list[str]:
    wd = cfg.watchdog
    # Each node's agent dies with the demo, even a demo killed by SIGKILL (its lifeline then ends its workers).
    agent = die_with_parent_command(sys.executable, [], "trainguard", ["run"])
    out = [*agent, "--nnodes", nnodes, "--nproc-per-node", str(cfg.nproc_per_node),
           "--rdzv-endpoint", endpoint, "--rdzv-id", cfg.run_id, "--node-id", node_name(index),
           "--run-dir", str(cfg.run_dir), "--json", "--inject", cfg.chaos or "none",
           "--rdzv-conf", f"keep_alive_interval={KEEP_ALIVE_SECONDS}", "--rdzv-last-call", str(LAST_CALL_SECONDS),
           "--node-lost-timeout", str(NODE_LOST_SECONDS), "--max-restarts", str(cfg.max_restarts),
           "--no-progress-attempts", str(cfg.max_no_progress_attempts), "--hang-floor", str(wd.floor_seconds),
           "--hang-multiplier", str(wd.multiplier), "--busy-allowance", str(wd.busy_allowance_seconds),
           "--first-step-allowance", str(wd.first_step_allowance_seconds),
           "--checkpoint-allowance", str(wd.checkpoint_allowance_seconds), "--stop-grace", str(cfg.stop_grace_seconds),
           "--sdc-check-every", str(cfg.sdc_check_every)]
    if args.quiet:
        out.append("--quiet")
    # Only rank 0's own progress lines reach the console (node0, local rank 0); every other stream stays in the
    # log files, as in the one-node demo.
    out += ["-r", "2", "--local-ranks-filter", "0"] if index == 0 else ["-r", "3"]
    return [*out, "--", *cfg.command]


def _store_up(endpoint: str) -> bool:
    host, port = endpoint.rsplit(":", 1)
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


def run_agents(args: argparse.Namespace, cfg: Any, nodes: int, min_nodes: int) -> list[AgentOutcome]:
    """Start node0 (it hosts the c10d store), then the others; wait for all of them."""
    endpoint = cfg.rdzv_endpoint
    nnodes = f"{min_nodes}:{nodes}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for index in range(nodes):
            procs.append(subprocess.Popen(_child_args(args, cfg, index, nnodes, endpoint), stdout=subprocess.PIPE))
            if index == 0:
                deadline = time.monotonic() + 120
                while not _store_up(endpoint) and procs[0].poll() is None and time.monotonic() < deadline:
                    time.sleep(0.2)
        outs = [p.communicate()[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:  # Ctrl-C or an error here: the agents go too
                p.terminate()
                p.wait(timeout=60)
    return [AgentOutcome(node_name(i), p.returncode, _parse(outs[i])) for i, p in enumerate(procs)]


def _parse(out: bytes) -> dict[str, Any] | None:
    text = out.decode(errors="replace").strip()
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def job_result(cfg: Any, outcomes: list[AgentOutcome]) -> Any:
    """One `SupervisorResult` for the whole job: the job's own end (``RunEnded``, written by its leader),
    attempts and unfired faults across the agents."""
    from trainguard.core.eventlog import read_run
    from trainguard.core.events import RunEnded
    from trainguard.errors import InputError
    from trainguard.launch.supervisor import SupervisorResult, unfired_faults

    try:
        ended = [r for _, _, r in read_run(cfg.run_dir) if isinstance(r, RunEnded)]
    except InputError:  # no agent wrote anything usable
        ended = []
    results = [o.result for o in outcomes if o.result is not None]
    attempts = max((int(r.get("attempts", 0)) for r in results), default=0)
    if ended:
        last = ended[-1]
        status, reason, code, steps = last.status, last.reason, last.exit_code, last.completed_steps
    else:
        status, reason, code, steps = "failed", "no agent recorded the end of the job", 1, None
    return SupervisorResult(code, status, reason, attempts, steps, [], unfired_faults(cfg))
