"""What the node agent does after each thing that happens to an attempt: one pure place (no torch, no clock).

`Attempts` owns the attempt number, the restart budget (`trainguard.launch.budget.RestartBudget`) with its
refunds, and the no-progress rule (`trainguard.launch.policy.NoProgressRule`). The agent
(`trainguard.launch.agent.GuardAgent`) turns torch's callbacks into the events below and carries out the
decision it gets back; `trainguard.launch.inprocess` carries out an `InProcess` one. torch's own restart
counter is set from `Attempts.restarts_left` in one place (`trainguard.torch_api.elastic`).

Events: `Crash`, `Hang`, `NodeLost`, `Corruption` (a failed attempt), `StragglerLeave` (a node hands its
place to a waiting spare), `HealthGate` (the checks before a start), `InProcessDone` (how an in-process
restart ended). Decisions: `Restart` (whole-process, torch's loop), `InProcess`, `Stop`, `Leave`, `Exclude`,
`Proceed`.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.launch.budget import RestartBudget
from trainguard.launch.policy import AttemptOutcome, NoProgressRule

__all__ = [
    "Attempts", "Corruption", "Crash", "Decision", "Event", "Exclude", "Hang", "HealthGate", "InProcess",
    "InProcessDone", "Leave", "NodeLost", "Proceed", "Restart", "Stop", "StragglerLeave",
]

# --- events ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Crash:
    """Local workers exited with an error (or were killed by a signal)."""

    ranks: tuple[int, ...]
    """Global ranks that exited: the ones an in-process restart replaces."""
    kind: str
    """``crash`` (a signal or an abort) or ``exit`` (an error exit), as `trainguard.launch.blame` names it."""
    outcome: AttemptOutcome
    """What the attempt achieved (for the no-progress rule)."""
    replaceable: bool = False
    """Every failed rank runs on this node, the job has one node and its processes can be replaced in place."""


@dataclass(frozen=True)
class Hang:
    """The watchdog found the job hung; ``ranks`` are the culprits it blamed."""

    ranks: tuple[int, ...]
    """Global ranks blamed (killed and replaced by an in-process restart)."""
    outcome: AttemptOutcome
    """What the attempt achieved."""
    replaceable: bool = False
    """As for `Crash`."""


@dataclass(frozen=True)
class NodeLost:
    """A peer node stopped beating (or its death was echoed by our ranks' error exits)."""

    outcome: AttemptOutcome
    """What the attempt achieved."""


@dataclass(frozen=True)
class Corruption:
    """A rank found replicas that disagree (silent data corruption)."""

    outcome: AttemptOutcome
    """What the attempt achieved."""


@dataclass(frozen=True)
class StragglerLeave:
    """A node left the attempt for a waiting spare (straggler policy ``restart-now``)."""

    reason: str
    """Why it left (the straggler finding)."""
    this_node: bool
    """True: this node is the one that leaves; False: a peer left and our ranks failed because of it."""


@dataclass(frozen=True)
class HealthGate:
    """The checks before a (re)start of this node: health, lemon, stragglers, corruption."""

    failures: tuple[str, ...]
    """Why this node must not take part (empty: it may)."""


@dataclass(frozen=True)
class InProcessDone:
    """How the pending in-process restart ended."""

    recovered: bool
    """True: every rank re-formed the process group; False: it timed out."""
    why: str = ""
    """Why it was given up (when not recovered)."""


Event = Crash | Hang | NodeLost | Corruption | StragglerLeave | HealthGate | InProcessDone
"""Everything `Attempts.decide` answers."""

# --- decisions ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Restart:
    """Restart every local worker (torch's loop does, from the next rendezvous)."""

    planned: bool = False
    """A planned interruption (a membership change): its restart was given back to the budget."""
    abandoned: str | None = None
    """An in-process restart was pending and is given up for this one, because of this."""


@dataclass(frozen=True)
class InProcess:
    """Replace only ``ranks``' processes and let the survivors re-form the group, as attempt ``attempt``."""

    ranks: tuple[int, ...]
    """Global ranks that get new processes."""
    kill: bool
    """Kill them first (hung ranks are still alive)."""
    kind: str
    """What failed: ``crash``, ``exit`` or ``hang``."""
    previous: int
    """The attempt that failed (its survivors are told to go on)."""
    attempt: int
    """The attempt the survivors and the new processes form."""


@dataclass(frozen=True)
class Stop:
    """No more restarts: the run ends failed."""

    reason: str
    """Why (the no-progress rule, the spent budget, torch)."""
    abandoned: str | None = None
    """As for `Restart`."""


@dataclass(frozen=True)
class Leave:
    """This node ends its attempt as a planned interruption; the next health gate excludes it and a spare
    takes its place."""

    reason: str
    """Why it leaves."""


@dataclass(frozen=True)
class Exclude:
    """This node leaves the job before starting workers (`trainguard.launch.admission.exclude`)."""

    reason: str
    """Every failed check, joined."""


@dataclass(frozen=True)
class Proceed:
    """Nothing to change: start the workers, or keep watching them."""


Decision = Restart | InProcess | Stop | Leave | Exclude | Proceed
"""Everything `Attempts.decide` returns."""


class Attempts:
    """The attempt number, the restart budget and the no-progress rule of one node agent, and the decision
    for each event. Pure: no torch, no processes, no clock."""

    def __init__(self, max_restarts: int, max_no_progress_attempts: int, in_process: bool = False) -> None:
        self.number = -1
        """The current attempt (-1 before the first rendezvous)."""
        self.budget = RestartBudget(max_restarts)
        """Restarts left; torch's counter is set from it (`restarts_left`)."""
        self.rule = NoProgressRule(max_no_progress_attempts, max_restarts)
        self.in_process = in_process
        """Failures may be recovered in process (``--in-process``)."""
        self.pending: InProcess | None = None
        """The in-process restart started and not yet done."""

    # --- the attempt number and the budget ----------------------------------------------------------------

    def rendezvous(self) -> int:
        """A (re)start through torch's rendezvous begins the next attempt; returns its number."""
        self.number += 1
        return self.number

    def numbered(self, job_attempt: int) -> int:
        """After a rendezvous: the job-wide number of the round joined (`trainguard.launch.numbering`). Never below
        the local count: an in-process restart of a one-node job counts without a round."""
        self.number = max(self.number, job_attempt)
        return self.number

    def joined(self, attempts_ended: int) -> int:
        """After the first rendezvous: a spare joining a running job continues the job's attempt numbers."""
        self.number = max(self.number, attempts_ended)
        return self.number

    def restarts_left(self) -> int:
        """What torch's loop reads after each monitor round."""
        return self.budget.remaining()

    @property
    def stop_reason(self) -> str | None:
        """Why restarts stopped before the budget was spent, or None."""
        return self.budget.stop_reason

    def torch_restarted(self, counted: bool) -> None:
        """torch restarts the group; ``counted``: it charged its counter (a failure, not a membership change)."""
        if counted:
            self.budget.spend()

    def torch_stopped(self) -> None:
        """torch itself disabled restarts."""
        self.budget.stop("torch disabled restarts (a worker stuck in uninterruptible sleep)")

    # --- decisions ----------------------------------------------------------------------------------------

    def decide(self, event: Event) -> Decision:
        """The one answer to ``event``; updates the budget and the attempt number it implies."""
        if isinstance(event, HealthGate):
            return Exclude("; ".join(event.failures)) if event.failures else Proceed()
        if isinstance(event, StragglerLeave):
            self.budget.refund()  # a membership change is not a retry (torch's rule for joining nodes)
            return Leave(event.reason) if event.this_node else Restart(planned=True)
        if isinstance(event, InProcessDone):
            return self._in_process_done(event)
        return self._failed(event)

    def _failed(self, event: Crash | Hang | NodeLost | Corruption) -> Decision:
        """A failed attempt: the no-progress rule and the budget first, then in process if it can be."""
        verdict = self.rule.on_failure(event.outcome, self.budget.remaining())
        if verdict.stop:
            self.budget.stop(verdict.reason or "the no-progress rule stopped restarts")
        abandoned = self._abandon(event) if self.pending is not None else None
        if self.budget.stop_reason is not None:
            return Stop(self.budget.stop_reason, abandoned)
        if abandoned is None and self.in_process and isinstance(event, Crash | Hang) and event.ranks \
                and event.replaceable and self.budget.remaining() > 0:
            return self._start_in_process(event)
        return Restart(abandoned=abandoned)

    def _start_in_process(self, event: Crash | Hang) -> InProcess:
        self.budget.spend()
        previous = self.number
        self.number += 1  # an in-process restart has no rendezvous that would count it
        kind, kill = (event.kind, False) if isinstance(event, Crash) else ("hang", True)
        self.pending = InProcess(tuple(sorted(event.ranks)), kill, kind, previous, self.number)
        return self.pending

    def _abandon(self, event: Crash | Hang | NodeLost | Corruption) -> str:
        """A failure while an in-process restart is pending: it is given up for a whole-process restart."""
        self.pending = None
        self.budget.refund()  # the in-process try and its fallback count as one restart
        ranks = event.ranks if isinstance(event, Crash | Hang) else ()
        if ranks:
            return f"rank(s) {', '.join(map(str, ranks))} failed during the recovery"
        return f"{type(event).__name__} during the recovery"

    def _in_process_done(self, event: InProcessDone) -> Decision:
        if self.pending is None:
            return Proceed()
        self.pending = None
        if event.recovered:
            return Proceed()
        self.budget.refund()  # the in-process try and its fallback count as one restart
        if self.budget.stop_reason is not None:
            return Stop(self.budget.stop_reason, event.why)
        return Restart(abandoned=event.why)
