"""Drain bad nodes in the scheduler, as a rate-limited policy; give them back after they pass their checks.

A node-level verdict (a hardware root cause naming the host, a failed high-severity health check, a lost node,
a lemon flag) can drain that node in the scheduler (`trainguard.health.scheduler.SchedulerAdapter`), so no
later job lands on it either. Only a node of the job's own allocation (the scheduler's list of the job's nodes)
is ever drained: any other is refused without a scheduler call. It is opt-in (``trainguard run
--drain-bad-nodes``) and rate-limited: within ``window_seconds`` a run drains at most ``max_share`` of its
allocation, and never while trainguard's drains
would exceed ``max_cluster_share`` of the cluster, so a wrong rule cannot empty a cluster. Every decision,
taken or refused, is a `NodeDrained` record. The decisions of all agents of a run go through one ledger in the
run directory (``drains/``, under a file lock), so two nodes deciding at once still respect the limit.

`return_node` is the way back: a node trainguard drained for this user (the owner tag of its reason) is resumed
after N consecutive passing health checks of that node; a node drained by anyone else, for another user, or not
drained is refused. See docs/operations.md.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.core.events import Diagnosis, Event, NodeDrained
from trainguard.core.numeric import in_range
from trainguard.core.safefs import create_exclusive, make_dirs
from trainguard.errors import UsageError
from trainguard.health.base import CheckResult, healthy
from trainguard.health.scheduler import (
    SCHEDULERS,
    NodeState,
    Owner,
    SchedulerAdapter,
    SchedulerError,
    by_trainguard,
    drain_reason,
    open_adapter,
)

log = logging.getLogger(__name__)

CAUSES = ("hardware", "health", "lost", "lemon")
"""Node-level verdicts that may drain a node."""
HARDWARE_GROUPS = ("GPU", "Host", "Network")
"""Table 5 groups whose root causes sit in (or at) the named host's own devices."""
STATUSES = ("drained", "refused", "failed", "already-drained")


@dataclass(frozen=True)
class DrainSettings:
    """How the drain policy behaves (``trainguard run --drain-bad-nodes`` and its ``--drain-*`` options)."""

    scheduler: str = "auto"
    """``auto`` (Slurm inside a Slurm job, Kubernetes inside a pod), ``slurm`` or ``kubernetes``."""
    max_share: float = 0.25
    """At most this share of the job's allocation drained per window (0.25 of 8 nodes: 2). A job with fewer
    than 1 / max_share nodes drains none."""
    window_seconds: float = 3600.0
    """The rate limit's window."""
    max_cluster_share: float = 0.1
    """Refuse while the nodes trainguard drained (by any job) would exceed this share of the cluster; 1 = off."""
    min_confidence: float = 0.5
    """A hardware root cause drains only with at least this classification confidence."""
    causes: tuple[str, ...] = CAUSES
    """The verdicts that drain (a subset of `CAUSES`)."""

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}")
        for name in ("max_share", "max_cluster_share", "min_confidence"):
            value = getattr(self, name)
            if not in_range(value, 0, 1):
                raise ValueError(f"{name} must be a number from 0 to 1, got {value!r}")
        w = self.window_seconds
        if not in_range(w, 1, 365 * 86400):
            raise ValueError(f"window_seconds must be from 1 to 31536000 seconds, got {w!r}")
        if not isinstance(self.causes, tuple) or not self.causes or any(c not in CAUSES for c in self.causes):
            raise ValueError(f"causes must be a non-empty tuple of {', '.join(CAUSES)}, got {self.causes!r}")


@dataclass(frozen=True)
class Verdict:
    """A node-level verdict the policy may act on."""

    node: str
    cause: str
    """One of `CAUSES`."""
    what: str
    """What a person reads in the scheduler (``Xid 79 GPU 0000:18:00``, ``node lost``)."""
    attempt: int | None = None


# --- verdicts from what the agent found ------------------------------------------------------------------

_PCI = re.compile(r"PCI:([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)")


def _hardware_what(category: str, lines: Sequence[str]) -> str:
    from trainguard.classify import xid_code

    for line in lines:
        code = xid_code(line)
        if code is not None:
            pci = _PCI.search(line)
            return f"Xid {code}" + (f" GPU {pci.group(1)}" if pci else "") + f" ({category})"
    return category


def diagnosis_verdicts(diagnosis: Diagnosis, min_confidence: float) -> list[Verdict]:
    """A hardware root cause (Table 5 group GPU, Host or Network) naming hosts, at ``min_confidence`` or more."""
    if diagnosis.group not in HARDWARE_GROUPS or diagnosis.confidence < min_confidence:
        return []
    what = _hardware_what(diagnosis.category, diagnosis.evidence)
    return [Verdict(h, "hardware", what, diagnosis.attempt) for h in diagnosis.culprit_hosts if h]


def health_verdict(node: str, attempt: int | None, failures: Sequence[str]) -> Verdict:
    """A failed high-severity health check (``failures``: ``name: detail`` each)."""
    return Verdict(node, "health", "failed health check " + "; ".join(failures), attempt)


def lost_verdict(node: str, attempt: int | None, timeout_seconds: float) -> Verdict:
    return Verdict(node, "lost", f"node lost (agent silent for {timeout_seconds:g} s)", attempt)


def lemon_verdict(node: str, attempt: int | None) -> Verdict:
    return Verdict(node, "lemon", "lemon node (fleet history)", attempt)


# --- the ledger ------------------------------------------------------------------------------------------


class DrainLedger:
    """Every drain decision of one run, one small file each under ``<run_dir>/drains/`` (written by the agent
    that decided), read and extended under an exclusive lock on ``drains/.lock``."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = Path(run_dir) / "drains"

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        make_dirs(self.dir)
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def entries(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.dir.glob("drain-*.json")) if self.dir.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):
                entry = json.loads(path.read_text())
                if isinstance(entry, dict) and isinstance(entry.get("time"), int | float):
                    out.append(entry)
        return out

    def add(self, record: NodeDrained) -> None:
        name = f"drain-{int(record.time * 1000):015d}-{record.node}-{os.getpid()}.json"
        entry = {"time": record.time, "node": record.node, "status": record.status, "cause": record.cause,
                 "by": record.host, "reason": record.reason}
        create_exclusive(self.dir / name, json.dumps(entry).encode())


# --- the policy ------------------------------------------------------------------------------------------


@dataclass
class DrainPolicy:
    """Decides, under the run's ledger lock, whether a verdict drains its node; see the module docstring."""

    settings: DrainSettings
    adapter: SchedulerAdapter
    run_dir: Path
    run_id: str
    host: str
    """The agent deciding (the ``host`` of the records)."""
    clock: Callable[[], float] = time.time
    owner: Owner = field(default_factory=Owner.current)
    """Written into every reason, so that only this user can return the node (`return_node`)."""
    ledger: DrainLedger = field(init=False)

    def __post_init__(self) -> None:
        self.ledger = DrainLedger(self.run_dir)

    def decision_record(self, v: Verdict, status: str, reason: str, detail: str) -> NodeDrained:
        return NodeDrained(time=self.clock(), host=self.host, node=v.node, status=status, cause=v.cause,
                           reason=reason, scheduler=self.adapter.name, attempt=v.attempt, detail=detail)

    def _limits(self, now: float, entries: list[dict[str, Any]], job: int) -> str | None:
        """Why one more drain would break a limit (``job``: the allocation's size), or None."""
        s = self.settings
        recent = [e for e in entries if e.get("status") == "drained" and now - float(e["time"]) <= s.window_seconds]
        allowed = s.max_share * job
        if len(recent) + 1 > allowed + 1e-9:
            return (f"rate limit: {len(recent)} of the job's {job} nodes drained in the last "
                    f"{s.window_seconds:g} s; one more exceeds max_share {s.max_share:g} ({allowed:.2f} nodes)")
        if s.max_cluster_share < 1:
            cluster = len(self.adapter.cluster_nodes())
            ours = len(by_trainguard(self.adapter.drained()))
            if ours + 1 > s.max_cluster_share * cluster + 1e-9:
                return (f"cluster limit: trainguard already drained {ours} of the cluster's {cluster} nodes; one "
                        f"more exceeds max_cluster_share {s.max_cluster_share:g}")
        return None

    def decide(self, verdict: Verdict) -> NodeDrained:
        """Drain ``verdict.node`` unless a limit or the node's state says no; the record says what happened.
        Never raises for a scheduler problem (that is a ``failed`` record)."""
        reason = drain_reason(verdict.what, self.run_id, verdict.attempt, self.owner)
        if verdict.cause not in self.settings.causes:
            return self.decision_record(verdict, "refused", reason, f"cause {verdict.cause} is not enabled")
        with self.ledger.locked():
            try:
                record = self._decide_locked(verdict, reason)
            except (SchedulerError, KeyError) as exc:
                text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
                record = self.decision_record(verdict, "failed", reason, f"scheduler: {text}")
            with contextlib.suppress(OSError):
                self.ledger.add(record)
        return record

    def _decide_locked(self, verdict: Verdict, reason: str) -> NodeDrained:
        now = self.clock()
        entries = self.ledger.entries()
        # The allocation is asked first: a node of another job (a wrong --node-id, a forged culprit host in a
        # log line) must not even be looked up, let alone drained.
        allocation = set(self.adapter.job_nodes())
        if not allocation:
            return self.decision_record(verdict, "refused", reason, "the job's allocation is unknown (no "
                                        f"{self.adapter.name} job nodes found): trainguard drains only its own "
                                        "job's nodes")
        if verdict.node not in allocation:
            return self.decision_record(verdict, "refused", reason, f"node {verdict.node} is not in the job's "
                                        f"allocation ({len(allocation)} nodes): never drained")
        if any(e.get("node") == verdict.node and e.get("status") == "drained" for e in entries):
            return self.decision_record(verdict, "already-drained", reason, "this run drained it before")
        state = self.adapter.node(verdict.node)
        if state.drained:
            who = "trainguard" if state.by_trainguard else (state.by or "someone")
            return self.decision_record(verdict, "already-drained", reason, f"drained by {who}: {state.reason}")
        why = self._limits(now, entries, len(allocation))
        if why is not None:
            return self.decision_record(verdict, "refused", reason, why)
        self.adapter.drain(verdict.node, reason)
        recent = sum(1 for e in entries if e.get("status") == "drained"
                     and now - float(e["time"]) <= self.settings.window_seconds)
        return self.decision_record(verdict, "drained", reason, f"{recent + 1} drained by this run within "
                                                        f"{self.settings.window_seconds:g} s")


def drain_verdicts(cfg: Any, verdicts: Iterable[Verdict], emit: Callable[[Event], None]) -> list[NodeDrained]:
    """The agent's hook: apply ``cfg.drain`` (a `DrainSettings`, or None = off) to ``verdicts`` and emit a
    `NodeDrained` for each. ``cfg`` is the agent's `SupervisorConfig`. Never raises: draining is a side
    effect and must not stand in the way of recovery."""
    settings = getattr(cfg, "drain", None)
    verdicts = list(verdicts)
    if settings is None or not verdicts:
        return []
    out: list[NodeDrained] = []
    try:
        adapter = open_adapter(settings.scheduler)
    except Exception as exc:
        log.warning("drain: no scheduler to drain %s in: %s", ", ".join(v.node for v in verdicts), exc)
        for v in verdicts:
            record = NodeDrained(time=time.time(), host=cfg.node_id, node=v.node, status="failed", cause=v.cause,
                                 reason=drain_reason(v.what, cfg.run_id, v.attempt), attempt=v.attempt,
                                 detail=f"no scheduler: {exc}")
            emit(record)
            out.append(record)
        return out
    policy = DrainPolicy(settings, adapter, Path(cfg.run_dir), cfg.run_id, cfg.node_id)
    for v in verdicts:
        try:
            record = policy.decide(v)
        except Exception as exc:  # a broken ledger folder, a bug: say so, keep recovering
            log.warning("drain of %s failed: %s", v.node, exc)
            record = policy.decision_record(v, "failed", drain_reason(v.what, cfg.run_id, v.attempt, policy.owner),
                                            str(exc))
        if record.status == "drained":
            log.warning("drained node %s in %s: %s", v.node, adapter.name, record.reason)
        elif record.status in ("refused", "failed"):
            log.warning("node %s not drained (%s): %s", v.node, record.status, record.detail)
        emit(record)
        out.append(record)
    return out


# --- the agent's hooks (`trainguard.launch.admission`, `trainguard.launch.failures`) ----------------------


_PENDING: list[threading.Thread] = []
"""Decisions this process started off the critical path and that may still run."""
_PENDING_WAIT_SECONDS = 30.0


def _wait_for_pending() -> None:
    """Let this process's earlier decisions finish first, so they meet the rate limit in the order they were
    made (bounded: each scheduler call has its own time limit)."""
    deadline = time.monotonic() + _PENDING_WAIT_SECONDS
    for t in list(_PENDING):
        t.join(max(0.0, deadline - time.monotonic()))
    _PENDING[:] = [t for t in _PENDING if t.is_alive()]


def after_admission(cfg: Any, attempt: int, health_failures: Sequence[str], lemon: bool,
                    emit: Callable[[Event], None]) -> None:
    """This node failed high-severity checks or is a lemon and leaves: drain it (synchronously: it is leaving)."""
    if getattr(cfg, "drain", None) is None or not (health_failures or lemon):
        return
    _wait_for_pending()
    verdict = (health_verdict(cfg.node_id, attempt, health_failures) if health_failures
               else lemon_verdict(cfg.node_id, attempt))
    drain_verdicts(cfg, [verdict], emit)


def _in_background(cfg: Any, verdicts: list[Verdict], emit: Callable[[Event], None]) -> None:
    """Decide off the recovery's critical path (a slow scheduler must not delay the restart). The thread is
    not a daemon: a decision under way finishes even when the job ends meanwhile (each call is time-limited)."""
    if not verdicts:
        return

    def work() -> None:
        try:
            drain_verdicts(cfg, verdicts, emit)
        except Exception as exc:  # the event file may be closed by now: the ledger still has the decision
            log.warning("drain decision not recorded: %s", exc)

    t = threading.Thread(target=work, name="trainguard-drain")
    _PENDING.append(t)
    t.start()


def after_diagnosis(cfg: Any, diagnosis: Diagnosis, emit: Callable[[Event], None]) -> None:
    """A classified failure: drain the culprit hosts of a hardware root cause."""
    settings = getattr(cfg, "drain", None)
    if settings is not None:
        _in_background(cfg, diagnosis_verdicts(diagnosis, settings.min_confidence), emit)


def after_lost(cfg: Any, attempt: int, lost_nodes: Sequence[str], emit: Callable[[Event], None]) -> None:
    """Nodes recorded lost by this agent: drain them."""
    if getattr(cfg, "drain", None) is not None:
        timeout = float(getattr(cfg, "node_lost_timeout_seconds", 0.0))
        _in_background(cfg, [lost_verdict(n, attempt, timeout) for n in lost_nodes], emit)


# --- the way back ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReturnOutcome:
    """What `return_node` did."""

    status: str
    """``returned``, ``refused`` (not drained, not by trainguard, not for this user, or no health results of
    the node to judge by) or ``unhealthy`` (a check failed: still drained)."""
    node: str
    """The node asked about."""
    detail: str
    """Why, in one line."""
    passes: int = 0
    """Consecutive passing check rounds seen."""
    state: NodeState | None = None
    """The node as it was before the return."""
    results: tuple[CheckResult, ...] = ()
    """The last round of checks."""


Rounds = Callable[[NodeState], Sequence[Sequence[CheckResult]]]
"""Health rounds the node itself recorded since it was drained (given its state), oldest first."""


def refusal(state: NodeState, uid: int | None = None) -> str | None:
    """Why ``state``'s node must not be returned by trainguard for user ``uid`` (None: this process's), or None."""
    if not state.drained:
        return f"node {state.node} is not drained (state {state.state})"
    if not state.by_trainguard:
        who = f" by {state.by}" if state.by else ""
        return (f"node {state.node} was drained{who} for {state.reason or 'no reason given'!r}, not by "
                "trainguard: resume it with the scheduler's own tools")
    owner = state.owner
    uid = os.getuid() if uid is None else uid
    if owner is None:
        return (f"node {state.node} was drained for {state.reason!r}, which names no user: resume it with the "
                "scheduler's own tools")
    if owner.uid != uid:
        return (f"node {state.node} was drained by trainguard for job {owner.job} of user {owner.user} (uid "
                f"{owner.uid}), not for uid {uid}: only that user (or the scheduler's own tools) returns it")
    return None


def _failures(results: Sequence[CheckResult]) -> str:
    return "; ".join(f"{r.name}: {r.detail}" for r in results if not r.ok and r.severity == "high")


def _recorded_rounds(node: str, state: NodeState, recorded: Iterable[Sequence[CheckResult]],
                     passes: int) -> tuple[CheckResult, ...] | ReturnOutcome:
    """The last passing round of the last ``passes`` the node recorded, or the outcome that refuses it."""
    rounds = [tuple(r) for r in recorded][-passes:]
    if len(rounds) < passes:
        return ReturnOutcome("refused", node, f"{len(rounds)} health round(s) recorded by node {node} since it "
                             f"was drained, {passes} needed: run `trainguard health --record` on it",
                             state=state, results=rounds[-1] if rounds else ())
    for i, results in enumerate(rounds):
        if not healthy(results):
            return ReturnOutcome("unhealthy", node, f"recorded round {i + 1} of the last {passes} failed: "
                                 + _failures(results), passes=i, state=state, results=results)
    return rounds[-1]


def _checked_rounds(node: str, state: NodeState, check: Callable[[], Sequence[CheckResult]], passes: int,
                    interval_seconds: float, sleep: Callable[[float], None]) -> tuple[CheckResult, ...] | ReturnOutcome:
    """``passes`` rounds of ``check`` run here, ``interval_seconds`` apart: the last, or the outcome of a failure."""
    results: tuple[CheckResult, ...] = ()
    for i in range(passes):
        if i:
            sleep(interval_seconds)
        results = tuple(check())
        if not healthy(results):
            return ReturnOutcome("unhealthy", node, f"check round {i + 1} of {passes} failed: "
                                 + _failures(results), passes=i, state=state, results=results)
    return results


def return_node(adapter: SchedulerAdapter, node: str, check: Callable[[], Sequence[CheckResult]] | None = None, *,
                passes: int = 3, interval_seconds: float = 60.0, sleep: Callable[[float], None] = time.sleep,
                recorded: Rounds | None = None, uid: int | None = None) -> ReturnOutcome:
    """Resume ``node`` if trainguard drained it for user ``uid`` (None: this process's) and it passed ``passes``
    consecutive health rounds: run here with ``check`` (on the node itself), ``interval_seconds`` apart, or the
    last ``passes`` rounds of ``recorded`` (results the node recorded; from anywhere). `SchedulerError` when the
    scheduler fails."""
    if passes < 1:
        raise ValueError("passes must be at least 1")
    if (check is None) == (recorded is None):
        raise ValueError("give exactly one of check and recorded")
    try:
        state = adapter.node(node)
    except KeyError:
        return ReturnOutcome("refused", node, f"the scheduler does not know node {node}")
    why = refusal(state, uid)
    if why is not None:
        return ReturnOutcome("refused", node, why, state=state)
    if recorded is not None:
        judged = _recorded_rounds(node, state, recorded(state), passes)
    else:
        assert check is not None
        judged = _checked_rounds(node, state, check, passes, interval_seconds, sleep)
    if isinstance(judged, ReturnOutcome):
        return judged
    results = judged
    again = adapter.node(node)  # someone may have drained it for another reason meanwhile
    why = refusal(again, uid)
    if why is not None:
        return ReturnOutcome("refused", node, why, passes=passes, state=again, results=results)
    adapter.resume(node)
    return ReturnOutcome("returned", node, f"{passes} consecutive passing health checks", passes=passes,
                         state=state, results=results)


# --- command-line options of `trainguard run` -----------------------------------------------------------


def add_run_arguments(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """``--drain-bad-nodes`` and its settings."""
    d = DrainSettings()
    group.add_argument("--drain-bad-nodes", action="store_true",
                       help="drain a node in the scheduler (Slurm, Kubernetes) on a node-level verdict: hardware "
                            "root cause, failed high-severity health check, lost node, lemon (docs/operations.md)")
    group.add_argument("--drain-scheduler", default=d.scheduler, choices=SCHEDULERS,
                       help="scheduler to drain in (default auto: Slurm inside a Slurm job, Kubernetes in a pod)")
    group.add_argument("--drain-max-share", type=float, default=d.max_share, metavar="F",
                       help=f"drain at most this share of the job's nodes per window (default {d.max_share:g})")
    group.add_argument("--drain-window", type=float, default=d.window_seconds, metavar="SECONDS",
                       help=f"the rate limit's window (default {d.window_seconds:g})")
    group.add_argument("--drain-max-cluster-share", type=float, default=d.max_cluster_share, metavar="F",
                       help="refuse while trainguard's drains would exceed this share of the cluster; 1 = off "
                            f"(default {d.max_cluster_share:g})")


_FLAGS = {"scheduler": "--drain-scheduler", "max_share": "--drain-max-share", "window_seconds": "--drain-window",
          "max_cluster_share": "--drain-max-cluster-share"}


def settings_from_args(args: argparse.Namespace) -> DrainSettings | None:
    """The `DrainSettings` of ``args`` (None without ``--drain-bad-nodes``); `UsageError` naming the flag.
    With ``auto``, a scheduler must be found here (a job meant to drain nodes must not run silently without)."""
    if not getattr(args, "drain_bad_nodes", False):
        return None
    try:
        settings = DrainSettings(scheduler=args.drain_scheduler, max_share=args.drain_max_share,
                                 window_seconds=args.drain_window, max_cluster_share=args.drain_max_cluster_share)
    except ValueError as exc:
        text = str(exc)
        name = text.split(" ", 1)[0]
        raise UsageError(_FLAGS.get(name, name) + " " + text.split(" ", 1)[1]) from None
    try:
        open_adapter(settings.scheduler)
    except UsageError as exc:
        raise UsageError(f"--drain-bad-nodes: {exc}") from None
    return settings
