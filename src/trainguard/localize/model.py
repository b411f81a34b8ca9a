"""Records of a localization: the evidence entries, the problems found, and the whole report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

VERDICTS = ("healthy", "hang", "desync", "mismatch", "crash", "p2p-hang", "incomplete", "insufficient-evidence")
"""Every verdict a report can carry (see docs/localize.md)."""


@dataclass(frozen=True)
class EntryView:
    """The parts of one flight-recorder entry kept as evidence (raw entries are dropped after reading)."""

    rank: int
    """Global rank of the dump it came from."""
    record_id: int
    """Position in the rank's recorder (``record_id``)."""
    seq: int
    """Collective sequence number in its group (p2p sequence number for point-to-point ops)."""
    op: str
    """Operation without the backend prefix: ``all_reduce``, ``send``, ..."""
    profiling_name: str
    """As recorded: ``gloo:all_reduce``, ``nccl:send 0->1``."""
    is_p2p: bool
    state: str
    """``completed``, ``started``, ``scheduled`` (NCCL); gloo entries stay ``scheduled``."""
    completed: bool
    """Finished: NCCL state ``completed``; gloo ``retired`` (gloo also retires failed work)."""
    input_sizes: Any = None
    output_sizes: Any = None
    input_dtypes: Any = None
    output_dtypes: Any = None
    peer: int | None = None
    """Global rank of the other side of a send/recv."""
    frames: tuple[str, ...] = ()
    """Stack of the call that issued the op, innermost first, as ``name (file:line)``."""
    time_created_ns: int | None = None
    retired: bool = False
    """Removed from the work list; on NCCL a retired entry that never completed timed out."""
    after_seq: int | None = None
    """For a send/recv: the group's collective sequence number when it was posted (the collective
    before it); None for collectives and where the format has one counter for both."""

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "record_id": self.record_id,
            "seq": self.seq,
            "op": self.op,
            "profiling_name": self.profiling_name,
            "is_p2p": self.is_p2p,
            "state": self.state,
            "completed": self.completed,
            "input_sizes": self.input_sizes,
            "output_sizes": self.output_sizes,
            "input_dtypes": self.input_dtypes,
            "output_dtypes": self.output_dtypes,
            "peer": self.peer,
            "frames": list(self.frames),
            "time_created_ns": self.time_created_ns,
            "retired": self.retired,
            "after_seq": self.after_seq,
        }


@dataclass(frozen=True)
class Problem:
    """One independent problem in one process group."""

    verdict: str
    """One of `VERDICTS` except ``healthy``."""
    process_group: str
    """Group name as recorded (``'0'`` is the default group)."""
    process_group_desc: str
    """Group description (``default_pg``, ``undefined``, or what the job named it)."""
    group_ranks: tuple[int, ...]
    """Members of the group (from pg_config where valid, else inferred from the entries)."""
    collective_seq: int | None
    """Sequence number where it happened (p2p sequence number for p2p-hang)."""
    op: str
    """Operation the waiting (or majority) ranks are in."""
    culprit_ranks: tuple[int, ...]
    culprit_hosts: tuple[str, ...]
    waiting_ranks: tuple[int, ...]
    """Ranks that entered the operation and wait in it (the victims)."""
    consequence_ranks: tuple[int, ...]
    """Ranks lost as a result (e.g. gloo receivers that aborted on a size mismatch, left no dump)."""
    explanation: str
    evidence: tuple[EntryView, ...] = ()
    evidence_files: tuple[str, ...] = ()
    """Other evidence: stacks and log tails of the culprits, with their last lines."""
    confidence: float = 1.0
    """0-1; lower where the backend records too little to be sure (gloo has no completion times)."""
    blocked_by: tuple[int, ...] = ()
    """Indexes (in the report's ``problems``) of problems that explain this one."""
    missing_records: tuple[str, ...] = ()
    """Records this verdict would need that the dumps lack (gloo's send/recv, empty recorders, ...)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "process_group": self.process_group,
            "process_group_desc": self.process_group_desc,
            "group_ranks": list(self.group_ranks),
            "collective_seq": self.collective_seq,
            "op": self.op,
            "culprit_ranks": list(self.culprit_ranks),
            "culprit_hosts": list(self.culprit_hosts),
            "waiting_ranks": list(self.waiting_ranks),
            "consequence_ranks": list(self.consequence_ranks),
            "explanation": self.explanation,
            "confidence": self.confidence,
            "blocked_by": list(self.blocked_by),
            "missing_records": list(self.missing_records),
            "evidence": [e.to_json() for e in self.evidence],
            "evidence_files": list(self.evidence_files),
        }


@dataclass(frozen=True)
class FileWarning:
    """A per-file problem: the file was skipped or read with a caveat; the rest was analysed."""

    file: str
    message: str
    rank: int | None = None
    """Set when the rank ended up without a readable dump because of this file."""

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "message": self.message, "rank": self.rank}


@dataclass(frozen=True)
class LocalizationReport:
    """The answer to "which rank, which host, what happened". Top-level fields mirror problems[0]."""

    verdict: str
    process_group: str | None
    collective_seq: int | None
    op: str | None
    culprit_ranks: tuple[int, ...]
    culprit_hosts: tuple[str, ...]
    explanation: str
    problems: tuple[Problem, ...]
    """Ordered: causes first (a problem that blocks others before the ones it blocks)."""
    warnings: tuple[FileWarning, ...]
    ranks_analyzed: tuple[int, ...]
    """Ranks whose dump was read."""
    missing_ranks: tuple[int, ...]
    """Ranks expected (group members, rank map, run events) without a readable dump."""
    backend: str
    """``gloo``, ``nccl``, ... from the op names (``mixed`` or ``unknown`` otherwise)."""
    format_versions: tuple[str, ...]
    path: str = ""
    seconds: float = 0.0
    """Time the analysis took."""
    unreadable_ranks: tuple[int, ...] = ()
    """Ranks with a file that could not be read (damaged, refused, a link): state unknown, never healthy."""
    missing_records: tuple[str, ...] = ()
    """What the dumps do not record that a verdict could need, whatever the verdict (one line each)."""

    @property
    def ok(self) -> bool:
        return self.verdict == "healthy"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "process_group": self.process_group,
            "collective_seq": self.collective_seq,
            "op": self.op,
            "culprit_ranks": list(self.culprit_ranks),
            "culprit_hosts": list(self.culprit_hosts),
            "explanation": self.explanation,
            "problems": [p.to_json() for p in self.problems],
            "warnings": [w.to_json() for w in self.warnings],
            "ranks_analyzed": len(self.ranks_analyzed),
            "missing_ranks": list(self.missing_ranks),
            "unreadable_ranks": list(self.unreadable_ranks),
            "missing_records": list(self.missing_records),
            "backend": self.backend,
            "format_versions": list(self.format_versions),
            "path": self.path,
            "seconds": round(self.seconds, 4),
        }


@dataclass
class RankGroupState:
    """What matching keeps per (rank, group) after reading a dump: small and bounded."""

    last_seq: int = -1
    """Highest collective sequence number this rank entered in the group."""
    last: EntryView | None = None
    """Its last collective entry."""
    active: list[EntryView] = field(default_factory=list)
    """Entries not completed (in flight, stuck or timed out), collectives and p2p."""
    last_op_id: int = -1
    """``op_id`` of the last collective entry: gloo's ``pg_status`` counts in op ids, not sequence numbers."""
    last_p2p_seq: int = -1
    """Highest p2p sequence number recorded (NCCL's ``pg_status`` names a p2p one after a send/recv)."""
    unrecorded: int = 0
    """gloo: ops of this group the recorder left out up to the last collective entry (``op_id`` minus
    ``collective_seq_id``: send/recv, which gloo never records)."""
    recent_gaps: tuple[int, ...] = ()
    """gloo: unrecorded ops between each of the last few collective entries and the one before, oldest first."""
