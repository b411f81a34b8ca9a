"""The scheduler interface shared by the adapters: node state, errors, and the drain reasons trainguard writes.

Its own module so `trainguard.health.slurm` and `trainguard.health.kubernetes` need not import
`trainguard.health.scheduler`, which picks between them (no import cycle).
"""

from __future__ import annotations

import logging
import os
import pwd
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from trainguard.errors import StorageError

log = logging.getLogger(__name__)

REASON_PREFIX = "trainguard:"
"""Start of every drain reason trainguard writes (``trainguard: node lost, run R attempt 2 [uid 1000 ...]``)."""
MAX_REASON_CHARS = 200
"""Longer reasons are cut (Slurm shows reasons in fixed-width columns; Kubernetes annotations stay small)."""
_OWNER_TAG = re.compile(r" \[uid (\d+) (\S+) job (\S+)\]$")
"""The owner tag every drain reason ends with (`Owner.tag`)."""
_UNSAFE = re.compile(r"[^A-Za-z0-9_.@+-]")


class SchedulerError(StorageError):
    """The scheduler refused or could not carry out a change (exit 4: the change was not made)."""


@dataclass(frozen=True)
class Owner:
    """Who a drain was made for: the user the agent runs as and the scheduler's job. It is written into the
    drain reason so that ``trainguard health --return-node`` resumes only nodes drained for its own user."""

    uid: int
    """The numeric user id the drain was made by (what `return_node` compares)."""
    user: str
    """That user's name (for people reading ``sinfo -R``); the uid when it has none."""
    job: str
    """The scheduler's job (``SLURM_JOB_ID``, Kubernetes ``JOB_NAME``); ``-`` outside a job."""

    @classmethod
    def current(cls, environ: Mapping[str, str] | None = None) -> Owner:
        """This process's user and job."""
        env = os.environ if environ is None else environ
        uid = os.getuid()
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:  # a container's uid with no passwd entry
            user = str(uid)
        job = env.get("SLURM_JOB_ID") or env.get("JOB_NAME") or "-"
        return cls(uid, _UNSAFE.sub("_", user) or str(uid), _UNSAFE.sub("_", job) or "-")

    def tag(self) -> str:
        """`` [uid 1000 alice job 4711]``: what `reason_owner` reads back."""
        return f" [uid {self.uid} {self.user} job {self.job}]"


def reason_owner(reason: str) -> Owner | None:
    """The `Owner` a trainguard drain reason names, or None (not trainguard's, or written without one)."""
    if not reason.startswith(REASON_PREFIX):
        return None
    m = _OWNER_TAG.search(reason)
    return Owner(int(m.group(1)), m.group(2), m.group(3)) if m else None


def drain_reason(what: str, run_id: str = "", attempt: int | None = None, owner: Owner | None = None) -> str:
    """``trainguard: <what>, run <run_id> attempt <attempt> [uid U user job J]``, one line, at most
    `MAX_REASON_CHARS`; ``owner`` defaults to `Owner.current`. Only ``what`` is cut when too long: the run and
    the owner tag always survive."""
    tail = ""
    if run_id:
        tail = f", run {run_id}" + (f" attempt {attempt}" if attempt is not None else "")
    tail = " ".join(tail.split()) + (owner or Owner.current()).tag()
    text = " ".join(f"{REASON_PREFIX} {what}".split())
    room = MAX_REASON_CHARS - len(tail)
    if len(text) > room:
        text = text[: max(len(REASON_PREFIX) + 4, room - 3)].rstrip() + "..."
    return text + tail


@dataclass(frozen=True)
class NodeState:
    """One node as the scheduler sees it."""

    node: str
    """The scheduler's name for the node."""
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

    @property
    def owner(self) -> Owner | None:
        """The owner a trainguard drain names (None: not drained by trainguard, or no owner tag)."""
        return reason_owner(self.reason) if self.by_trainguard else None


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
        """The nodes of the job this process belongs to, its allocation (empty when it cannot be known)."""
        ...

    def cluster_nodes(self) -> list[str]:
        """Every node the scheduler manages."""
        ...
