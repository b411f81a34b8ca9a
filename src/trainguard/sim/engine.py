"""Monte Carlo engine: samples the job's superposed failure process and accounts every second.

Cost grows with the number of failures, never with the number of GPUs: a job of N GPUs sees the
superposition of N independent per-GPU processes, which for exponential failures is one Poisson
process of rate N*r, so a trial draws a Poisson count, uniform times and a category per failure.
All trials of a chunk are handled together as flat numpy arrays sorted by (trial, time).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trainguard.errors import UsageError
from trainguard.sim.models import FailureModel
from trainguard.sim.policy import JobConfig, PolicyConfig, checkpoint_interval_seconds, validate

log = logging.getLogger(__name__)

BUCKETS = ("startup", "checkpoint_save", "checkpoint_restore", "lost_progress", "detection", "restart", "other")
"""Badput buckets, named as in trainguard.goodput."""

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
    return Sample(trials, trial, time, cat, detection, wait, stragglers)


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


def account(s: Sample, job: JobConfig, policy: PolicyConfig, interval_seconds: float,
            planned_cat: int) -> Accounting:
    """Walk each trial's segments between interruptions and attribute every second to a bucket.

    ``planned_cat`` is the category index that marks planned interruptions (the model's category count).
    """
    horizon = job.days * 86400.0
    step = job.step_seconds
    tau, w, a = interval_seconds, policy.checkpoint_stall_seconds, policy.checkpoint_async_seconds
    n, trials = len(s.time), s.trials
    # Segment e (e < n) ends at event e; segment n + t is trial t's last segment, ending at the horizon.
    same_prev = np.zeros(n, bool)
    same_prev[1:] = s.trial[1:] == s.trial[:-1]
    prev = np.arange(n) - 1
    last_of_trial = np.full(trials, -1)
    if n:
        last_of_trial[s.trial] = np.arange(n)  # later indices overwrite earlier ones
    has_prev = np.concatenate([same_prev, last_of_trial >= 0])
    prev_idx = np.concatenate([prev, last_of_trial])
    pi = np.where(has_prev, prev_idx, 0)
    seg_trial = np.concatenate([s.trial, np.arange(trials)])
    start = np.where(has_prev, s.time[pi] if n else 0.0, 0.0)
    end = np.concatenate([s.time, np.full(trials, horizon)])
    length = np.maximum(end - start, 0.0)
    det = np.where(has_prev, s.detection[pi] if n else 0.0, 0.0)
    relaunch = np.where(has_prev, policy.relaunch_seconds + (s.wait[pi] if n else 0.0), 0.0)
    restore = np.where(has_prev, policy.restore_seconds, 0.0)
    phases = []
    rem = length
    for dur in (det, relaunch, np.full(len(length), policy.startup_seconds), restore):
        d = np.minimum(dur, rem)
        phases.append(d)
        rem = rem - d
    running = rem
    is_final = np.zeros(len(length), bool)
    is_final[n:] = True
    is_planned = np.zeros(len(length), bool)
    if n and policy.planned_checkpoint:
        is_planned[:n] = s.cat == planned_cat
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
    lost = np.where(is_final, 0.0, train - kept)
    other = np.where(is_final, train - whole, 0.0)
    buckets = {
        "detection": phases[0], "restart": phases[1], "startup": phases[2], "checkpoint_restore": phases[3],
        "checkpoint_save": stall, "lost_progress": lost, "other": other,
    }

    def per_trial(x: np.ndarray) -> np.ndarray:
        return np.bincount(seg_trial, weights=x, minlength=trials)

    return Accounting(
        productive=per_trial(kept),
        buckets={b: per_trial(buckets[b]) for b in BUCKETS},
        computing=per_trial(train),
        segments={
            "start": start, "end": end, "detection": phases[0], "restart": phases[1], "startup": phases[2],
            "restore": phases[3], "running": running, "final_save": final_save, "planned": is_planned,
            "final": is_final, "kept": kept, "lost": lost, "has_prev": has_prev, "prev": pi,
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
    """Per-trial fraction of throughput lost to stragglers."""

    @property
    def trials(self) -> int:
        return len(self.ettr)


def planned_column(model: FailureModel) -> int:
    return len(model.categories)


def simulate(model: FailureModel, job: JobConfig, policy: PolicyConfig, *, trials: int = 1000, seed: int = 0,
             progress: Callable[[int], None] | None = None) -> SimResult:
    """Run ``trials`` independent trials; the same seed gives the same failures for any policy."""
    validate(job, policy, trials)
    mtbf = 3600.0 * model.job_mttf_hours(job.gpus)
    tau = checkpoint_interval_seconds(policy, mtbf, job.step_seconds)
    horizon = job.days * 86400.0
    per_trial = job.gpus * model.rate_per_gpu_hour * job.days * 24 + model.planned_per_day * job.days
    if per_trial * trials > MAX_INTERRUPTIONS:
        raise UsageError(
            f"this would simulate about {per_trial * trials:.3g} interruptions (limit {MAX_INTERRUPTIONS:.0e}); "
            "use fewer trials, days or GPUs"
        )
    if not 0 <= seed < 2**63:
        raise UsageError(f"--seed must be between 0 and 2**63-1, not {seed}")
    # chunks bound memory (~2M interruptions) and give the progress bar about ten updates
    chunk = max(1, min(math.ceil(trials / 10), int(_CHUNK_EVENTS / max(per_trial, 1.0))))
    seeds = np.random.SeedSequence(seed).spawn(math.ceil(trials / chunk))
    ncol = len(model.categories) + 1
    ettr, counts, comp, ckpt, strag = [], [], [], [], []
    buckets: dict[str, list[np.ndarray]] = {b: [] for b in BUCKETS}
    done = 0
    for ss in seeds:
        m = min(chunk, trials - done)
        smp = sample(model, job, policy, m, np.random.default_rng(ss))
        acc = account(smp, job, policy, tau, planned_column(model))
        ettr.append(acc.productive / horizon)
        for b in BUCKETS:
            buckets[b].append(acc.buckets[b])
        counts.append(np.bincount(smp.trial * ncol + smp.cat, minlength=m * ncol).reshape(m, ncol))
        comp.append(acc.computing / horizon)
        ckpt.append(acc.buckets["checkpoint_save"] / horizon)
        slow = 1.0 - 1.0 / policy.straggler_slowdown
        strag.append(np.minimum(smp.stragglers * policy.straggler_catch_seconds * slow / horizon, 1.0))
        done += m
        if progress is not None:
            progress(m)
    return SimResult(
        model=model, job=job, policy=policy, interval_seconds=tau, ettr=np.concatenate(ettr),
        buckets={b: np.concatenate(v) for b, v in buckets.items()}, counts=np.concatenate(counts),
        computing_fraction=np.concatenate(comp), checkpoint_fraction=np.concatenate(ckpt),
        straggler_loss=np.concatenate(strag),
    )


