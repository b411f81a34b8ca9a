"""How each interruption is recovered: full restart (cold or warm), in-process restart, in-memory restore,
and fault-tolerant replica groups (a group drops out, the others keep training at reduced throughput).

Pure numpy over the flat per-interruption arrays of `engine.Sample`; the engine walks the segments.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainguard.sim.models import FailureModel
from trainguard.sim.policy import JobConfig, PolicyConfig

_MEMORY_SCOPES = ("gpu", "host")
"""Scopes whose lost state a peer's in-memory copy covers (a network domain can take the peer too)."""


@dataclass(frozen=True)
class Recovery:
    """Per-interruption recovery phases, seconds, before clipping by the next onset."""

    relaunch: np.ndarray
    """Relaunch, waiting for a node, and for in-process recovery its whole re-initialization (``restart``)."""
    startup: np.ndarray
    """Process start-up of a cold full restart (0 when warm or in-process)."""
    restore: np.ndarray
    """Checkpoint load: from storage, or from host memory / a peer's copy when that applies."""
    group_local: np.ndarray
    """True where only one replica group fails (replica groups on, GPU/host scope, not planned, not SDC)."""


def category_flags(model: FailureModel, policy: PolicyConfig) -> tuple[np.ndarray, np.ndarray]:
    """Per category (planned last): (group-local, in-memory copy survives)."""
    ncat = len(model.categories)
    group_local = np.zeros(ncat + 1, bool)
    memory_ok = np.zeros(ncat + 1, bool)
    for i, c in enumerate(model.categories):
        # silent corruption reaches every group through the gradient all-reduce and taints memory copies
        contained = c.scope in _MEMORY_SCOPES and c.detection != "sdc"
        group_local[i] = contained and policy.replica_groups > 1
        if policy.memory_checkpoint == "local":
            memory_ok[i] = c.repair == "restart" and c.detection != "sdc"
        elif policy.memory_checkpoint == "peer":
            memory_ok[i] = contained
    # planned stops (maintenance: reboots, upgrades) restore from storage: host memory does not survive them
    memory_ok[ncat] = False
    return group_local, memory_ok


def recovery(model: FailureModel, policy: PolicyConfig, cat: np.ndarray, wait: np.ndarray,
             u_recover: np.ndarray) -> Recovery:
    """Which path each interruption takes and how long its phases last."""
    group_flag, memory_flag = category_flags(model, policy)
    warm = policy.warm_start_seconds is not None
    cold_relaunch = float(policy.warm_start_seconds or 0.0) if warm else policy.relaunch_seconds
    cold_startup = 0.0 if warm else policy.startup_seconds
    restore_by_cat = np.where(memory_flag, policy.memory_restore_seconds, policy.restore_seconds)
    if policy.inprocess_share <= 0:  # the common case, without the per-interruption selects
        return Recovery(relaunch=wait + cold_relaunch, startup=np.full(len(cat), cold_startup),
                        restore=restore_by_cat[cat], group_local=group_flag[cat])
    inprocess = (u_recover < policy.inprocess_share) & (cat != len(model.categories))
    return Recovery(
        relaunch=np.where(inprocess, policy.inprocess_restart_seconds, cold_relaunch) + wait,
        startup=np.where(inprocess, 0.0, cold_startup),
        restore=np.where(inprocess, 0.0, restore_by_cat[cat]),
        group_local=group_flag[cat],
    )


def group_costs(job_seg: np.ndarray, offset: np.ndarray, gap: np.ndarray, det: np.ndarray, rec: Recovery,
                sel: np.ndarray, policy: PolicyConfig) -> dict[str, np.ndarray]:
    """Job-seconds lost to group-local failures ``sel`` (indices into the interruption arrays).

    ``offset`` is each failure's time since its job segment started training (negative: the job was
    recovering anyway and the failed group restarts with it, at no extra cost). The survivors stall for
    the detection and the quorum change, until the next onset at the latest (``gap``: a later failure's
    pause replaces this one's, they do not add up); during the group's own recovery the job runs at
    (G-1)/G, which costs 1/G of that time (overlapping group recoveries do add up: two groups are out).
    Returned per failure and bucket, not yet clipped to the segment.
    """
    g = float(policy.replica_groups)
    live = offset >= 0
    share = np.where(live, 1.0 / g, 0.0)
    pause_det = np.minimum(det[sel], gap)
    pause_quorum = np.minimum(policy.group_reconfigure_seconds, gap - pause_det)
    return {
        "detection": np.where(live, pause_det, 0.0),
        "restart": np.where(live, pause_quorum, 0.0) + share * rec.relaunch[sel],
        "startup": share * rec.startup[sel],
        "checkpoint_restore": share * rec.restore[sel],
        "segment": job_seg,
    }


def job_failure_rate_per_second(model: FailureModel, job: JobConfig, policy: PolicyConfig) -> float:
    """Rate of unexpected failures that stop (and roll back) the whole job."""
    group_flag, _ = category_flags(model, policy)
    rate = sum(c.rate_per_gpu_hour for i, c in enumerate(model.categories) if not group_flag[i])
    return job.gpus * rate / 3600.0
