"""Deterministic fault injection: the ``--inject`` grammar, its pre-launch check and the in-rank injector.

Grammar: faults separated by ``;``, each ``KIND@key=value,...`` (``KIND`` alone is allowed for kinds
with no required keys), e.g. ``crash@step=30,rank=1;hang@step=60,rank=2;slow@step=0,rank=3,factor=1.3``.
A fault fires once per run: a marker file ``<run_dir>/chaos/fired-<index>`` is written just before it
fires, so a restart that re-executes the step does not fire it again. ``attempt=K`` restricts a fault
to attempt K. ``sdc@step=S,rank=R`` flips one bit of rank R's parameters right after step S-1's optimizer update
(the start of step S). Node-level faults (``unhealthy@node=N``, ``node-crash@step=S,node=N``,
``agent-kill@step=S,node=N``) are applied by the supervisor, not by ranks.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trainguard.core.safefs import create_exclusive
from trainguard.errors import UsageError

log = logging.getLogger(__name__)

RANK_KINDS = ("crash", "exit", "hang", "hang-in-collective", "slow", "desync", "sdc")
"""Faults fired inside a rank at the start of a step."""

_COMMON_KEYS = {"attempt"}
_KEYS: dict[str, tuple[set[str], set[str]]] = {
    # kind: (required keys, optional keys)
    "crash": ({"step"}, {"rank"}),
    "exit": ({"step"}, {"rank", "code"}),
    "hang": ({"step"}, {"rank"}),
    "hang-in-collective": ({"step"}, {"rank"}),
    "slow": ({"step"}, {"rank", "factor"}),
    "desync": ({"step"}, {"rank"}),
    "sdc": ({"step"}, {"rank"}),
    "unhealthy": ({"node"}, set()),
    "node-crash": ({"step", "node"}, set()),
    "agent-kill": ({"step", "node"}, set()),
}
_INT_KEYS = {"step", "rank", "code", "attempt"}
_FLOAT_KEYS = {"factor"}


class CorruptionTarget(Protocol):
    """What ``sdc`` flips a bit in (`trainguard.sdc.check.SdcChecker`: the lead optimizer's parameters)."""

    def ready(self) -> bool:
        """Whether there is something to corrupt yet (an optimizer has stepped)."""
        ...

    def corrupt(self) -> str:
        """Flip one bit now; a description of which."""
        ...


@dataclass(frozen=True)
class Fault:
    """One fault of a schedule."""

    index: int
    """Position in the spec (names the fired-marker file)."""
    kind: str
    step: int | None = None
    """Step at whose start the fault fires (step 1 is the first)."""
    rank: int | None = None
    """Rank that misbehaves (default 0)."""
    node: str | None = None
    """Node id for node-level faults."""
    attempt: int | None = None
    """Only in this attempt; None = the first attempt in which it applies."""
    params: dict[str, Any] = field(default_factory=dict)
    """Kind-specific values: ``code`` (exit), ``factor`` (slow)."""

    def to_spec(self) -> str:
        keys: dict[str, Any] = {}
        for name in ("step", "rank", "node", "attempt"):
            value = getattr(self, name)
            if value is not None:
                keys[name] = value
        keys.update(self.params)
        body = ",".join(f"{k}={v}" for k, v in keys.items())
        return f"{self.kind}@{body}" if body else self.kind


def parse_spec(spec: str | None) -> list[Fault]:
    """Parse an ``--inject`` spec. ``None``, ``""`` and ``"none"`` mean no faults.

    Raises `UsageError` naming the bad part for anything outside the grammar.
    """
    if spec is None or spec.strip().lower() in ("", "none"):
        return []
    faults: list[Fault] = []
    for index, part in enumerate(p.strip() for p in spec.split(";")):
        if not part:
            continue
        kind, _, body = part.partition("@")
        kind = kind.strip().lower()
        if kind not in _KEYS:
            known = ", ".join(sorted(_KEYS))
            raise UsageError(f"--inject: unknown fault kind {kind!r} in {part!r} (known: {known})")
        required, optional = _KEYS[kind]
        values: dict[str, Any] = {}
        for item in (i.strip() for i in body.split(",")) if body.strip() else ():
            key, eq, raw = item.partition("=")
            key, raw = key.strip().lower(), raw.strip()
            if not eq or not key or not raw:
                raise UsageError(f"--inject: expected key=value, got {item!r} in {part!r}")
            if key not in required | optional | _COMMON_KEYS:
                raise UsageError(f"--inject: {kind} takes no key {key!r} (in {part!r})")
            if key in values:
                raise UsageError(f"--inject: key {key!r} given twice in {part!r}")
            values[key] = _convert(key, raw, part)
        missing = required - values.keys()
        if missing:
            raise UsageError(f"--inject: {kind} needs {', '.join(sorted(missing))} (in {part!r})")
        if kind == "slow" and values.get("factor", 2.0) < 1.0:
            raise UsageError(f"--inject: slow factor must be >= 1 (in {part!r})")
        params: dict[str, Any] = {k: values.pop(k) for k in ("code", "factor") if k in values}
        faults.append(Fault(index=index, kind=kind, params=params, **values))
    return faults


def _convert(key: str, raw: str, part: str) -> Any:
    try:
        if key in _INT_KEYS:
            value: Any = int(raw)
            if value < 0:
                raise ValueError
            return value
        if key in _FLOAT_KEYS:
            value = float(raw)
            if not value == value or value in (float("inf"),):
                raise ValueError
            return value
    except ValueError:
        kind = "a non-negative integer" if key in _INT_KEYS else "a number"
        raise UsageError(f"--inject: {key} must be {kind}, got {raw!r} (in {part!r})") from None
    return raw


def format_spec(faults: list[Fault]) -> str:
    return ";".join(f.to_spec() for f in faults) or "none"


class Injector:
    """Fires this rank's faults at step starts. Created by `trainguard.worker` from the environment."""

    def __init__(
        self,
        faults: list[Fault],
        *,
        rank: int,
        attempt: int,
        marker_dir: Path,
        record: Callable[[Fault, int], None] | None = None,
        chaos_group: Any = None,
    ) -> None:
        self.rank = rank
        self.attempt = attempt
        self.marker_dir = marker_dir
        self.faults = [f for f in faults if f.kind in RANK_KINDS and (f.rank or 0) == rank]
        self._record = record
        self.chaos_group = chaos_group
        """The extra process group ``hang-in-collective`` blocks in (every rank must create it)."""
        self.sdc_target: CorruptionTarget | None = None
        """The parameters ``sdc`` corrupts, set by the worker's SDC module when it loads."""
        self._slow_factor: float | None = None
        self._skipped: set[int] = set()
        self._last_step_seconds = 0.0
        self._last_start_mono: float | None = None
        self._last_pause = 0.0
        self._paused_total = 0.0

    def _claim(self, fault: Fault) -> bool:
        """True if this fault should fire now; writes its marker so it never fires again."""
        if fault.attempt is not None and fault.attempt != self.attempt:
            return False
        if fault.kind == "hang-in-collective" and self.chaos_group is None:
            # Without the group every rank created (trainguard.attach() does), there is nothing to block
            # in; `check_schedule` refuses such a schedule before launch.
            if fault.index not in self._skipped:
                self._skipped.add(fault.index)
                log.warning("chaos: %s needs trainguard.attach() in the script; not firing", fault.to_spec())
            return False
        if fault.kind == "sdc" and (self.sdc_target is None or not self.sdc_target.ready()):
            # No parameters known yet (no optimizer step in this process): try again at the next step.
            if self.sdc_target is None and fault.index not in self._skipped:
                self._skipped.add(fault.index)
                log.warning("chaos: %s has no parameters to corrupt here (no SDC module); not firing yet",
                            fault.to_spec())
            return False
        marker = self.marker_dir / f"fired-{fault.index}"
        try:
            return create_exclusive(marker, f"{fault.to_spec()} attempt={self.attempt} rank={self.rank}\n".encode())
        except OSError as exc:
            log.warning("chaos: cannot write marker %s (%s); not firing", marker, exc)
            return False

    def note_step_seconds(self, seconds: float) -> None:
        self._last_step_seconds = seconds

    def on_step_start(self, step: int) -> None:
        now = time.monotonic()
        if self._slow_factor is not None:
            # The rank's own pace is the time between step starts without our pause. (The step duration it
            # reports is no measure: with attach() the pause precedes the step's clock, so 1.3 gave 1.23x.)
            base = (now - self._last_start_mono - self._last_pause if self._last_start_mono is not None
                    else self._last_step_seconds)
            self._last_pause = max(0.0, base) * (self._slow_factor - 1.0)
            time.sleep(self._last_pause)
            self._paused_total += self._last_pause
            self._write_paused()
        self._last_start_mono = now
        for fault in self.faults:
            if fault.step is not None and step >= fault.step and self._claim(fault):
                self._fire(fault, step)

    def _write_paused(self) -> None:
        """The seconds ``slow`` has paused this rank so far, in `paused_path` (the injected loss a straggler's
        named cost is compared with, in the same run)."""
        path = paused_path(self.marker_dir, self.rank)
        try:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(f"{self._paused_total:.6f}\n")
            os.replace(tmp, path)
        except OSError as exc:
            log.debug("chaos: cannot write %s (%s)", path, exc)

    def _fire(self, fault: Fault, step: int) -> None:
        log.warning("chaos: firing %s at step %d on rank %d", fault.to_spec(), step, self.rank)
        if self._record is not None:
            self._record(fault, step)
        if fault.kind == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.kind == "exit":
            os._exit(int(fault.params.get("code", 1)))
        elif fault.kind == "sdc":
            try:
                assert self.sdc_target is not None  # _claim checked it
                log.warning("chaos: sdc on rank %d: %s", self.rank, self.sdc_target.corrupt())
            except Exception as exc:  # a fault that cannot be applied must not break training
                log.warning("chaos: sdc could not flip a bit (%s)", exc)
        elif fault.kind == "slow":
            self._slow_factor = float(fault.params.get("factor", 2.0))
        elif fault.kind == "hang":
            # Skip this step's collectives: the other ranks block in them.
            while True:
                time.sleep(3600)
        elif fault.kind in ("hang-in-collective", "desync"):
            import torch
            import torch.distributed as dist

            if fault.kind == "hang-in-collective":
                # Blocks inside a collective that no other rank ever joins.
                dist.all_reduce(torch.zeros(1), group=self.chaos_group)
            else:
                # A different collective from the one the others issue.
                dist.broadcast(torch.zeros(3), src=self.rank)
            while True:
                time.sleep(3600)

    @staticmethod
    def needs_chaos_group(faults: list[Fault]) -> bool:
        """Whether every rank must create the extra group hang-in-collective blocks in."""
        return any(f.kind == "hang-in-collective" for f in faults)


def paused_path(marker_dir: Path, rank: int) -> Path:
    """Where a ``slow`` fault keeps the seconds it has paused ``rank`` (a number, rewritten at every step)."""
    return marker_dir / f"slow-paused-rank-{rank}"


AUTO_KINDS = ("crash", "exit", "hang", "slow", "desync", "sdc")
"""Rank faults the automatic hooks can fire in a script that never calls ``trainguard.attach()``."""


def check_schedule(faults: list[Fault], world_size_max: int) -> list[str]:
    """Problems that make a schedule impossible in this job, one sentence each (empty: fine).

    ``world_size_max`` is the most ranks the job can have (``nnodes max x nproc-per-node``). The CLI
    refuses a schedule with problems before launching anything.
    """
    problems: list[str] = []
    for fault in faults:
        rank = fault.rank or 0
        if fault.kind in RANK_KINDS and world_size_max > 0 and rank >= world_size_max:
            problems.append(f"{fault.to_spec()}: rank {rank} does not exist (the job has at most "
                            f"{world_size_max} rank{'s' if world_size_max != 1 else ''}, numbered from 0)")
    return problems


def schedule_warnings(faults: list[Fault], auto_instrument: bool) -> list[str]:
    """Faults that fire only if the script cooperates, which cannot be known before launch.

    With only the automatic hooks, ``hang-in-collective`` cannot fire (it blocks in an extra process
    group that every rank must create, which only ``trainguard.attach()`` does); without automatic
    instrumentation no rank fault fires unless the script calls ``attach()``. Such a fault is launched
    anyway (the script may call ``attach()``), and one that never fired is reported at the end.
    """
    out: list[str] = []
    for fault in faults:
        if fault.kind not in RANK_KINDS:
            continue
        if not auto_instrument:
            out.append(f"{fault.to_spec()} fires only if the script calls trainguard.attach() "
                       f"(automatic instrumentation is off)")
        elif fault.kind not in AUTO_KINDS:
            out.append(f"{fault.to_spec()} fires only if the script calls trainguard.attach() (the automatic "
                       f"hooks cannot create the extra process group it blocks in; use hang or desync)")
    return out
