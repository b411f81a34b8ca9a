"""Turns a `SimResult` into the ``trainguard simulate --json`` document (and its human text)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from trainguard.accounting.goodput import BUCKETS
from trainguard.core.interval_theory import daly_seconds, meta_ettr, young_seconds
from trainguard.sim.engine import SimResult
from trainguard.sim.models import FailureModel
from trainguard.sim.policy import JobConfig, PolicyConfig
from trainguard.telemetry.power_model import PowerModel, summarize


def mean_detection_seconds(model: FailureModel, policy: PolicyConfig) -> float:
    """Rate-weighted mean detection latency of unexpected failures."""
    total = model.rate_per_gpu_hour
    if total <= 0:
        return 0.0
    kind = {"crash": policy.crash_detection_seconds, "hang": policy.hang_timeout_seconds,
            "sdc": policy.sdc_check_seconds / 2}
    return sum(
        c.rate_per_gpu_hour * (c.detection_seconds if c.detection_seconds is not None else kind[c.detection])
        for c in model.categories
    ) / total


def analytic(model: FailureModel, job: JobConfig, policy: PolicyConfig, interval_seconds: float) -> dict[str, Any]:
    """Closed-form figures for the same configuration: Young, Daly, Meta's E[ETTR] approximation."""
    rate = job.gpus * model.rate_per_gpu_hour / 3600.0 + model.planned_per_day / 86400.0
    mtbi = math.inf if rate <= 0 else 1.0 / rate
    mtbf = 3600.0 * model.job_mttf_hours(job.gpus)  # Young/Daly: unexpected failures (planned stops save first)
    cost = policy.checkpoint_stall_seconds  # the whole-step rounding keeps the interval at least one step
    u0 = mean_detection_seconds(model, policy) + policy.restart_overhead_seconds
    return {
        "interruptions_per_day": rate * 86400.0,
        "mtbi_hours": mtbi / 3600.0,
        "young_minutes": young_seconds(cost, mtbf) / 60.0 if math.isfinite(mtbf) else None,
        "daly_minutes": daly_seconds(cost, mtbf) / 60.0 if math.isfinite(mtbf) else None,
        "u0_seconds": u0,
        "meta_ettr": meta_ettr(rate, u0, interval_seconds, policy.checkpoint_stall_seconds),
    }


def _stats(x: np.ndarray) -> dict[str, float]:
    return {
        "mean": float(x.mean()),
        "p5": float(np.percentile(x, 5)),
        "p50": float(np.percentile(x, 50)),
        "p95": float(np.percentile(x, 95)),
        "stderr": float(x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else 0.0,
    }


def to_json(result: SimResult, *, seed: int, power: PowerModel | None = None) -> dict[str, Any]:
    """The simulate JSON document (schema in docs/simulation.md)."""
    model, job, policy = result.model, result.job, result.policy
    power = power or PowerModel()
    hours = job.days * 24.0
    counts = result.counts
    ncat = len(model.categories)
    unexpected = counts[:, :ncat].sum(axis=1)
    planned = counts[:, ncat]
    by_cat = {c.category: float(counts[:, i].mean()) for i, c in enumerate(model.categories)}
    by_group: dict[str, float] = {}
    for i, c in enumerate(model.categories):
        by_group[c.group] = by_group.get(c.group, 0.0) + float(counts[:, i].mean())
    total_unexpected = int(unexpected.sum())
    straggler = result.straggler_loss
    diurnal = policy.diurnal_swing / 2
    # the straggler's extra step time is already badput in ETTR (bucket ``straggler``, as in goodput)
    throughput = 1 - diurnal
    doc: dict[str, Any] = {
        "model": model.name,
        "gpus": job.gpus,
        "nodes": math.ceil(job.gpus / model.gpus_per_node),
        "days": job.days,
        "trials": result.trials,
        "seed": seed,
        "policy": {
            "interval": policy.interval,
            "checkpoint_interval_minutes": result.interval_seconds / 60.0,
            "checkpoint_stall_seconds": policy.checkpoint_stall_seconds,
            "checkpoint_total_seconds": policy.checkpoint_total_seconds or policy.checkpoint_stall_seconds,
            "restart_overhead_seconds": policy.restart_overhead_seconds,
            "relaunch_seconds": policy.relaunch_seconds,
            "startup_seconds": policy.startup_seconds,
            "restore_seconds": policy.restore_seconds,
            "crash_detection_seconds": policy.crash_detection_seconds,
            "hang_timeout_seconds": policy.hang_timeout_seconds,
            "sdc_check_seconds": policy.sdc_check_seconds,
            "spares": policy.spares,
            "step_seconds": job.step_seconds,
            "inprocess_share": policy.inprocess_share,
            "inprocess_restart_seconds": policy.inprocess_restart_seconds,
            "warm_start_seconds": policy.warm_start_seconds,
            "memory_checkpoint": policy.memory_checkpoint,
            "memory_restore_seconds": policy.memory_restore_seconds,
            "replica_groups": policy.replica_groups,
            "group_reconfigure_seconds": policy.group_reconfigure_seconds,
        },
        "ettr": _stats(result.ettr),
        "interruptions": {
            "mean": float((unexpected + planned).mean()),
            "unexpected_mean": float(unexpected.mean()),
            "planned_mean": float(planned.mean()),
            "p5": float(np.percentile(unexpected + planned, 5)),
            "p95": float(np.percentile(unexpected + planned, 95)),
            "by_category": by_cat,
            "by_group": by_group,
        },
        "mttf_hours": (hours * result.trials / total_unexpected) if total_unexpected else None,
        "mttf_hours_analytic": model.job_mttf_hours(job.gpus) if model.rate_per_gpu_hour > 0 else None,
        "badput_hours": {b: float(result.buckets[b].mean() / 3600.0) for b in BUCKETS},
        "badput_fraction": {b: float(result.buckets[b].mean() / (hours * 3600.0)) for b in BUCKETS},
        "analytic": analytic(model, job, policy, result.interval_seconds),
        "throughput": {
            "straggler_loss_fraction": float(straggler.mean()),
            "diurnal_loss_fraction": diurnal,
            "effective_throughput_ratio": float((result.ettr * throughput).mean()),
        },
        "power_swing_mw": 0.0,
        "power": summarize(
            power, job.gpus, result.computing_fraction, result.checkpoint_fraction,
            had_failures=bool(counts.sum() > 0), had_checkpoints=bool(result.checkpoint_fraction.max() > 0),
        ),
    }
    doc["power_swing_mw"] = doc["power"]["largest_swing_mw"]
    return doc


def render_text(doc: dict[str, Any]) -> str:
    """Human summary of a simulate document."""
    e, i = doc["ettr"], doc["interruptions"]
    lines = [
        f"{doc['model']}: {doc['gpus']:,} GPUs ({doc['nodes']:,} nodes), {doc['days']:g} days, {doc['trials']} trials",
        f"checkpoint every {doc['policy']['checkpoint_interval_minutes']:.1f} min ({doc['policy']['interval']}), "
        f"stall {doc['policy']['checkpoint_stall_seconds']:g} s, "
        f"restart {doc['policy']['restart_overhead_seconds']:g} s",
        f"ETTR        mean {e['mean']:.4f}  p5 {e['p5']:.4f}  p95 {e['p95']:.4f}  "
        f"(Meta approx {doc['analytic']['meta_ettr']:.4f})",
        f"interruptions  {i['mean']:.1f} ({i['unexpected_mean']:.1f} unexpected, {i['planned_mean']:.1f} planned)",
    ]
    if doc["mttf_hours"] is not None:
        lines.append(f"job MTTF    {doc['mttf_hours']:.3f} h (analytic 1/(N r) = {doc['mttf_hours_analytic']:.3f} h)")
    groups = sorted(i["by_group"].items(), key=lambda kv: -kv[1])
    lines.append("by group    " + ", ".join(f"{g} {v:.1f}" for g, v in groups))
    top = sorted(i["by_category"].items(), key=lambda kv: -kv[1])[:6]
    lines.append("top causes  " + ", ".join(f"{c} {v:.1f}" for c, v in top))
    lines.append("badput (h)  " + ", ".join(f"{b} {h:.1f}" for b, h in doc["badput_hours"].items()))
    p = doc["power"]
    lines.append(f"power       mean {p['mean_mw']:.2f} MW, largest swing {p['largest_swing_mw']:.2f} MW "
                 f"({p['largest_swing_cause']})")
    return "\n".join(lines)
