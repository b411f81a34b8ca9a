"""What trainguard asks of a cluster scheduler: drain a node, resume it, list drained nodes, name the job's nodes.

Two implementations: `trainguard.health.slurm.SlurmAdapter` (``scontrol``/``sinfo``) and
`trainguard.health.kubernetes.KubernetesAdapter` (cordon + taint + event through the API server). The drain
policy (`trainguard.health.drain`) and ``trainguard health --return-node`` talk only to this interface.

Every drain trainguard makes carries a reason starting with `REASON_PREFIX`; that prefix is how trainguard
later recognises its own drains (it never resumes a node drained for any other reason).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from trainguard.errors import StorageError, UsageError

REASON_PREFIX = "trainguard:"
"""Start of every drain reason trainguard writes (``trainguard: node lost, run R attempt 2``)."""
MAX_REASON_CHARS = 200
"""Longer reasons are cut (Slurm shows reasons in fixed-width columns; Kubernetes annotations stay small)."""
SCHEDULERS = ("auto", "slurm", "kubernetes")


class SchedulerError(StorageError):
    """The scheduler refused or could not carry out a change (exit 4: the change was not made)."""


@dataclass(frozen=True)
class NodeState:
    """One node as the scheduler sees it."""

    node: str
    state: str
    """The scheduler's own word for it (Slurm ``idle``, ``drained``, ``draining``, ``down``; Kubernetes
    ``Ready``, ``NotReady``), lower case."""
    drained: bool
    """No new work is placed on it (Slurm DRAIN flag, Kubernetes cordoned)."""
    reason: str = ""
    """Why it was drained ('' when not drained or none given)."""
    since: float | None = None
    """When the reason was set (Unix seconds), when the scheduler says."""
    by: str = ""
    """Who set it, when the scheduler says (Slurm's user)."""

    @property
    def by_trainguard(self) -> bool:
        """Drained by trainguard: drained, with a reason that starts with `REASON_PREFIX`."""
        return self.drained and self.reason.startswith(REASON_PREFIX)


class SchedulerAdapter(Protocol):
    """The operations trainguard needs from a scheduler. Each raises `SchedulerError` when the scheduler
    refuses or cannot be reached, and `KeyError` for a node it does not know."""

    name: str
    """``slurm`` or ``kubernetes`` (recorded in ``node_drained`` events)."""

    def drain(self, node: str, reason: str) -> None:
        """Place no new work on ``node`` and record ``reason``; the job running there is not killed."""
        ...

    def resume(self, node: str) -> None:
        """Return a drained ``node`` to service."""
        ...

    def node(self, node: str) -> NodeState:
        """The state of one node."""
        ...

    def drained(self) -> list[NodeState]:
        """Every drained node of the cluster (whoever drained it)."""
        ...

    def job_nodes(self) -> list[str]:
        """The nodes of the job this process belongs to (empty outside a job)."""
        ...

    def cluster_nodes(self) -> list[str]:
        """Every node the scheduler manages."""
        ...


def drain_reason(what: str, run_id: str = "", attempt: int | None = None) -> str:
    """``trainguard: <what>, run <run_id> attempt <attempt>``, on one line and at most `MAX_REASON_CHARS`."""
    tail = ""
    if run_id:
        tail = f", run {run_id}" + (f" attempt {attempt}" if attempt is not None else "")
    text = " ".join(f"{REASON_PREFIX} {what}".split())
    room = MAX_REASON_CHARS - len(tail)
    if len(text) > room:
        text = text[: max(len(REASON_PREFIX) + 4, room - 3)].rstrip() + "..."
    return text + tail


def detect(environ: dict[str, str] | None = None) -> str | None:
    """The scheduler this process runs under: ``slurm`` (inside a Slurm job with ``scontrol`` on the PATH),
    ``kubernetes`` (inside a pod: ``KUBERNETES_SERVICE_HOST``), else None."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_JOB_ID") and shutil.which("scontrol", path=env.get("PATH")):
        return "slurm"
    if env.get("KUBERNETES_SERVICE_HOST"):
        return "kubernetes"
    return None


def open_adapter(kind: str = "auto", environ: dict[str, str] | None = None) -> SchedulerAdapter:
    """The adapter for ``kind`` (``auto``: `detect`). `UsageError` when none applies here."""
    if kind not in SCHEDULERS:
        raise UsageError(f"unknown scheduler {kind!r} (known: {', '.join(SCHEDULERS)})")
    found = detect(environ) if kind == "auto" else kind
    if found == "slurm":
        from trainguard.health.slurm import SlurmAdapter

        return SlurmAdapter(environ=environ)
    if found == "kubernetes":
        from trainguard.health.kubernetes import KubernetesAdapter

        return KubernetesAdapter.from_environment(environ)
    raise UsageError("no scheduler found: not inside a Slurm job (SLURM_JOB_ID with scontrol on the PATH) or a "
                     "Kubernetes pod (KUBERNETES_SERVICE_HOST); name one with --scheduler slurm|kubernetes")


def by_trainguard(states: Sequence[NodeState]) -> list[NodeState]:
    """The nodes among ``states`` that trainguard drained."""
    return [s for s in states if s.by_trainguard]
