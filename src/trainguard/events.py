"""The event language every part of trainguard speaks: typed, versioned records.

A record is a frozen dataclass. On disk it is one JSON object per line with two envelope keys,
``"v"`` (schema version) and ``"type"`` (the record's `TYPE`), next to the record's own fields.
Real runs and simulated runs write the same records; analysis never cares which produced them.

Times: ``time`` is the writer's wall clock in Unix seconds when the record was made (for records
that describe an interval, the interval's *end*); durations are seconds, named ``*_seconds``.
Clocks of different hosts may disagree; analysis corrects for that (see `trainguard.clocks`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

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
    """``completed``, ``failed`` (restart budget spent, no progress, ...) or ``aborted`` (operator)."""
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


@dataclass(frozen=True, kw_only=True)
class CheckpointLoaded(Event):
    """A rank restored a checkpoint. ``time`` is the load's end."""

    TYPE: ClassVar[str] = "checkpoint_loaded"
    attempt: int
    rank: int
    step: int
    seconds: float
    path: str = ""
    bytes: int = 0


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


@dataclass(frozen=True, kw_only=True)
class FaultInjected(Event):
    """Chaos injection fired a fault on purpose (so tests compare injected with detected)."""

    TYPE: ClassVar[str] = "fault_injected"
    attempt: int
    rank: int
    step: int
    kind: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class FailureDetected(Event):
    """The supervisor saw a failure. ``time`` is detection; onset is ``time - detection_latency_seconds``."""

    TYPE: ClassVar[str] = "failure_detected"
    attempt: int
    kind: str
    """``crash``, ``exit``, ``hang``, ``slow``, ``sdc``, ``unhealthy``, ``unknown``."""
    ranks: tuple[int, ...] = ()
    """Ranks blamed by detection (the culprit where known, else the ranks seen failing)."""
    hosts: tuple[str, ...] = ()
    detection_latency_seconds: float = 0.0
    """From the failure's onset (last progress, process exit) to this detection."""
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
    """Localization verdict where one was made: hang, desync, mismatch, crash, p2p-hang, healthy."""
    culprit_ranks: tuple[int, ...] = ()
    culprit_hosts: tuple[str, ...] = ()
    confidence: float = 0.0
    explanation: str = ""
    evidence: tuple[str, ...] = ()


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


RECORD_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        RunStarted,
        RunEnded,
        AttemptStarted,
        AttemptEnded,
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
    )
}


def _is_tuple_type(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(_is_tuple_type(a) for a in typing.get_args(annotation))
    return origin is tuple or annotation is tuple


_TUPLE_FIELDS: dict[type[Event], frozenset[str]] = {
    cls: frozenset(
        name for name, hint in typing.get_type_hints(cls).items() if _is_tuple_type(hint)
    )
    for cls in RECORD_TYPES.values()
}


def from_dict(data: dict[str, Any]) -> Event:
    """Build a record from its JSON form. Raises ValueError (with a reason) on a bad record.

    Unknown keys are ignored, so a reader can read files from a writer of the same schema version
    that added optional fields.
    """
    type_name = data.get("type")
    cls = RECORD_TYPES.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        raise ValueError(f"unknown record type {type_name!r}")
    kwargs: dict[str, Any] = {}
    tuple_fields = _TUPLE_FIELDS[cls]
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        if f.name in tuple_fields and isinstance(value, list):
            value = tuple(value)
        kwargs[f.name] = value
    try:
        record = cls(**kwargs)
    except TypeError as exc:  # a missing required field
        raise ValueError(f"bad {type_name} record: {exc}") from None
    if not isinstance(record.time, (int, float)) or isinstance(record.time, bool):
        raise ValueError(f"bad {type_name} record: time must be a number")
    return record
