"""What trainguard asks of a cluster scheduler: drain a node, resume it, list drained nodes, name the job's nodes.

Two implementations: `trainguard.health.slurm.SlurmAdapter` (``scontrol``/``sinfo``) and
`trainguard.health.kubernetes.KubernetesAdapter` (cordon + taint + event through the API server). The drain
policy (`trainguard.health.drain`) and ``trainguard health --return-node`` talk only to this interface.

Every drain trainguard makes carries a reason starting with `REASON_PREFIX` and ending with the owner tag (user
and job, `trainguard.health.sched_base.Owner`); that is how trainguard later recognises its own drains, and whose
they are. The shared types live in `trainguard.health.sched_base` (the adapters import that, not this module).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

from trainguard.errors import UsageError
from trainguard.health.sched_base import (
    MAX_REASON_CHARS,
    REASON_PREFIX,
    NodeState,
    Owner,
    SchedulerAdapter,
    SchedulerError,
    drain_reason,
    reason_owner,
)

__all__ = ["MAX_REASON_CHARS", "REASON_PREFIX", "SCHEDULERS", "NodeState", "Owner", "SchedulerAdapter",
           "SchedulerError", "by_trainguard", "detect", "drain_reason", "open_adapter", "reason_owner"]

SCHEDULERS = ("auto", "slurm", "kubernetes")


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
