"""The node agent's straggler and telemetry duties: sample telemetry, probe flight recorders, name stragglers live
and apply the straggler policy (report, exclude the node at the next restart, or replace it by a spare now).

Called from `trainguard.launch.agent.GuardAgent` on its monitor thread, so a probe never races the failure path's
own evidence gathering (both ask the ranks' control threads to dump into the same folder). No torch.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.core.eventlog import EventFollower, EventWriter, iter_events
from trainguard.core.events import Event, StepCompleted, StragglerAction, StragglerDetected
from trainguard.core.protocol import RunLayout
from trainguard.errors import UsageError
from trainguard.stragglers.analysis import Straggler, StragglerConfig, analyze
from trainguard.stragglers.flight import read_arrivals
from trainguard.stragglers.handover import Handover
from trainguard.telemetry.samplers import Sampler, Source, default_sources

log = logging.getLogger(__name__)

POLICIES = ("report", "exclude-next-restart", "restart-now")
"""``report``: record `StragglerDetected` only. ``exclude-next-restart``: the slow rank's node also fails its
health gate at the job's next restart (as a failed high-severity check would), so a spare can take its place.
``restart-now``: when a spare waits in the rendezvous, the slow rank's node leaves the job now (a planned
interruption) and the spare takes its place; with no spare, ``exclude-next-restart``."""
MAX_SECONDS = 86_400.0
"""Longest probe or telemetry interval accepted from the command line (one day)."""
MIN_SECONDS = 0.5
"""Shortest non-zero interval accepted from the command line: each probe asks every rank for a dump."""
ANNOUNCE_POLL_SECONDS = 1.0
"""How often every agent looks for a ``restart-now`` announcement naming its node."""
PROBE_TIMEOUT_SECONDS = 2.0
KEEP_PROBES = 5
"""Probe folders kept per attempt (the oldest are deleted): each holds 2,000 collectives per rank."""
BUFFER_STEPS = 96
"""Steps per rank kept in memory for the live decision."""


@dataclass(frozen=True)
class WatchSettings:
    """How often the agent samples and probes, and what it does about a straggler."""

    policy: str = "report"
    """One of `POLICIES`."""
    probe_seconds: float = 10.0
    """Seconds between straggler checks (and flight-recorder probes for ranks without phases); 0: off."""
    telemetry_seconds: float = 10.0
    """Seconds between telemetry samples; 0: off."""

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> WatchSettings:
        """``TRAINGUARD_STRAGGLER_POLICY``, ``TRAINGUARD_STRAGGLER_PROBE_SECONDS``, ``TRAINGUARD_TELEMETRY_SECONDS``;
        a bad value is logged and the default kept (the agent must start)."""
        env = os.environ if env is None else env
        default = cls()
        policy = env.get("TRAINGUARD_STRAGGLER_POLICY", default.policy).strip() or default.policy
        if policy not in POLICIES:
            log.warning("TRAINGUARD_STRAGGLER_POLICY=%r is not one of %s; using %r", policy, POLICIES,
                        default.policy)
            policy = default.policy

        def seconds(name: str, fallback: float) -> float:
            raw = env.get(name)
            if raw is None or not raw.strip():
                return fallback
            try:
                value = float(raw)
                if value >= 0 and value == value and value != float("inf"):
                    return value
            except ValueError:
                pass
            log.warning("%s=%r is not a number of seconds >= 0; using %g", name, raw, fallback)
            return fallback

        return cls(policy, seconds("TRAINGUARD_STRAGGLER_PROBE_SECONDS", default.probe_seconds),
                   seconds("TRAINGUARD_TELEMETRY_SECONDS", default.telemetry_seconds))

    @classmethod
    def resolve(cls, policy: str | None = None, probe_seconds: float | None = None,
                telemetry_seconds: float | None = None, env: Mapping[str, str] | None = None) -> WatchSettings:
        """The environment's settings with every value given here (the command line's) taking precedence."""
        base = cls.from_environ(env)
        return cls(policy if policy is not None else base.policy,
                   probe_seconds if probe_seconds is not None else base.probe_seconds,
                   telemetry_seconds if telemetry_seconds is not None else base.telemetry_seconds)


def check_options(policy: str | None, probe_seconds: Any, telemetry_seconds: Any) -> tuple[
        str | None, float | None, float | None]:
    """Validate ``--straggler-policy``, ``--straggler-probe-seconds`` and ``--telemetry-seconds`` (None: not
    given). Returns them typed; `UsageError` (exit 2) names the flag of a bad value."""
    if policy is not None and policy not in POLICIES:
        raise UsageError(f"--straggler-policy must be one of {', '.join(POLICIES)}, got {policy!r}")

    def seconds(flag: str, raw: Any) -> float | None:
        if raw is None:
            return None
        try:
            value = float(raw)
        except (TypeError, ValueError):
            value = math.nan
        if not (value == 0 or MIN_SECONDS <= value <= MAX_SECONDS):  # NaN fails both
            raise UsageError(f"{flag} must be 0 (off) or from {MIN_SECONDS:g} to {MAX_SECONDS:g} seconds, "
                             f"got {raw!r}")
        return value

    return (policy, seconds("--straggler-probe-seconds", probe_seconds),
            seconds("--telemetry-seconds", telemetry_seconds))


class AgentWatch:
    """One per node agent. `poll` is cheap when nothing is due (two clock reads)."""

    def __init__(self, layout: RunLayout, node_id: str, emit: Callable[[Event], None],
                 settings: WatchSettings | None = None, sources: list[Source] | None = None,
                 config: StragglerConfig | None = None, handover: Handover | None = None) -> None:
        self.layout = layout
        self.handover = handover
        """How ``restart-now`` counts spares and reaches the slow node's agent (None: it falls back)."""
        self.node_id = node_id
        self.emit = emit
        self.settings = settings or WatchSettings.from_environ()
        self.config = config or StragglerConfig()
        self.attempt = -1
        self._telemetry_writer: EventWriter | None = None
        srcs = sources if sources is not None else (default_sources() if self.settings.telemetry_seconds > 0 else [])
        self.sampler = Sampler(srcs, node_id, self._write_telemetry, self.settings.telemetry_seconds)
        self._followers: dict[Path, EventFollower] = {}
        self._steps: dict[int, deque[StepCompleted]] = defaultdict(lambda: deque(maxlen=BUFFER_STEPS))
        self._named: set[tuple[int, int]] = set()
        self._dropped = False
        """A rank's buffer dropped its oldest step this attempt: it no longer starts at the attempt's start."""
        self._next_check: float | None = None
        self._next_announce_check = 0.0
        self._probes = 0
        self._leaving: str | None = None
        """Why this node leaves the job now (``restart-now`` named one of its ranks), once announced."""

    def _write_telemetry(self, record: Event) -> None:
        if self._telemetry_writer is None:
            self._telemetry_writer = EventWriter(self.layout.event_file(f"telemetry-{self.node_id}"))
        self._telemetry_writer.write(record)

    def on_attempt(self, attempt: int) -> None:
        """A new attempt starts: forget the last one's steps; one telemetry sample now (short jobs get one)."""
        self.attempt = attempt
        self._steps.clear()
        self._dropped = False
        self._next_check = time.monotonic() + self.settings.probe_seconds
        try:
            self.sampler.sample_now()
        except Exception as exc:  # telemetry must never stop the agent (a full disk: StorageError)
            log.warning("telemetry sample failed: %s", exc)

    def poll(self, live_ranks: Callable[[], Mapping[int, int]], leader: bool) -> str | None:
        """Called on every healthy monitor pass; ``live_ranks()`` gives rank -> pid of this node's live workers.

        Returns why this node must leave the job now (``restart-now`` named one of its ranks), else None."""
        try:
            self.sampler.poll()
        except Exception as exc:
            log.warning("telemetry sample failed: %s", exc)
        if self.settings.probe_seconds > 0:
            self._check_due(live_ranks, leader)
        return self._leave_now()

    def _leave_now(self) -> str | None:
        if self.handover is None or self._leaving is not None:
            return None
        now = time.monotonic()
        if now < self._next_announce_check:
            return None
        self._next_announce_check = now + ANNOUNCE_POLL_SECONDS
        told = self.handover.announced(self.attempt)
        if told is None or told[0] != self.node_id:
            return None
        if self.settings.policy != "restart-now":  # even a signed announcement must match the policy in force
            log.warning("ignored an announcement to leave for a spare: this node runs straggler policy %r",
                        self.settings.policy)
            self._next_announce_check = float("inf")
            return None
        self._leaving = told[1]
        log.warning("leaving the job now for a waiting spare: %s", told[1])
        return told[1]

    def planned_leave(self, attempt: int) -> str | None:
        """Why a node left ``attempt`` for a waiting spare (``restart-now``), if one was told to: the peers' workers
        then fail because its workers stopped, which is that planned restart and no failure of theirs."""
        told = self.handover.announced(attempt) if self.handover is not None else None
        return told[1] if told is not None else None

    def _check_due(self, live_ranks: Callable[[], Mapping[int, int]], leader: bool) -> None:
        now = time.monotonic()
        if self._next_check is None or now < self._next_check:
            return
        self._next_check = now + self.settings.probe_seconds
        try:
            self._read_steps()
            live = live_ranks()
            if live and not self._have_phases():
                self.probe(live)
            if leader:
                self.check()
        except Exception as exc:  # the watch must never stop the job
            log.warning("straggler check failed: %s", exc)

    def finish(self, leader: bool) -> None:
        """The attempt's workers all finished: one last check of its steps (the leader's), so that a job shorter
        than ``probe_seconds`` still has its stragglers recorded. Steps only: the ranks are gone, nothing to probe."""
        if self.settings.probe_seconds <= 0 or not leader:
            return
        try:
            self._read_steps()
            self.check()
        except Exception as exc:  # the watch must never stop the job
            log.warning("straggler check failed: %s", exc)

    # --- flight-recorder probes ---------------------------------------------------------------------

    def probe_dir(self, n: int) -> Path:
        return self.layout.root / "diagnostics" / "stragglers" / f"attempt-{self.attempt}" / f"probe-{n}"

    def probe(self, live: Mapping[int, int]) -> int:
        """Ask every live local rank for a flight-recorder dump and move it out of the evidence folder (where a
        later failure's evidence goes) into this attempt's probe folder. Returns the dumps kept."""
        from trainguard.worker.control import request_all

        evidence = self.layout.diagnostics_dir(self.attempt)
        target = self.probe_dir(self._probes)
        names: list[str] = []
        for rank, reply in request_all(live, {"cmd": "dump"}, PROBE_TIMEOUT_SECONDS, max_parallel=8).items():
            if not isinstance(reply, dict):
                log.debug("probe of rank %d: %s", rank, reply)
                continue
            names.extend(f for f in reply.get("files", []) if isinstance(f, str) and "/" not in f)
        kept = 0
        for name in names:
            src = evidence / name
            if not src.is_file():
                continue
            if name.startswith("fr_trace_rank_"):
                target.mkdir(parents=True, exist_ok=True, mode=0o750)
                os.replace(src, target / name)
                kept += 1
            else:  # the stacks: not needed, and must not pass for a later failure's evidence
                src.unlink(missing_ok=True)
        if kept:
            self._probes += 1
            old = self.probe_dir(self._probes - 1 - KEEP_PROBES)
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        return kept

    # --- live decision --------------------------------------------------------------------------------

    def _read_steps(self) -> None:
        for path in self.layout.events_dir.glob("rank-*.jsonl"):
            follower = self._followers.get(path)
            if follower is None:
                follower = self._followers[path] = EventFollower(path)
            for e in follower.new_records():
                if isinstance(e, StepCompleted) and e.attempt == self.attempt:
                    q = self._steps[e.rank]
                    self._dropped = self._dropped or len(q) == q.maxlen
                    q.append(e)

    def _have_phases(self) -> bool:
        recent = [q[-1] for q in self._steps.values() if q]
        return bool(recent) and all("comm_wait" in e.phases for e in recent)

    def check(self) -> list[StragglerDetected]:
        """Name new stragglers of this attempt from the buffered steps (and probes); emit and return them."""
        records: list[Event] = [e for q in self._steps.values() for e in q]
        if len(self._steps) < 2:
            return []
        arrivals = None if self._have_phases() else read_arrivals(self.layout.root)
        # While every buffer still holds its rank's first step, a rank slow since the start can be judged too.
        report = analyze(records, arrivals, self.config, from_start=not self._dropped)
        out = []
        for s in report.stragglers:
            key = (self.attempt, s.rank)
            if key in self._named:
                continue
            self._named.add(key)
            action, spares, why = self._decide(s)
            record = StragglerDetected(
                time=time.time(), host=self.node_id, attempt=self.attempt, rank=s.rank, node=s.host,
                step=s.detected_step, onset_step=s.onset_step, slowdown=s.slowdown, cost_seconds=s.cost_seconds,
                signal=s.signal, action=action,
                detail=(f"rank {s.rank} on {s.host or '?'} ready {s.lead_seconds * 1e3:.1f} ms after the others "
                        f"per step since step {s.onset_step}: job steps {s.slowdown:.2f}x slower"))
            log.warning("straggler: %s (action: %s)", record.detail, action)
            self.emit(record)
            self.emit(StragglerAction(time=time.time(), host=self.node_id, attempt=self.attempt, rank=s.rank,
                                      node=s.host, policy=self.settings.policy, action=action,
                                      spares_waiting=spares, detail=why))
            out.append(record)
        return out

    def _decide(self, s: Straggler) -> tuple[str, int, str]:
        """(action, spares waiting, why) for a newly named straggler under this node's policy."""
        policy = self.settings.policy
        if policy != "restart-now":
            return policy, 0, f"policy {policy}"
        spares = self.handover.spares_waiting() if self.handover is not None else 0
        if spares > 0 and s.host and self.handover is not None:
            why = f"{spares} spare node(s) waiting: node {s.host} leaves now"
            reason = _reason(s.rank, s.slowdown, self.attempt, s.onset_step) + f" (restart-now: {why})"
            try:  # announced before it is recorded: the record never claims a departure nobody was told of
                self.handover.announce(self.attempt, s.host, reason)
                return "restart-now", spares, why
            except Exception as exc:
                return ("exclude-next-restart", spares,
                        f"could not tell node {s.host} to leave ({exc}): falling back to exclude-next-restart")
        where = "" if s.host else " (the rank's node is unknown)"
        return ("exclude-next-restart", spares,
                f"no spare waiting{where}: falling back to exclude-next-restart")

    def exclusion_reasons(self, attempt: int) -> list[str]:
        """Reasons for this node to leave at this (re)start: stragglers named on it under ``exclude-next-restart``."""
        if self._leaving is not None:
            return [self._leaving]
        reasons = []
        for path in sorted(self.layout.events_dir.glob("agent-*.jsonl")):
            try:
                for _, e in iter_events(path):
                    # restart-now too: a node that missed the announcement still leaves at the restart
                    if (isinstance(e, StragglerDetected) and e.action in ("exclude-next-restart", "restart-now")
                            and e.node == self.node_id and e.attempt < attempt):
                        reasons.append(_reason(e.rank, e.slowdown, e.attempt, e.onset_step))
            except Exception as exc:  # an unreadable file tells nothing about stragglers
                log.debug("%s: %s", path, exc)
        return reasons[:1]

    def close(self) -> None:
        self.sampler.close()
        if self._telemetry_writer is not None:
            self._telemetry_writer.close()


def _reason(rank: int, slowdown: float, attempt: int, onset_step: int) -> str:
    """The exclusion reason a straggler gives its node."""
    return f"straggler: rank {rank} slowed the job {slowdown:.2f}x (attempt {attempt}, from step {onset_step})"
