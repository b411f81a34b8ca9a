"""Where each attempt of a run resumed, from the evidence its records and files leave, and what is unknown.

Goodput needs one number per attempt: the step it continued from. Steps an earlier attempt ran beyond it
were lost progress. Step numbers say it directly when they continue across restarts: the script's own
(``trainguard.attach()``), a framework's global step (an adapter), or an optimizer count the script restored.
They say nothing when they start again at 1: the optimizer hooks count steps per attempt for an optimizer
without a step count (SGD), and an optimizer whose state the script did not restore (HF ``--save_only_model``)
counts from 1 again. Such an attempt's resume point is taken, in this order, from

1. a ``checkpoint_loaded`` record of the attempt (its step is the resume point). One that trainguard's
   checkpointer or an adapter wrote, or one of an observed load (`trainguard.worker.ckpt_io`) whose step came
   from the loaded content or the checkpoint's name, comes before an optimizer count that continued; one whose
   step came from the restored optimizer's count comes after it; one whose step is unknown says nothing;
2. a line of the attempt's logs that names the step it resumed from (`resume_step_in_line`: the framework's
   "Resuming training from checkpoint with epoch 0 and global step 250", a script's "resumed from step 250",
   Lightning's "Restoring states from the checkpoint path at .../epoch=0-step=250.ckpt");
3. the script's checkpoint files (`checkpoint_files`): the highest step among the files and folders named by
   a step (``checkpoint-250``, ``step=250.ckpt``, ``ckpt_250.pt``) in the folders the command line names,
   written before the attempt started and not beyond the steps trained so far. This assumes the script
   restored its newest checkpoint, which is what resumable scripts do;

and otherwise it is **unknown**. Nothing then says whether the earlier attempts' steps were redone, so the
accounting keeps them (`Scenario.KEPT`) and says how much more would be lost if the attempt had started over
(`Scenario.REDONE`). This module is pure except for the two readers at its end.
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainguard.core.events import CheckpointLoaded

log = logging.getLogger(__name__)

CONTINUOUS = ("", "script", "framework")
"""Step numberings that are the script's (or framework's) own: a first step of 1 means it started over."""

SOURCES = ("numbering", "checkpoint_loaded", "checkpoint_content", "checkpoint_name", "optimizer_state", "log",
           "checkpoint_files", "first", "unknown")
"""How a resume point was found: the attempt's first step number; a ``checkpoint_loaded`` record written by
trainguard's checkpointer or an adapter; an observed load's record whose step came from the loaded content,
from the checkpoint's name, or from the restored optimizer's step count; a log line; the script's checkpoint
files; ``first``: the run's first attempt with steps, assumed to start at its numbers; ``unknown``."""
LOADED_SOURCES = {"": "checkpoint_loaded", "content": "checkpoint_content", "name": "checkpoint_name",
                  "optimizer": "optimizer_state"}
"""`CheckpointLoaded.step_source` -> the resume point's source (``unknown`` records are no evidence)."""
_HOW = {"checkpoint_loaded": "loaded", "checkpoint_content": "its content says so",
        "checkpoint_name": "its name says so", "optimizer_state": "the restored optimizer's step count"}
_EXACT = ("checkpoint_loaded", "checkpoint_content", "checkpoint_name")
"""Loaded evidence that comes before an optimizer count that continued."""


@dataclass(frozen=True)
class AttemptSteps:
    """The steps one attempt recorded, as numbered."""

    attempt: int
    numbering: str
    """`trainguard.core.events.StepCompleted.numbering` of its steps (``""`` for spans and older files)."""
    first_step: int
    """Lowest step number it recorded."""
    last_step: int
    """Highest step number it recorded."""

    @property
    def says_resume_point(self) -> bool:
        """Whether the numbers alone say where the attempt resumed: the script's or framework's own, or an
        optimizer count that continued (the script restored the optimizer)."""
        return self.numbering in CONTINUOUS or (self.numbering == "optimizer" and self.first_step > 1)


@dataclass(frozen=True)
class Evidence:
    """Evidence of a resume point other than the step numbers."""

    step: int
    """The step the attempt continued from."""
    source: str
    """``checkpoint_loaded``, ``log`` or ``checkpoint_files``."""
    detail: str
    """What was seen: the log line, the checkpoint path."""


@dataclass(frozen=True)
class ResumePoint:
    """Where one attempt continued from, and how that is known."""

    attempt: int
    step: int | None
    """The step it continued from (its first step is ``step + 1``; 0: from scratch); None: unknown."""
    source: str
    """One of `SOURCES`."""
    offset: int | None
    """What to add to the attempt's recorded step numbers to get the run's numbering; None: unknown."""
    detail: str = ""
    """The evidence in words."""

    def to_json(self) -> dict[str, object]:
        return {"attempt": self.attempt, "step": self.step, "source": self.source, "detail": self.detail}


class Scenario(enum.Enum):
    """What an attempt whose resume point is unknown is assumed to have done."""

    KEPT = "kept"
    """It continued right after the last step of the attempts before it: nothing was redone."""
    REDONE = "redone"
    """It started over at its recorded numbers: what the earlier attempts ran beyond them was redone."""


def loaded_evidence(records: Iterable[object]) -> dict[int, Evidence]:
    """Attempt -> the resume point its ``checkpoint_loaded`` records give: the best source (`LOADED_SOURCES` in
    order), then the lowest step; records whose step is unknown are left out."""
    order = list(LOADED_SOURCES)
    best: dict[int, tuple[int, int, CheckpointLoaded]] = {}
    for record in records:
        if not isinstance(record, CheckpointLoaded) or record.step_source not in LOADED_SOURCES:
            continue
        key = (order.index(record.step_source), record.step)
        if record.attempt not in best or key < best[record.attempt][:2]:
            best[record.attempt] = (*key, record)
    out: dict[int, Evidence] = {}
    for attempt, (_, step, record) in best.items():
        source = LOADED_SOURCES[record.step_source]
        where = f" {record.path}" if record.path else ""
        via = f" ({record.entry})" if record.entry else ""
        out[attempt] = Evidence(step, source, f"checkpoint{where} of step {step}{via}: {_HOW[source]}")
    return out


def infer(steps: Iterable[AttemptSteps], loaded: Mapping[int, int | Evidence],
          more: Callable[[AttemptSteps, int], Evidence | None] | None = None) -> dict[int, ResumePoint]:
    """The resume point of every attempt with steps, in attempt order.

    ``loaded``: attempt -> its ``checkpoint_loaded`` evidence (`loaded_evidence`; a bare step is a record of
    trainguard's checkpointer or an adapter); ``more(attempt, trained)`` looks for log
    or checkpoint-file evidence of an attempt whose numbers say nothing, ``trained`` being the highest step
    the attempts before it reached (as the run numbers them, assuming nothing was redone).
    """
    points: dict[int, ResumePoint] = {}
    trained = 0
    first = True
    for s in sorted(steps, key=lambda s: s.attempt):
        point = _point(s, loaded.get(s.attempt), trained, first, more)
        points[s.attempt] = point
        shift = point.offset if point.offset is not None else _kept_offset(s, trained)
        trained = max(trained, s.last_step + shift)
        first = False
    return points


def _point(s: AttemptSteps, loaded: int | Evidence | None, trained: int, first: bool,
           more: Callable[[AttemptSteps, int], Evidence | None] | None) -> ResumePoint:
    if isinstance(loaded, int):
        loaded = Evidence(loaded, "checkpoint_loaded", f"checkpoint of step {loaded} loaded")
    if loaded is not None and loaded.source != "checkpoint_loaded" and first:
        loaded = None  # an observed load before any restart: a start from given weights, not a resume point
    numbered = ResumePoint(s.attempt, s.first_step - 1, "numbering", 0,
                           f"its steps are numbered from {s.first_step} ({s.numbering or 'not said'})")
    if s.says_resume_point and (s.numbering in CONTINUOUS or loaded is None or loaded.source not in _EXACT):
        return numbered
    found: Evidence | None = loaded
    if found is None and more is not None and not first:
        found = more(s, trained)
    if found is not None:
        return ResumePoint(s.attempt, found.step, found.source, found.step - (s.first_step - 1), found.detail)
    if first:
        return ResumePoint(s.attempt, s.first_step - 1, "first", 0, "the run's first attempt with steps")
    return ResumePoint(s.attempt, None, "unknown", None,
                       f"its steps are numbered from {s.first_step} again ({_numbering_words(s.numbering)}) and "
                       "nothing says where it resumed")


def lost_steps(steps: list[AttemptSteps], points: dict[int, ResumePoint],
               offsets: dict[int, int]) -> dict[int, int | None]:
    """Attempt -> the steps the next attempt with steps ran again after it: the highest step the run had reached
    (in the run's numbering) minus the step that attempt resumed from; None where that resume point is unknown.
    An attempt that recorded no step lost none (what it cost is start-up, detection and restart)."""
    out: dict[int, int | None] = {}
    ordered = sorted(steps, key=lambda s: s.attempt)
    reached = 0
    for here, after in itertools.pairwise(ordered):
        reached = max(reached, here.last_step + offsets.get(here.attempt, 0))
        point = points.get(after.attempt)
        out[here.attempt] = None if point is None or point.step is None else max(0, reached - point.step)
    return out


def _numbering_words(numbering: str) -> str:
    if numbering == "attempt":
        return "counted per attempt: the optimizer keeps no step count"
    return "the optimizer's step count, which the script did not restore"


def offsets(steps: Iterable[AttemptSteps], points: Mapping[int, ResumePoint],
            scenario: Scenario) -> dict[int, int]:
    """Attempt -> what to add to its recorded step numbers, unknown resume points taken as ``scenario`` says."""
    out: dict[int, int] = {}
    trained = 0
    for s in sorted(steps, key=lambda s: s.attempt):
        point = points.get(s.attempt)
        known = point.offset if point is not None else 0
        if known is None:
            known = _kept_offset(s, trained) if scenario is Scenario.KEPT else 0
        out[s.attempt] = known
        trained = max(trained, s.last_step + known)
    return out


def _kept_offset(s: AttemptSteps, trained: int) -> int:
    """The offset that has the attempt continue right after step ``trained``."""
    return max(0, trained - (s.first_step - 1))


def unknown(points: Mapping[int, ResumePoint]) -> list[int]:
    """Attempts whose resume point is unknown."""
    return sorted(a for a, p in points.items() if p.offset is None)


# --- evidence in log lines --------------------------------------------------------------------------------

_RESUME_WORD = re.compile(r"resum|continu|restor", re.IGNORECASE)
_GLOBAL_STEP = re.compile(r"global[ _]step\D{0,3}(\d{1,12})", re.IGNORECASE)
_STEP = re.compile(r"\bstep\D{0,3}(\d{1,12})", re.IGNORECASE)
_NAMED_STEP = re.compile(r"(?:checkpoint|ckpt|step|iter|iteration|global_step)[-_=]?(\d{1,12})(?!\d)",
                         re.IGNORECASE)
LOG_BYTES = 4 << 20
"""How much of each log file is searched for a resume line (they come at the start of an attempt)."""


def resume_step_in_line(line: str) -> int | None:
    """The step a log line says training resumed from, if it says so."""
    if len(line) > 2000 or not _RESUME_WORD.search(line):
        return None
    for pattern in (_GLOBAL_STEP, _STEP):
        match = pattern.search(line)
        if match:
            return int(match.group(1))
    return None


def step_in_name(name: str) -> int | None:
    """The step a checkpoint's file or folder name carries (``checkpoint-250``, ``epoch=0-step=250.ckpt``)."""
    found = _NAMED_STEP.findall(name)
    return int(found[-1]) if found else None


def resume_in_logs(paths: Iterable[Path]) -> Evidence | None:
    """The first resume line in these log files (the first ``LOG_BYTES`` of each), in the order given."""
    for path in paths:
        try:
            with path.open("rb") as f:
                data = f.read(LOG_BYTES)
        except OSError:
            continue
        for raw in data.splitlines():
            line = raw.decode("utf-8", "replace")
            step = resume_step_in_line(line)
            if step is not None:
                return Evidence(step, "log", f"{path.name}: {line.strip()[:200]}")
    return None


# --- evidence in checkpoint files ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointFile:
    """A file or folder named by a step, in a folder the script's command line names."""

    path: str
    step: int
    mtime: float
    """Last modification, Unix seconds."""


def command_folders(command: Iterable[str], cwd: Path | None = None) -> list[Path]:
    """Existing folders a command line names (``--output_dir out``, ``--ckpt-dir=/ckpt``, a file's folder)."""
    out: list[Path] = []
    for arg in command:
        value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if not value or value.startswith("-") or len(value) > 4096:
            continue
        path = Path(value)
        if not path.is_absolute() and cwd is not None:
            path = cwd / path
        try:
            folder = path if path.is_dir() else path.parent if path.is_file() else None
        except OSError:
            folder = None
        if folder is not None and folder not in out:
            out.append(folder)
    return out


def checkpoint_files(folders: Iterable[Path], limit: int = 10_000) -> list[CheckpointFile]:
    """Entries named by a step in these folders (not below them)."""
    out: list[CheckpointFile] = []
    for folder in folders:
        try:
            entries = list(os.scandir(folder))[:limit]
        except OSError:
            continue
        for entry in entries:
            step = step_in_name(entry.name)
            if step is None:
                continue
            try:
                out.append(CheckpointFile(entry.path, step, entry.stat().st_mtime))
            except OSError:
                continue
    return out


def resume_in_files(files: Iterable[CheckpointFile], started: float, trained: int) -> Evidence | None:
    """The newest checkpoint (highest step, at most ``trained``) written before ``started`` (Unix seconds)."""
    usable = [f for f in files if f.mtime <= started and f.step <= trained]
    if not usable:
        return None
    best = max(usable, key=lambda f: (f.step, f.mtime))
    ahead = started - best.mtime
    return Evidence(best.step, "checkpoint_files",
                    f"newest checkpoint before the attempt: {best.path} ({ahead:.1f} s before it started); "
                    "assumed restored")
