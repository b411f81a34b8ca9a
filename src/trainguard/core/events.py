"""The event language every part of trainguard speaks: typed, versioned records.

A record is a frozen dataclass. On disk it is one JSON object per line with two envelope keys,
``"v"`` (schema version) and ``"type"`` (the record's `TYPE`), next to the record's own fields.
Real runs and simulated runs write the same records; analysis never cares which produced them.

Times: ``time`` is the writer's wall clock in Unix seconds when the record was made (for records
that describe an interval, the interval's *end*); durations are seconds, named ``*_seconds``.
Clocks of different hosts may disagree; analysis corrects for that (see `trainguard.core.clocks`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

SCHEMA_VERSION = 1
"""Bumped when a record changes incompatibly. Readers refuse files with a newer version."""


@dataclass(frozen=True, kw_only=True)
class Event:
    """Fields every record has."""

    TYPE: ClassVar[str] = ""
    time: float
    """Writer's wall clock, Unix seconds (end of the interval for interval records)."""
    host: str = ""
    """Host name of the writer; used to correct clock skew between hosts."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form, envelope included."""
        out: dict[str, Any] = {"v": SCHEMA_VERSION, "type": self.TYPE}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


# --- run and attempt lifecycle -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RunStarted(Event):
    """The supervisor (or a simulator) started a job."""

    TYPE: ClassVar[str] = "run_started"
    run_id: str
    world_size: int = 0
    """Ranks in the first attempt."""
    nnodes: int = 1
    target_steps: int | None = None
    synthetic: bool = False
    """True for generated or simulated runs, so no one mistakes them for a real job."""
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class RunEnded(Event):
    """The job ended for good."""

    TYPE: ClassVar[str] = "run_ended"
    run_id: str
    status: str
    """``completed``, ``failed`` (restart budget spent, no progress, ...), ``aborted`` (operator), ``excluded`` or
    ``lost`` (the run folder was deleted or replaced mid-run)."""
    reason: str = ""
    exit_code: int = 0
    completed_steps: int | None = None


@dataclass(frozen=True, kw_only=True)
class AttemptStarted(Event):
    """One launch of all workers (attempt 0 is the first launch, then one per restart)."""

    TYPE: ClassVar[str] = "attempt_started"
    attempt: int
    world_size: int = 0
    hosts: tuple[str, ...] = ()
    resume_step: int | None = None
    """Step of the checkpoint the workers were told to restore, if any."""
    recovery: str = ""
    """How the attempt's workers came up: ``""`` (not said: the first launch, older files), ``restart`` (every
    worker launched anew) or ``in-process`` (surviving ranks re-entered their training function, only the
    failed ranks got new processes; see `InProcessRecovery`)."""
    warm_starts: int = 0
    """Local ranks of this attempt on this host whose processes were warm spares (interpreters started
    ahead with torch and the script's imports loaded) rather than cold starts."""


@dataclass(frozen=True, kw_only=True)
class InProcessRecovery(Event):
    """How an in-process restart ended: every rank formed the new process group, or the agent gave up on it
    and restarted every worker (``fallback``)."""

    TYPE: ClassVar[str] = "inprocess_recovery"
    attempt: int
    """The attempt the in-process restart opened."""
    status: str
    """``recovered`` or ``fallback``."""
    ranks: tuple[int, ...] = ()
    """Global ranks that got new processes."""
    failure_kind: str = ""
    """The failure it answered: ``crash``, ``exit`` or ``hang``."""
    seconds: float = 0.0
    """From the agent's start of the recovery to the complete process group (or to giving up)."""
    warm_spares_used: int = 0
    """How many of the new processes were warm spares (torch already imported) rather than cold starts."""
    detail: str = ""
    """Why it fell back, one line."""


@dataclass(frozen=True, kw_only=True)
class AttemptEnded(Event):
    """All workers of an attempt are gone."""

    TYPE: ClassVar[str] = "attempt_ended"
    attempt: int
    reason: str
    """``completed``, ``failure``, ``planned`` (maintenance), ``stopped`` (operator or budget)."""
    exit_code: int | None = None


@dataclass(frozen=True, kw_only=True)
class PlannedInterruption(Event):
    """An interruption on purpose (firmware upgrade, config change, preemption notice)."""

    TYPE: ClassVar[str] = "planned_interruption"
    attempt: int
    reason: str = ""


# --- training progress ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StepCompleted(Event):
    """One rank finished one training step. ``time`` is the step's end."""

    TYPE: ClassVar[str] = "step_completed"
    attempt: int
    rank: int
    step: int
    """Number of the step just finished; the first step is 1."""
    duration_seconds: float
    """From the step's start to its end (the start is ``time - duration_seconds``)."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds per phase: data, forward_backward, comm_wait, optimizer, checkpoint, ..."""
    loss: float | None = None
    numbering: str = ""
    """Where ``step`` comes from, i.e. whether it says where training resumed: ``script``
    (``trainguard.attach()``), ``framework`` (a framework's own global step, reported by its adapter),
    ``optimizer`` (the optimizer's own step count: it continues across restarts only when the script
    restores the optimizer), ``attempt`` (steps counted from 1 in this attempt: it says nothing about the
    resume point) or ``""`` (not said: simulations, older files; read as the script's own numbering)."""
    epoch: float | None = None
    """The framework's epoch at the step's end (fractional where the framework says so), if known."""


STEP_NUMBERINGS = ("", "script", "framework", "optimizer", "attempt")
"""The values of `StepCompleted.numbering`."""


@dataclass(frozen=True, kw_only=True)
class StepSpan(Event):
    """A run of consecutive steps summarized in one record (simulations, or sparse real logging).

    Counts as steps ``first_step..last_step`` evenly spread over ``duration_seconds`` ending at ``time``.
    """

    TYPE: ClassVar[str] = "step_span"
    attempt: int
    rank: int
    first_step: int
    last_step: int
    duration_seconds: float
    loss: float | None = None


# --- checkpoints ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CheckpointSaveStarted(Event):
    """A rank began saving the state of ``step``."""

    TYPE: ClassVar[str] = "checkpoint_save_started"
    attempt: int
    rank: int
    step: int
    framework: str = ""
    """Who saved: ``""`` (trainguard's checkpointer), the framework whose own save this is (``transformers``,
    ``lightning``), reported by its adapter, or the library whose public save call was observed (``torch``,
    ``safetensors``, ``accelerate``, ``fabric``; see ``entry``)."""
    entry: str = ""
    """The public call observed (``torch.save``, ``dcp.save``, ``accelerate.save_state``, ...;
    `trainguard.worker.ckpt_entries`); ``""`` when an adapter or trainguard's checkpointer reported it."""
    tier: str = ""
    """Where the copy lives: ``""`` = storage (checkpoint files), ``memory`` = this node's memory tier,
    ``peer`` = a peer node's replica of it."""


@dataclass(frozen=True, kw_only=True)
class CheckpointSaveFinished(Event):
    """A save ended (successfully or not). ``time`` is when it was durable (or failed)."""

    TYPE: ClassVar[str] = "checkpoint_save_finished"
    attempt: int
    rank: int
    step: int
    blocking_seconds: float
    """Time training was stopped for this save (staging for async saves)."""
    total_seconds: float
    """From the save's start until the checkpoint was committed."""
    bytes: int = 0
    path: str = ""
    ok: bool = True
    error: str = ""
    framework: str = ""
    """Who saved: ``""`` (trainguard's checkpointer), the framework whose own save this is (``transformers``,
    ``lightning``), reported by its adapter, or the library whose public save call was observed (``torch``,
    ``safetensors``, ``accelerate``, ``fabric``; see ``entry``)."""
    entry: str = ""
    """The public call observed (``torch.save``, ``dcp.save``, ``accelerate.save_state``, ...;
    `trainguard.worker.ckpt_entries`); ``""`` when an adapter or trainguard's checkpointer reported it."""
    tier: str = ""
    """Where the copy lives: ``""`` = storage (checkpoint files), ``memory`` = this node's memory tier,
    ``peer`` = a peer node's replica of it."""


@dataclass(frozen=True, kw_only=True)
class CheckpointLoaded(Event):
    """A rank restored a checkpoint. ``time`` is the load's end."""

    TYPE: ClassVar[str] = "checkpoint_loaded"
    attempt: int
    rank: int
    step: int
    """The step the checkpoint holds: training continues with step ``step + 1`` (the resume point)."""
    seconds: float
    path: str = ""
    bytes: int = 0
    framework: str = ""
    """Who restored: ``""`` (trainguard's checkpointer), the framework whose own resume this is
    (``transformers``, ``lightning``), reported by its adapter, or the library whose public load call was
    observed (``torch``, ``safetensors``, ``accelerate``, ``fabric``; see ``entry``)."""
    entry: str = ""
    """The public call observed (``torch.load``, ``dcp.load``, ``accelerate.load_state``, ...); ``""`` when an
    adapter or trainguard's checkpointer reported it."""
    step_source: str = ""
    """Where ``step`` comes from (`LOADED_STEP_SOURCES`): ``""`` (the writer knew it: trainguard's checkpointer,
    an adapter), ``content`` (a top-level ``global_step``/``step``/``iteration``/``iter`` of what was loaded),
    ``name`` (the file's or folder's name: ``step-N``, ``checkpoint_N``, ``epoch=E-step=N``, ``iter_N``),
    ``optimizer`` (the restored optimizer's own step count) or ``unknown`` (``step`` is 0 and says nothing)."""
    epoch: float | None = None
    """A top-level ``epoch`` of what was loaded, if it held one."""
    tier: str = ""
    """Where the copy lives: ``""`` = storage (checkpoint files), ``memory`` = this node's memory tier,
    ``peer`` = a peer node's replica of it."""


LOADED_STEP_SOURCES = ("", "content", "name", "optimizer", "unknown")
"""The values of `CheckpointLoaded.step_source`."""


@dataclass(frozen=True, kw_only=True)
class CheckpointRejected(Event):
    """A checkpoint failed verification on restore and was skipped."""

    TYPE: ClassVar[str] = "checkpoint_rejected"
    attempt: int
    step: int
    path: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class CheckpointPolicyChanged(Event):
    """The checkpoint interval was (re)computed."""

    TYPE: ClassVar[str] = "checkpoint_policy_changed"
    policy: str
    """``steps``, ``seconds``, ``young``, ``daly`` or ``auto``."""
    interval_seconds: float | None = None
    interval_steps: int | None = None
    save_cost_seconds: float | None = None
    mtbf_seconds: float | None = None


# --- faults, diagnosis, nodes --------------------------------------------------------------------


NODE_FAULT_RANK = -1
"""`FaultInjected.rank` of a fault that hit a node (its agent, all its ranks) rather than one rank."""


@dataclass(frozen=True, kw_only=True)
class FaultInjected(Event):
    """Chaos injection fired a fault on purpose (so tests compare injected with detected)."""

    TYPE: ClassVar[str] = "fault_injected"
    attempt: int
    rank: int
    """The rank the fault hit; ``NODE_FAULT_RANK`` (-1) for a fault of a whole node (``params["node"]``)."""
    step: int
    kind: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class FailureDetected(Event):
    """The supervisor saw a failure. ``time`` is detection; onset is ``time - detection_latency_seconds``."""

    TYPE: ClassVar[str] = "failure_detected"
    attempt: int
    kind: str
    """``crash``, ``exit``, ``hang``, ``slow``, ``sdc``, ``unhealthy``, ``node-lost`` (a whole node's agent stopped
    beating: ``hosts`` names it, ``ranks`` are its ranks), ``unknown``."""
    ranks: tuple[int, ...] = ()
    """Ranks blamed by detection (the culprit where known, else the ranks seen failing)."""
    hosts: tuple[str, ...] = ()
    detection_latency_seconds: float = 0.0
    """From the failure's onset to this detection; ``latency_from`` says what the onset is."""
    latency_from: str = ""
    """What the latency is counted from: ``fault`` (the injected fault's own record: exact, up to the hosts'
    clocks), ``last-progress`` (a hang: the job's last progress the watchdog saw, an estimate within about a
    step of the fault, docs/run.md), ``""`` (the last time the agent saw every worker alive: a crash or exit,
    an upper bound by at most the monitor interval)."""
    step: int | None = None
    """Last step completed before the failure, if known."""
    evidence: tuple[str, ...] = ()
    """Paths (relative to the run directory) of dumps, stacks, logs."""
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class Diagnosis(Event):
    """Root cause of a failure: a localization verdict and/or a classification."""

    TYPE: ClassVar[str] = "diagnosis"
    attempt: int
    category: str
    """Llama 3 Table 5 category (``Faulty GPU``, ``Software Bug``, ...) or ``Unknown``."""
    group: str = "Unknown"
    """Table 5 group: GPU, Host, Network, Dependency, Unplanned Maintenance, Unknown."""
    verdict: str = ""
    """Localization verdict where one was made: hang, desync, mismatch, crash, p2p-hang, healthy, node-lost."""
    culprit_ranks: tuple[int, ...] = ()
    culprit_hosts: tuple[str, ...] = ()
    confidence: float = 0.0
    explanation: str = ""
    evidence: tuple[str, ...] = ()
    cause: str = ""
    """The classifier's one-line reason for the category ("a Python package is missing: numpy"); empty if none."""


@dataclass(frozen=True, kw_only=True)
class HealthCheckResult(Event):
    """One health check on one node."""

    TYPE: ClassVar[str] = "health_check"
    name: str
    severity: str
    """``high`` (exclude now) or ``low`` (drain later)."""
    ok: bool
    detail: str = ""
    skipped: bool = False
    attempt: int | None = None


@dataclass(frozen=True, kw_only=True)
class NodeExcluded(Event):
    """A node was taken out of the job (failed check, lemon, repeated culprit)."""

    TYPE: ClassVar[str] = "node_excluded"
    node: str
    reason: str
    attempt: int | None = None
    replaced_by: str = ""
    """Spare node that took its place, if any."""


@dataclass(frozen=True, kw_only=True)
class NodeDrained(Event):
    """The drain policy acted on a node-level verdict: it drained the node in the scheduler, or decided not to
    (`trainguard.health.drain`, docs/operations.md). ``host`` is the agent that decided."""

    TYPE: ClassVar[str] = "node_drained"
    node: str
    status: str
    """``drained`` (the scheduler took it), ``refused`` (a limit said no, or the node is not in the job's
    allocation), ``failed`` (the scheduler could not be told) or ``already-drained`` (someone drained it before;
    nothing changed)."""
    cause: str = ""
    """The verdict: ``hardware`` (a GPU, host or network root cause naming this host), ``health`` (a failed
    high-severity check), ``lost`` (the node stopped beating) or ``lemon`` (fleet history)."""
    reason: str = ""
    """The reason given to the scheduler (``trainguard: Xid 79 GPU 0000:18:00, run R attempt 2``)."""
    scheduler: str = ""
    """``slurm`` or ``kubernetes``."""
    attempt: int | None = None
    detail: str = ""
    """Why it was refused or failed; for ``drained``, the rate-limit arithmetic."""


@dataclass(frozen=True, kw_only=True)
class NodeReturned(Event):
    """``trainguard health --return-node`` resumed a node trainguard had drained, after it passed its checks."""

    TYPE: ClassVar[str] = "node_returned"
    node: str
    scheduler: str = ""
    passes: int = 0
    """Consecutive passing health checks before the return."""
    drained_reason: str = ""
    """The reason the node had been drained with."""
    drained_since: float | None = None
    """When it was drained (Unix seconds), as the scheduler said."""
    detail: str = ""


# --- stragglers and telemetry ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StragglerDetected(Event):
    """A rank held back a synchronous job for several windows in a row (`trainguard.stragglers`)."""

    TYPE: ClassVar[str] = "straggler_detected"
    attempt: int
    rank: int
    """The slow rank."""
    node: str = ""
    """Host (node id) of the slow rank."""
    step: int = 0
    """Step at which it was named."""
    onset_step: int = 0
    """First step of the slow stretch."""
    slowdown: float = 1.0
    """Job step time with the rank / without it (median over the slow stretch)."""
    cost_seconds: float = 0.0
    """Job time the rank had cost when named (what-if: the same steps without it)."""
    signal: str = ""
    """Evidence used: ``phases`` (own work vs. comm_wait) or ``flight-recorder`` (collective arrival times)."""
    action: str = "report"
    """Policy applied: ``report``, ``exclude-next-restart`` (the node leaves at the next restart) or
    ``restart-now`` (the node leaves now and a waiting spare takes its place)."""
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class StragglerAction(Event):
    """What the straggler policy decided about a named straggler, and why (`trainguard.stragglers.watch`)."""

    TYPE: ClassVar[str] = "straggler_action"
    attempt: int
    rank: int
    node: str = ""
    """Host (node id) of the slow rank."""
    policy: str = ""
    """Policy asked for: ``report``, ``exclude-next-restart`` or ``restart-now``."""
    action: str = ""
    """Action taken; ``exclude-next-restart`` when ``restart-now`` found no spare waiting."""
    spares_waiting: int = 0
    """Nodes waiting in the rendezvous to join (only counted under ``restart-now``)."""
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class TelemetrySample(Event):
    """One reading of one device's thermal and power state (`trainguard.telemetry.samplers`); absent values are null."""

    TYPE: ClassVar[str] = "telemetry_sample"
    source: str = ""
    """``gpu`` (NVML) or ``cpu`` (/sys cpufreq and thermal zones)."""
    device: str = ""
    """``gpu<i>`` or ``cpu`` (all CPUs of the host in one record)."""
    temperature_c: float | None = None
    """GPU core temperature; for ``cpu`` the hottest thermal zone."""
    clock_mhz: float | None = None
    """Current SM clock (GPU) or mean current CPU frequency."""
    max_clock_mhz: float | None = None
    """Highest clock the device can run at (NVML max SM clock, cpuinfo_max_freq)."""
    power_watts: float | None = None
    """Board power draw (GPU only)."""
    throttle_reasons: int | None = None
    """NVML clocks-event-reason bit mask (0x4 power cap, 0x8 HW slowdown, 0x20 SW thermal, 0x40 HW thermal,
    0x80 power brake); null where not available."""


def final_run_end(records: Iterable[Event]) -> RunEnded | None:
    """The run's last ``run_ended`` record (by time), or None. A job its scheduler requeued after a failure (the
    Slurm recipe) has one per allocation; only the last one ends the run, the earlier ones are interruptions."""
    ends = [r for r in records if isinstance(r, RunEnded)]
    return max(ends, key=lambda r: r.time) if ends else None


RECORD_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        RunStarted,
        RunEnded,
        AttemptStarted,
        AttemptEnded,
        InProcessRecovery,
        PlannedInterruption,
        StepCompleted,
        StepSpan,
        CheckpointSaveStarted,
        CheckpointSaveFinished,
        CheckpointLoaded,
        CheckpointRejected,
        CheckpointPolicyChanged,
        FaultInjected,
        FailureDetected,
        Diagnosis,
        HealthCheckResult,
        NodeExcluded,
        NodeDrained,
        NodeReturned,
        StragglerDetected,
        StragglerAction,
        TelemetrySample,
    )
}
