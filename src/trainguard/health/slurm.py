"""The Slurm scheduler adapter: ``scontrol update NodeName=H State=DRAIN Reason=...`` and friends.

Only Slurm's own commands are used (``scontrol``, ``sinfo``), with a time limit each, and never a shell, so a
reason is passed to Slurm exactly as written. Changing a node's state needs a Slurm operator or administrator
(``sacctmgr modify user NAME set adminlevel=operator``) or root; reading needs nothing. Tested against a real
slurmctld with three slurmd "nodes" (tests/sched/). See docs/operations.md.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence

from trainguard.health.hostlist import expand
from trainguard.health.sched_base import NodeState, SchedulerError

DEFAULT_TIMEOUT_SECONDS = 15.0
"""Limit for one ``scontrol``/``sinfo`` call (slurmctld answers in milliseconds when healthy)."""
_SINFO_FORMAT = "%N|%T|%H|%U|%E"
"""node | state | reason time | reason user | reason (last: a reason may itself contain ``|``)."""
_UNKNOWN_NODE = ("not found", "Invalid node name")


def _parse_time(text: str) -> float | None:
    """Slurm's ``2026-12-01T23:47:21`` (local time) as Unix seconds; None for ``Unknown``/``None``."""
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _state_flags(line: str) -> tuple[str, ...]:
    """``State=IDLE+DRAIN`` of one ``scontrol show node -o`` line as lower-case words: ``("idle", "drain")``."""
    for token in line.split():
        if token.startswith("State="):
            return tuple(w for w in token[len("State="):].lower().replace("*", "").split("+") if w)
    return ()


class SlurmAdapter:
    """Drain, resume and list Slurm nodes. ``environ`` is the environment the commands run with (SLURM_CONF;
    SLURM_JOB_NODELIST or SLURM_JOB_ID: the job's nodes); None = this process's."""

    name = "slurm"

    def __init__(self, *, environ: dict[str, str] | None = None, scontrol: str = "scontrol", sinfo: str = "sinfo",
                 timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.environ = dict(os.environ if environ is None else environ)
        self.scontrol = scontrol
        self.sinfo = sinfo
        self.timeout_seconds = timeout_seconds

    def _run(self, *argv: str) -> str:
        try:
            p = subprocess.run(list(argv), capture_output=True, text=True, timeout=self.timeout_seconds,
                               env=self.environ, check=False)
        except FileNotFoundError:
            raise SchedulerError(f"{argv[0]} not found: Slurm's client commands are not installed here") from None
        except subprocess.TimeoutExpired:
            raise SchedulerError(f"{' '.join(argv[:3])} did not answer within {self.timeout_seconds:g} s "
                                 "(is slurmctld up?)") from None
        if p.returncode != 0:
            message = " ".join((p.stderr or p.stdout).split()) or f"exit code {p.returncode}"
            if any(m in message for m in _UNKNOWN_NODE):
                raise KeyError(message)
            raise SchedulerError(f"{' '.join(argv[:3])}: {message}")
        return p.stdout

    # --- changes --------------------------------------------------------------------------------------

    def drain(self, node: str, reason: str) -> None:
        self._run(self.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    def resume(self, node: str) -> None:
        self._run(self.scontrol, "update", f"NodeName={node}", "State=RESUME")

    # --- reading --------------------------------------------------------------------------------------

    def _flags(self, node: str | None = None) -> dict[str, tuple[str, ...]]:
        out = self._run(self.scontrol, "show", "node", "-o", *([node] if node else []))
        flags: dict[str, tuple[str, ...]] = {}
        for line in out.splitlines():
            first = line.split(" ", 1)[0]
            if first.startswith("NodeName="):
                flags[first[len("NodeName="):]] = _state_flags(line)
        return flags

    def _sinfo(self, *extra: str) -> list[tuple[str, str, float | None, str, str]]:
        rows = []
        seen: set[str] = set()
        for line in self._run(self.sinfo, "-h", "-N", *extra, "-o", _SINFO_FORMAT).splitlines():
            parts = line.split("|", 4)
            if len(parts) != 5 or parts[0] in seen:  # -N lists a node once per partition
                continue
            seen.add(parts[0])
            node, state, when, user, reason = parts
            reason = "" if reason.strip() == "none" else reason.strip()
            rows.append((node, state.strip().lower().rstrip("*~#!%$@^-"), _parse_time(when),
                         user.split("(", 1)[0].strip() if user.strip() != "Unknown" else "", reason))
        return rows

    def _state(self, row: tuple[str, str, float | None, str, str], flags: Sequence[str]) -> NodeState:
        node, state, when, user, reason = row
        drained = "drain" in flags or state in ("drained", "draining", "drng", "drain")
        return NodeState(node=node, state=state, drained=drained, reason=reason if reason else "",
                         since=when if reason else None, by=user if reason else "")

    def node(self, node: str) -> NodeState:
        flags = self._flags(node)  # KeyError for a node Slurm does not know
        rows = self._sinfo("-n", node)
        if not rows:
            raise KeyError(f"node {node} not found")
        return self._state(rows[0], flags.get(node, ()))

    def drained(self) -> list[NodeState]:
        flags = self._flags()
        states = [self._state(row, flags.get(row[0], ())) for row in self._sinfo("-R")]
        return [s for s in states if s.drained]

    def job_nodes(self) -> list[str]:
        """The job's allocation: ``SLURM_JOB_NODELIST`` expanded here (no slurmctld call), else the ``NodeList``
        of ``scontrol show job $SLURM_JOB_ID``; empty outside a job or before it has nodes."""
        nodelist = self.environ.get("SLURM_JOB_NODELIST") or self.environ.get("SLURM_NODELIST") or ""
        job = self.environ.get("SLURM_JOB_ID", "")
        if not nodelist and job:
            for token in self._run(self.scontrol, "show", "job", "-o", job).split():
                if token.startswith("NodeList="):
                    nodelist = token[len("NodeList="):]
            if nodelist == "(null)":  # pending: no nodes yet
                nodelist = ""
        try:
            return expand(nodelist)
        except ValueError as exc:
            raise SchedulerError(f"the job's node list: {exc}") from None

    def cluster_nodes(self) -> list[str]:
        return [row[0] for row in self._sinfo()]
