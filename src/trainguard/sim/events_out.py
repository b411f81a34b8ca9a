"""Writes one simulated trial as a run directory in the standard event language.

`trainguard report` then shows the simulated run like a real one. Training between checkpoint and
failure boundaries is one StepSpan per stretch, never one record per step.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.core.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointLoaded,
    CheckpointPolicyChanged,
    CheckpointSaveFinished,
    CheckpointSaveStarted,
    Diagnosis,
    Event,
    FailureDetected,
    NodeExcluded,
    PlannedInterruption,
    RunEnded,
    RunStarted,
    StepSpan,
)
from trainguard.core.interval_theory import AUTO_FORMULA
from trainguard.core.rundir import RunDir
from trainguard.errors import StorageError
from trainguard.sim.engine import account, interval_seconds_for, sample
from trainguard.sim.errors import SimConfigError
from trainguard.sim.models import FailureModel
from trainguard.sim.policy import JobConfig, PolicyConfig, validate, validate_seed
from trainguard.telemetry.power_model import PowerModel, draw_series, largest_swing

log = logging.getLogger(__name__)

START_TIME = 1_767_225_600.0
"""Unix time of a simulated run's start (2026-01-01 00:00 UTC); simulated runs are marked synthetic."""
HOST = "sim"
MAX_LISTED_HOSTS = 256
"""Attempts list their hosts only up to this many nodes (a 16k-node list per attempt is just bulk)."""
_DOMAIN_NODES = 16
MAX_WRITTEN_INTERRUPTIONS = 200_000
"""A written trial with more interruptions than this would be hundreds of MB of events."""


@dataclass(frozen=True)
class TrialWritten:
    """What was written and the simulator's own accounting of that trial."""

    path: Path
    ettr: float
    productive_seconds: float
    interruptions: int
    records: int
    power_csv: Path
    """Cluster draw over time (GPU boards): ``time_seconds,megawatts`` at every change."""
    power_swing_mw: float
    """Largest step change in that series."""

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "ettr": self.ettr, "productive_seconds": self.productive_seconds,
                "interruptions": self.interruptions, "records": self.records,
                "power_csv": str(self.power_csv), "power_swing_mw": self.power_swing_mw}


class _Nodes:
    """Which nodes the job holds; failed nodes are swapped for spares (fresh names)."""

    def __init__(self, nodes: int, rng: np.random.Generator) -> None:
        self.active = [f"node-{i}" for i in range(nodes)]
        self.next_id = nodes
        self.rng = rng
        self.history: dict[int, list[int]] = {}

    def pick(self, cat: int, recurrence: float) -> int:
        seen = [i for i in self.history.get(cat, []) if i < len(self.active)]
        if seen and self.rng.uniform() < recurrence:
            return int(self.rng.choice(seen))
        return int(self.rng.integers(len(self.active)))

    def replace(self, idx: int) -> tuple[str, str]:
        old, new = self.active[idx], f"node-{self.next_id}"
        self.next_id += 1
        self.active[idx] = new
        return old, new


def write_trial(directory: str | Path, model: FailureModel, job: JobConfig, policy: PolicyConfig, *,
                seed: int = 0, run_id: str | None = None, power: PowerModel | None = None) -> TrialWritten:
    """Simulate one trial with ``seed`` and write it as a run directory at ``directory``."""
    validate(job, policy, 1)
    validate_seed(seed)
    check_size(model, job)
    if policy.replica_groups > 1:
        # a group dropping out is not an attempt boundary; the event language has no record for it yet
        raise SimConfigError("replica_groups", "must be 1 for a written trial (per-group recovery has no events)")
    rng = np.random.default_rng(seed)
    smp = sample(model, job, policy, 1, rng)
    mtbf = 3600.0 * model.job_mttf_hours(job.gpus)
    tau = interval_seconds_for(model, job, policy)
    acc = account(smp, model, job, policy, tau)
    seg = acc.segments
    try:
        rundir = RunDir(directory).create()
    except OSError as exc:
        raise StorageError(f"cannot create run directory {directory}: {exc.strerror or exc}") from None
    # The seed is part of the run id: trials written to folders of the same name are different runs, and the
    # fleet database keys a run by its id and start (the start of every simulated trial is the same instant).
    run_id = run_id or f"{rundir.run_id}-seed{seed}"
    step_s = job.step_seconds
    tau_steps = round(tau / step_s)
    w, a = policy.checkpoint_stall_seconds, policy.checkpoint_async_seconds
    nodes = _Nodes(math.ceil(job.gpus / model.gpus_per_node), np.random.default_rng(seed + 1))
    list_hosts = len(nodes.active) <= MAX_LISTED_HOSTS
    out: list[Event] = []
    states: list[tuple[float, str]] = []
    t0 = START_TIME
    horizon = job.days * 86400.0
    out.append(RunStarted(time=t0, host=HOST, run_id=run_id, world_size=job.gpus, nnodes=len(nodes.active),
                          synthetic=True, config={"simulator": "trainguard.sim", "model": model.name,
                                                  "seed": seed, "days": job.days, "step_seconds": step_s}))
    named = {"young": "young", "daly": "daly", "auto": AUTO_FORMULA}.get(policy.interval, "seconds")
    out.append(CheckpointPolicyChanged(time=t0, host=HOST, policy=named, interval_seconds=tau,
                                       interval_steps=tau_steps, save_cost_seconds=w, mtbf_seconds=mtbf))
    n = len(smp.time)
    order = [*range(n), n]  # segment n is the trial's last one
    attempt = 0
    ckpt_step = 0
    next_step = 1
    for e in order:
        start, end = float(seg["start"][e]), float(seg["end"][e])
        det, rst, sup, rsto = (float(seg[k][e]) for k in ("detection", "restart", "startup", "restore"))
        if seg["has_prev"][e]:
            p = int(seg["prev"][e])
            kind = _detection_state(model, int(smp.cat[p]))
            states.append((start, kind))
            states.append((start + det, "restarting"))
            attempt = _close_attempt(out, t0, start, det, p, smp, model, attempt, next_step - 1, nodes)
            t_start = start + det + rst
            hosts = tuple(nodes.active) if list_hosts else ()
            out.append(AttemptStarted(time=t0 + t_start, host=HOST, attempt=attempt, world_size=job.gpus,
                                      hosts=hosts, resume_step=ckpt_step))
            if t_start + sup + rsto <= end and rsto > 0:
                out.append(CheckpointLoaded(time=t0 + t_start + sup + rsto, host=HOST, attempt=attempt, rank=0,
                                            step=ckpt_step, seconds=rsto))
            next_step = ckpt_step + 1
        else:
            hosts = tuple(nodes.active) if list_hosts else ()
            out.append(AttemptStarted(time=t0, host=HOST, attempt=0, world_size=job.gpus, hosts=hosts))
            states.append((start, "restarting"))
        t = start + det + rst + sup + rsto
        states.append((t, "computing"))
        running = float(seg["running"][e])
        stop = t + running
        # full cycles: tau of training, then a save stalling w, durable a later
        while t + tau + w <= stop + 1e-6:
            out.append(StepSpan(time=t0 + t + tau, host=HOST, attempt=attempt, rank=0, first_step=next_step,
                                last_step=next_step + tau_steps - 1, duration_seconds=tau))
            next_step += tau_steps
            s0 = t + tau
            states.append((s0, "checkpointing"))
            states.append((s0 + w, "computing"))
            out.append(CheckpointSaveStarted(time=t0 + s0, host=HOST, attempt=attempt, rank=0, step=next_step - 1))
            durable = s0 + w + a <= stop + 1e-6 or (s0 + w + a <= end + 1e-6 and not _is_failure(seg, e))
            done = s0 + w + a if durable else end
            out.append(CheckpointSaveFinished(time=t0 + done, host=HOST, attempt=attempt, rank=0, step=next_step - 1,
                                              blocking_seconds=w, total_seconds=done - s0, ok=durable,
                                              error="" if durable else "interrupted"))
            if durable:
                ckpt_step = next_step - 1
            t = s0 + w
        rem = stop - t
        k = math.floor(min(rem, tau) / step_s + 1e-9)
        if k > 0:
            out.append(StepSpan(time=t0 + t + k * step_s, host=HOST, attempt=attempt, rank=0, first_step=next_step,
                                last_step=next_step + k - 1, duration_seconds=k * step_s))
            next_step += k
        if rem > tau + 1e-9:  # a save cut short by the interruption
            s0 = t + tau
            states.append((s0, "checkpointing"))
            out.append(CheckpointSaveStarted(time=t0 + s0, host=HOST, attempt=attempt, rank=0, step=next_step - 1))
            out.append(CheckpointSaveFinished(time=t0 + stop, host=HOST, attempt=attempt, rank=0, step=next_step - 1,
                                              blocking_seconds=stop - s0, total_seconds=stop - s0, ok=False,
                                              error="interrupted"))
        fs = float(seg["final_save"][e])
        if fs > 0:  # planned stop: save everything first
            states.append((stop, "checkpointing"))
            out.append(CheckpointSaveStarted(time=t0 + stop, host=HOST, attempt=attempt, rank=0, step=next_step - 1))
            out.append(CheckpointSaveFinished(time=t0 + stop + fs, host=HOST, attempt=attempt, rank=0,
                                              step=next_step - 1, blocking_seconds=fs, total_seconds=fs))
            ckpt_step = next_step - 1
    out.append(AttemptEnded(time=t0 + horizon, host=HOST, attempt=attempt, reason="completed", exit_code=0))
    out.append(RunEnded(time=t0 + horizon, host=HOST, run_id=run_id, status="completed",
                        reason="end of the simulated horizon", completed_steps=next_step - 1))
    with rundir.writer("agent-sim") as writer:
        writer.write_all(out)
    series = draw_series(states, power or PowerModel(), job.gpus)
    power_csv = rundir.root / "sim" / "power.csv"
    _write_text(power_csv, "time_seconds,megawatts\n" + "".join(f"{t:.3f},{mw:.6f}\n" for t, mw in series))
    productive = float(acc.productive[0])
    return TrialWritten(path=rundir.root, ettr=productive / horizon, productive_seconds=productive,
                        interruptions=n, records=len(out), power_csv=power_csv,
                        power_swing_mw=largest_swing(series))


def _detection_state(model: FailureModel, cat: int) -> str:
    """What the GPUs do between a failure's onset and its detection."""
    if cat == len(model.categories):
        return "restarting"
    detection = model.categories[cat].detection
    return {"crash": "restarting", "hang": "waiting", "sdc": "computing"}[detection]


def check_size(model: FailureModel, job: JobConfig) -> None:
    """Refuse to write a trial whose event file would be absurdly large."""
    if job.gpus * model.rate_per_gpu_hour * job.days * 24 > MAX_WRITTEN_INTERRUPTIONS:
        raise SimConfigError("size", f"of a written trial must stay under {MAX_WRITTEN_INTERRUPTIONS:,} "
                             "interruptions; write a shorter or smaller one")


def _write_text(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise StorageError(f"cannot write {path}: {exc.strerror or exc}") from None


def _is_failure(seg: dict[str, np.ndarray], e: int) -> bool:
    return not (bool(seg["final"][e]) or bool(seg["planned"][e]))


def _close_attempt(out: list[Event], t0: float, onset: float, det: float, p: int, smp: Any, model: FailureModel,
                   attempt: int, last_step: int, nodes: _Nodes) -> int:
    """Records of the interruption at ``onset`` that ends ``attempt``; returns the next attempt's number."""
    cat = int(smp.cat[p])
    if cat == len(model.categories):
        out.append(PlannedInterruption(time=t0 + onset, host=HOST, attempt=attempt, reason="maintenance"))
        out.append(AttemptEnded(time=t0 + onset, host=HOST, attempt=attempt, reason="planned"))
        return attempt + 1
    c = model.categories[cat]
    idx = nodes.pick(cat, c.recurrence)
    nodes.history.setdefault(cat, []).append(idx)
    if c.scope == "network":
        lo = idx - idx % _DOMAIN_NODES
        hosts = tuple(nodes.active[lo:lo + _DOMAIN_NODES])
    else:
        hosts = (nodes.active[idx],)
    kind = {"crash": "crash", "hang": "hang", "sdc": "sdc"}[c.detection]
    seen = t0 + onset + det
    out.append(FailureDetected(time=seen, host=HOST, attempt=attempt, kind=kind, hosts=hosts,
                               detection_latency_seconds=det, step=last_step, detail=f"simulated: {c.category}"))
    out.append(Diagnosis(time=seen, host=HOST, attempt=attempt, category=c.category, group=c.group,
                         culprit_hosts=hosts[:1], confidence=1.0, explanation="simulated failure"))
    out.append(AttemptEnded(time=seen, host=HOST, attempt=attempt, reason="failure", exit_code=1))
    if c.repair in ("replace", "wait"):
        old, new = nodes.replace(idx)
        out.append(NodeExcluded(time=seen, host=HOST, node=old, reason=c.category, attempt=attempt,
                                replaced_by=new))
    return attempt + 1
