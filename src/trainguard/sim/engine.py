"""Monte Carlo engine: samples the job's superposed failure process and accounts every second.

Cost grows with the number of failures, never with the number of GPUs: a job of N GPUs sees the
superposition of N independent per-GPU processes, which for exponential failures is one Poisson
process of rate N*r, so a trial draws a Poisson count, uniform times and a category per failure.
All trials of a chunk are handled together as flat numpy arrays sorted by (trial, time).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from trainguard.accounting.goodput import BUCKETS
from trainguard.sim.errors import SimConfigError
from trainguard.sim.models import FailureModel
from trainguard.sim.policy import JobConfig, PolicyConfig, checkpoint_interval_seconds, validate, validate_seed
from trainguard.sim.recovery import Recovery, group_costs, job_failure_rate_per_second, recovery

log = logging.getLogger(__name__)

__all__ = ["BUCKETS", "MAX_INTERRUPTIONS", "SimResult", "account", "interval_seconds_for", "sample", "samples",
           "simulate"]

_CHUNK_EVENTS = 2_000_000
MAX_INTERRUPTIONS = 5e8
"""Refuse runs expected to draw more interruptions than this (about 10 minutes of work here)."""


@dataclass(frozen=True)
class Sample:
    """Interruptions of a chunk of trials, flat and sorted by (trial, time)."""

    trials: int
    trial: np.ndarray
    time: np.ndarray
    """Onset, seconds since the run's start."""
    cat: np.ndarray
    """Index into the model's categories; ``len(categories)`` marks a planned interruption."""
    detection: np.ndarray
    """Detection latency, seconds."""
    wait: np.ndarray
    """Time waiting for a node (no spare, or repair path ``wait``), seconds."""
    stragglers: np.ndarray
    """Straggler episodes per trial."""
    u_recover: np.ndarray
    """Uniform draw per interruption that decides the recovery path (in-process when below the share);
    drawn for every policy so that all policies see the same draws (common random numbers)."""


@dataclass(frozen=True)
class Accounting:
    """Per-trial seconds by bucket plus the per-segment arrays (used by the event writer)."""

    productive: np.ndarray
    buckets: dict[str, np.ndarray]
    computing: np.ndarray
    """Per-trial seconds spent executing steps (kept or later lost)."""
    segments: dict[str, np.ndarray]
    """Per-segment arrays (segment e < n ends at interruption e; n + t is trial t's last segment):
    start, end, detection, restart, startup, restore, running, final_save, planned, final, kept, lost."""


def _weibull_times(rng: np.random.Generator, trials: int, mean: float, shape: float, horizon: float):
    """Renewal process with Weibull gaps of the given mean, started afresh at 0, per trial."""
    scale = mean / math.gamma(1 + 1 / shape)
    n = int(horizon / mean * 1.3 + 6 * math.sqrt(horizon / mean + 1) + 8)
    gaps = scale * rng.weibull(shape, size=(trials, n))
    times = np.cumsum(gaps, axis=1)
    while np.any(times[:, -1] < horizon):
        more = times[:, -1:] + np.cumsum(scale * rng.weibull(shape, size=(trials, n)), axis=1)
        times = np.concatenate([times, more], axis=1)
    rows, cols = np.nonzero(times < horizon)
    return rows, times[rows, cols]


def sample(model: FailureModel, job: JobConfig, policy: PolicyConfig, trials: int,
           rng: np.random.Generator) -> Sample:
    """Draw every interruption (unexpected and planned) of ``trials`` trials."""
    horizon = job.days * 86400.0
    cats = model.categories
    ncat = len(cats)
    rates = np.array([job.gpus * c.rate_per_gpu_hour / 3600.0 for c in cats])
    expo = np.array([c.distribution == "exponential" for c in cats])
    parts_t: list[np.ndarray] = []
    parts_time: list[np.ndarray] = []
    parts_cat: list[np.ndarray] = []
    lam = float(rates[expo].sum())
    if lam > 0:
        counts = rng.poisson(lam * horizon, size=trials)
        total = int(counts.sum())
        parts_t.append(np.repeat(np.arange(trials), counts))
        parts_time.append(rng.uniform(0.0, horizon, size=total))
        idx = np.nonzero(expo)[0]
        cum = np.cumsum(rates[idx]) / lam
        parts_cat.append(idx[np.minimum(np.searchsorted(cum, rng.uniform(size=total), side="right"), len(idx) - 1)])
    for i, c in enumerate(cats):
        if c.distribution == "weibull" and rates[i] > 0:
            rows, times = _weibull_times(rng, trials, 1.0 / rates[i], c.shape, horizon)
            parts_t.append(rows)
            parts_time.append(times)
            parts_cat.append(np.full(len(rows), i))
    if model.planned_per_day > 0:
        counts = rng.poisson(model.planned_per_day * job.days, size=trials)
        parts_t.append(np.repeat(np.arange(trials), counts))
        parts_time.append(rng.uniform(0.0, horizon, size=int(counts.sum())))
        parts_cat.append(np.full(int(counts.sum()), ncat))
    trial = np.concatenate(parts_t).astype(np.int64) if parts_t else np.zeros(0, np.int64)
    time = np.concatenate(parts_time) if parts_time else np.zeros(0)
    cat = np.concatenate(parts_cat).astype(np.int64) if parts_cat else np.zeros(0, np.int64)
    order = np.lexsort((time, trial))
    trial, time, cat = trial[order], time[order], cat[order]

    det_fixed = np.zeros(ncat + 1)
    is_sdc = np.zeros(ncat + 1, bool)
    replace = np.zeros(ncat + 1, bool)
    wait_fixed = np.zeros(ncat + 1)
    repair_s = np.zeros(ncat + 1)
    for i, c in enumerate(cats):
        kind = {"crash": policy.crash_detection_seconds, "hang": policy.hang_timeout_seconds, "sdc": 0.0}
        det_fixed[i] = c.detection_seconds if c.detection_seconds is not None else kind[c.detection]
        is_sdc[i] = c.detection == "sdc" and c.detection_seconds is None
        replace[i] = c.repair == "replace"
        repair_s[i] = c.repair_hours * 3600.0
        wait_fixed[i] = repair_s[i] if c.repair == "wait" else 0.0
    detection = det_fixed[cat] + np.where(is_sdc[cat], rng.uniform(0.0, policy.sdc_check_seconds, len(cat)), 0.0)
    wait = wait_fixed[cat].copy()
    if policy.spares is not None:
        _spare_waits(trial, time, cat, replace, repair_s, policy.spares, trials, wait)
    stragglers = rng.poisson(policy.straggler_per_day * job.days, size=trials)
    return Sample(trials, trial, time, cat, detection, wait, stragglers, rng.uniform(size=len(cat)))


def _spare_waits(trial, time, cat, replace, repair_s, spares: int, trials: int, wait: np.ndarray) -> None:
    """Finite spare pool: a failed node goes to repair; the job takes the earliest ready node."""
    sel = np.nonzero(replace[cat])[0]
    if len(sel) == 0:
        return
    tr = trial[sel]
    first = np.searchsorted(tr, np.arange(trials))
    pos = np.arange(len(sel)) - first[tr]
    width = int(pos.max()) + 1
    t_pad = np.full((trials, width), np.nan)
    t_pad[tr, pos] = time[sel]
    r_pad = np.zeros((trials, width))
    r_pad[tr, pos] = repair_s[cat[sel]]
    w_pad = np.zeros((trials, width))
    ready = np.zeros((trials, spares + 1))
    for j in range(width):
        rows = np.nonzero(~np.isnan(t_pad[:, j]))[0]
        t = t_pad[rows, j]
        ready[rows, spares] = t + r_pad[rows, j]
        k = np.argmin(ready[rows], axis=1)
        w_pad[rows, j] = np.maximum(ready[rows, k] - t, 0.0)
        ready[rows, k] = ready[rows, spares]
    wait[sel] += w_pad[tr, pos]


def _segments(trial: np.ndarray, time: np.ndarray, detection: np.ndarray, rec: Recovery, trials: int,
              horizon: float, cold_startup_seconds: float) -> dict[str, np.ndarray]:
    """Segment bounds and recovery phases; segment e < n ends at interruption e, n + t ends trial t."""
    n = len(time)
    same_prev = np.zeros(n, bool)
    same_prev[1:] = trial[1:] == trial[:-1]
    last_of_trial = np.full(trials, -1)
    if n:
        last_of_trial[trial] = np.arange(n)  # later indices overwrite earlier ones
    has_prev = np.concatenate([same_prev, last_of_trial >= 0])
    pi = np.where(has_prev, np.concatenate([np.arange(n) - 1, last_of_trial]), 0)
    start = np.where(has_prev, time[pi] if n else 0.0, 0.0)
    end = np.concatenate([time, np.full(trials, horizon)])
    rem = np.maximum(end - start, 0.0)
    out = {"start": start, "end": end, "has_prev": has_prev, "prev": pi,
           "seg_trial": np.concatenate([trial, np.arange(trials)])}
    # each phase is clipped by the next onset: a failure during recovery starts recovery over;
    # the job's first start has no detection, relaunch or restore, but a cold start-up
    for name, dur, first in (("detection", detection, 0.0), ("restart", rec.relaunch, 0.0),
                             ("startup", rec.startup, cold_startup_seconds), ("restore", rec.restore, 0.0)):
        d = np.minimum(np.where(has_prev, dur[pi] if n else 0.0, first), rem)
        out[name] = d
        rem = rem - d
    out["running"] = rem
    return out


def _training(seg: dict[str, np.ndarray], n: int, planned: np.ndarray, step: float, tau: float,
              policy: PolicyConfig) -> dict[str, np.ndarray]:
    """Cycles of tau training + a stall w in each segment's running time; what a failure keeps."""
    w, a = policy.checkpoint_stall_seconds, policy.checkpoint_async_seconds
    running = seg["running"]
    is_final = np.zeros(len(running), bool)
    is_final[n:] = True
    is_planned = np.zeros(len(running), bool)
    if n and policy.planned_checkpoint:
        is_planned[:n] = planned
    # A planned stop ends with a final save (w + a, blocking) right before the interruption.
    final_save = np.where(is_planned, np.minimum(w + a, running), 0.0)
    running = running - final_save
    cycle = tau + w
    k_full = np.floor(running / cycle)
    r = running - k_full * cycle
    stall = k_full * w + np.clip(r - tau, 0.0, w) + final_save
    train = running - k_full * w - np.clip(r - tau, 0.0, w)
    # failure-ended: keep only what a durable checkpoint holds (save j is durable at j*cycle + a)
    k_dur = np.where(running >= a, np.floor((running - a) / cycle), 0.0)
    kept = k_dur * tau
    # planned stop or horizon: every whole step is kept
    whole = np.floor(train / step + 1e-9) * step
    soft = is_planned | is_final
    kept = np.where(soft, whole, kept)
    return {
        "running": running, "final_save": final_save, "planned": is_planned, "final": is_final, "soft": soft,
        "durable_end": k_dur * cycle, "train": train, "kept": kept, "checkpoint_save": stall,
        "lost_progress": np.where(is_final, 0.0, train - kept), "other": np.where(is_final, train - whole, 0.0),
    }


def _apply_group_failures(s: Sample, rec: Recovery, job_idx: np.ndarray, grp_idx: np.ndarray,
                          seg: dict[str, np.ndarray], tr: dict[str, np.ndarray], horizon: float,
                          policy: PolicyConfig) -> dict[str, np.ndarray]:
    """Move the seconds group-local failures cost out of kept (or lost) time into the badput buckets."""
    n_job, nseg = len(job_idx), len(seg["start"])
    # which job segment each group failure falls in: the first later job-level onset of its trial
    scale = 1.0 / (horizon * 1.0001)
    key_job = s.trial[job_idx] + s.time[job_idx] * scale
    key = s.trial[grp_idx] + s.time[grp_idx] * scale
    pos = np.searchsorted(key_job, key, side="right")
    inside = pos < n_job
    inside[inside] = s.trial[job_idx][pos[inside]] == s.trial[grp_idx][inside]
    sg = np.where(inside, pos, n_job + s.trial[grp_idx])
    run_start = seg["start"] + seg["detection"] + seg["restart"] + seg["startup"] + seg["restore"]
    offset = s.time[grp_idx] - run_start[sg]
    live = (offset >= 0) & (offset < tr["running"][sg])
    nxt = np.minimum(grp_idx + 1, len(s.time) - 1)
    gap = np.where((grp_idx + 1 < len(s.time)) & (s.trial[nxt] == s.trial[grp_idx]), s.time[nxt], horizon)
    parts = group_costs(sg, np.where(live, offset, -1.0), gap - s.time[grp_idx], s.detection, rec, grp_idx, policy)
    names = ("detection", "restart", "startup", "checkpoint_restore")
    cost = sum(parts[b] for b in names)
    # a failure cannot cost more than the training left in its segment
    left = tr["running"][sg] - np.maximum(offset, 0.0)
    fit = np.where(cost > 0, np.minimum(1.0, left / np.maximum(cost, 1e-300)), 0.0)
    from_kept = tr["soft"][sg] | (offset < tr["durable_end"][sg])
    moved: dict[str, np.ndarray] = {}
    for pool, mask in (("kept", from_kept), ("lost_progress", ~from_kept)):
        want = np.bincount(sg, weights=np.where(mask, cost * fit, 0.0), minlength=nseg)
        ratio = np.where(want > 0, np.minimum(1.0, tr[pool] / np.maximum(want, 1e-300)), 0.0)
        f = np.where(mask, fit * ratio[sg], 0.0)
        for b in names:
            moved[b] = moved.get(b, 0.0) + np.bincount(sg, weights=parts[b] * f, minlength=nseg)
        tr[pool] = tr[pool] - np.minimum(want, tr[pool])
    return moved


def account(s: Sample, model: FailureModel, job: JobConfig, policy: PolicyConfig,
            interval_seconds: float) -> Accounting:
    """Walk each trial's segments between job-level interruptions and attribute every second to a bucket.

    Group-local failures (replica groups on) do not end a segment; their cost is moved out of the
    segment's training time afterwards.
    """
    horizon = job.days * 86400.0
    rec = recovery(model, policy, s.cat, s.wait, s.u_recover)
    grp_idx = np.nonzero(rec.group_local)[0]
    if len(grp_idx):
        job_idx = np.nonzero(~rec.group_local)[0]
        sub = Recovery(relaunch=rec.relaunch[job_idx], startup=rec.startup[job_idx],
                       restore=rec.restore[job_idx], group_local=rec.group_local[job_idx])
        trial, time, detection, cat = s.trial[job_idx], s.time[job_idx], s.detection[job_idx], s.cat[job_idx]
    else:  # every interruption stops the whole job: no copies
        job_idx, sub = np.arange(len(s.time)), rec
        trial, time, detection, cat = s.trial, s.time, s.detection, s.cat
    seg = _segments(trial, time, detection, sub, s.trials, horizon, policy.startup_seconds)
    planned = cat == planned_column(model)
    tr = _training(seg, len(job_idx), planned, job.step_seconds, interval_seconds, policy)
    train_before = tr["kept"] + tr["lost_progress"]
    extra: dict[str, np.ndarray] = {}
    if len(grp_idx):
        extra = _apply_group_failures(s, rec, job_idx, grp_idx, seg, tr, horizon, policy)
    per_seg = {
        "detection": seg["detection"], "restart": seg["restart"], "startup": seg["startup"],
        "checkpoint_restore": seg["restore"], "checkpoint_save": tr["checkpoint_save"],
        "lost_progress": tr["lost_progress"], "other": tr["other"],
    }
    for b, x in extra.items():
        per_seg[b] = per_seg[b] + x
    seg_trial = seg["seg_trial"]

    def per_trial(x: np.ndarray | float) -> np.ndarray:
        return np.bincount(seg_trial, weights=np.broadcast_to(x, seg_trial.shape), minlength=s.trials)

    moved = train_before - tr["kept"] - tr["lost_progress"]
    return Accounting(
        productive=per_trial(tr["kept"]),
        buckets={b: per_trial(per_seg.get(b, 0.0)) for b in BUCKETS},
        computing=per_trial(tr["train"] - moved),
        segments={
            "start": seg["start"], "end": seg["end"], "detection": seg["detection"], "restart": seg["restart"],
            "startup": seg["startup"], "restore": seg["restore"], "running": tr["running"],
            "final_save": tr["final_save"], "planned": tr["planned"], "final": tr["final"], "kept": tr["kept"],
            "lost": tr["lost_progress"], "has_prev": seg["has_prev"], "prev": seg["prev"],
        },
    )


@dataclass(frozen=True)
class SimResult:
    """Per-trial outcomes of a Monte Carlo run."""

    model: FailureModel
    job: JobConfig
    policy: PolicyConfig
    interval_seconds: float
    ettr: np.ndarray
    buckets: dict[str, np.ndarray]
    """Per-trial badput seconds by bucket."""
    counts: np.ndarray
    """Per-trial interruption counts, shape (trials, categories + 1); the last column is planned."""
    computing_fraction: np.ndarray
    checkpoint_fraction: np.ndarray
    straggler_loss: np.ndarray
    """Per-trial fraction of the horizon lost to stragglers' extra step time (the ``straggler`` bucket)."""

    @property
    def trials(self) -> int:
        return len(self.ettr)


def planned_column(model: FailureModel) -> int:
    """Column of the planned interruptions in `SimResult.counts` (after the model's categories)."""
    return len(model.categories)


def interval_seconds_for(model: FailureModel, job: JobConfig, policy: PolicyConfig) -> float:
    """The policy's checkpoint interval, with Young/Daly fed the MTBF of failures that roll the job back
    (with replica groups on, a group-local failure rolls nothing back)."""
    rate = job_failure_rate_per_second(model, job, policy)
    mtbf = math.inf if rate <= 0 else 1.0 / rate
    return checkpoint_interval_seconds(policy, mtbf, job.step_seconds)


def expected_interruptions(model: FailureModel, job: JobConfig) -> float:
    """Expected interruptions (unexpected + planned) of one trial."""
    return job.gpus * model.rate_per_gpu_hour * job.days * 24 + model.planned_per_day * job.days


def samples(model: FailureModel, job: JobConfig, policy: PolicyConfig, trials: int, seed: int) -> Iterator[Sample]:
    """The trials' draws in chunks; the same seed gives the same chunks, whatever the recovery policy."""
    per_trial = expected_interruptions(model, job)
    # chunks bound memory (~2M interruptions) and give the progress bar about ten updates
    chunk = max(1, min(math.ceil(trials / 10), int(_CHUNK_EVENTS / max(per_trial, 1.0))))
    done = 0
    for ss in np.random.SeedSequence(seed).spawn(math.ceil(trials / chunk)):
        m = min(chunk, trials - done)
        yield sample(model, job, policy, m, np.random.default_rng(ss))
        done += m


def straggler_seconds(smp: Sample, policy: PolicyConfig, productive: np.ndarray) -> np.ndarray:
    """Per trial: a straggler's extra step time, badput as in trainguard.accounting.goodput (``straggler``)."""
    slow = 1.0 - 1.0 / policy.straggler_slowdown
    return np.minimum(smp.stragglers * policy.straggler_catch_seconds * slow, productive)


def simulate(model: FailureModel, job: JobConfig, policy: PolicyConfig, *, trials: int = 1000, seed: int = 0,
             progress: Callable[[int], None] | None = None) -> SimResult:
    """Run ``trials`` independent trials; the same seed gives the same failures for any policy."""
    validate(job, policy, trials)
    validate_seed(seed)
    tau = interval_seconds_for(model, job, policy)
    horizon = job.days * 86400.0
    per_trial = expected_interruptions(model, job)
    if per_trial * trials > MAX_INTERRUPTIONS:
        raise SimConfigError(
            "size", f"would be about {per_trial * trials:.3g} simulated interruptions (limit "
            f"{MAX_INTERRUPTIONS:.0e}); use fewer trials, days or GPUs")
    ncol = len(model.categories) + 1
    ettr, counts, comp, ckpt, strag = [], [], [], [], []
    buckets: dict[str, list[np.ndarray]] = {b: [] for b in BUCKETS}
    for smp in samples(model, job, policy, trials, seed):
        m = smp.trials
        acc = account(smp, model, job, policy, tau)
        straggler = straggler_seconds(smp, policy, acc.productive)
        ettr.append((acc.productive - straggler) / horizon)
        for b in BUCKETS:
            buckets[b].append(straggler if b == "straggler" else acc.buckets[b])
        counts.append(np.bincount(smp.trial * ncol + smp.cat, minlength=m * ncol).reshape(m, ncol))
        comp.append(acc.computing / horizon)
        ckpt.append(acc.buckets["checkpoint_save"] / horizon)
        strag.append(straggler / horizon)
        if progress is not None:
            progress(m)
    return SimResult(
        model=model, job=job, policy=policy, interval_seconds=tau, ettr=np.concatenate(ettr),
        buckets={b: np.concatenate(v) for b, v in buckets.items()}, counts=np.concatenate(counts),
        computing_fraction=np.concatenate(comp), checkpoint_fraction=np.concatenate(ckpt),
        straggler_loss=np.concatenate(strag),
    )
