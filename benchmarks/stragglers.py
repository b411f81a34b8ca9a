"""Benchmark: straggler detection latency, cost accuracy, false positives and analysis speed; optionally on real runs.

Synthetic part: ``--streams`` slowed streams (1.3x from step 10, 2-8 ranks, noisy) and as many clean ones; reports
detection latency (steps after onset), cost error against the time the slowness really added, clean streams
flagged, and the analysis speed on a large job. Then per slowdown (1.1-2.0x), slow from step 1 and from mid-run on
a busy host: detection and online rates, false positives (``by_slowdown_busy_host``).
``--real``: an unmodified DDP script under ``trainguard run``,
slowed (``slow@step=5,rank=1,factor=1.3``) and clean, side by side: named rank, cost vs measured difference.
Prints one JSON object.

    python benchmarks/stragglers.py --streams 20 --real
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.unit.test_stragglers import synth  # noqa: E402  (the generator the unit tests use)
from trainguard.stragglers import analyze  # noqa: E402


def synthetic(streams: int) -> dict[str, Any]:
    latency, errors, flagged = [], [], 0
    for seed in range(streams):
        ranks = 2 + seed % 7
        recs, _, added = synth(ranks=ranks, steps=80, slow={ranks - 1: 1.3}, onset=10, noise=0.03, seed=seed,
                               spikes=0.05)
        found = analyze(recs).stragglers
        if found and found[0].rank == ranks - 1:
            latency.append(found[0].detected_step - 10)
            errors.append(found[0].cost_seconds / added - 1)
        clean, _, _ = synth(ranks=ranks, steps=80, noise=0.03, seed=1000 + seed, spikes=0.05)
        flagged += bool(analyze(clean).stragglers)
    big, _, _ = synth(ranks=512, steps=100, slow={7: 1.3}, onset=10, seed=1)
    t0 = time.perf_counter()
    analyze(big)
    seconds = time.perf_counter() - t0
    return {"slowed_streams": streams, "named": len(latency),
            "latency_steps_median": statistics.median(latency) if latency else None,
            "latency_steps_max": max(latency) if latency else None,
            "cost_error_median": statistics.median(errors) if errors else None,
            "cost_error_max_abs": max(abs(e) for e in errors) if errors else None,
            "clean_streams": streams, "clean_flagged": flagged,
            "analysis_seconds_512_ranks_100_steps": seconds}


SLOWDOWNS = (1.1, 1.2, 1.3, 1.5, 2.0)


def by_slowdown(streams: int) -> dict[str, Any]:
    """Per slowdown, slowness from step 1 and from mid-run (step 30 of 80), on a busy host (scheduling jitter of
    mean 0.3 x the step's work on every rank, plus 3% noise and 5% hiccups; 2-8 ranks): detection rate (the slow
    rank named, nobody else), online rate (named from the steps up to onset + 30), false positives (another rank
    named), and the same for clean streams of the same shape."""
    out: dict[str, Any] = {}
    for start, onset in (("from_step_1", 1), ("mid_run", 30)):
        rows = {}
        for f in SLOWDOWNS:
            named = online = wrong = 0
            estimates = []
            for seed in range(streams):
                ranks = 2 + seed % 7
                slow = seed % ranks
                recs, _, _ = synth(ranks=ranks, steps=80, slow={slow: f}, onset=onset, noise=0.03, spikes=0.05,
                                   jitter=0.3, seed=seed)
                found = analyze(recs).stragglers
                named += [s.rank for s in found] == [slow]
                wrong += any(s.rank != slow for s in found)
                estimates += [s.slowdown for s in found if s.rank == slow]
                early = analyze([e for e in recs if e.step <= onset + 30]).stragglers
                online += any(s.rank == slow for s in early)
            rows[str(f)] = {"detection_rate": named / streams, "online_within_30_steps_rate": online / streams,
                            "false_positive_streams": wrong,
                            "slowdown_estimate_median": statistics.median(estimates) if estimates else None}
        out[start] = rows
    flagged = 0
    for seed in range(streams):
        clean, _, _ = synth(ranks=2 + seed % 7, steps=80, noise=0.03, spikes=0.05, jitter=0.3, seed=5000 + seed)
        flagged += any(analyze([e for e in clean if e.step <= k]).stragglers for k in (25, 31, 40, 60, 80))
    out["clean_streams"] = streams
    out["clean_streams_flagged_at_any_length"] = flagged
    return out


def _run(run_dir: Path, inject: str) -> float:
    cmd = [sys.executable, "-m", "trainguard", "run", "--standalone", "--nproc-per-node", "2", "--run-dir",
           str(run_dir), "--quiet", "--no-health-checks", "--inject", inject,
           str(ROOT / "tests/e2e/unmodified/plain_ddp.py"), "--steps", "50", "--ckpt-dir", str(run_dir / "ck"),
           "--ckpt-every", "1000", "--step-seconds", "0.05"]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "TRAINGUARD_STRAGGLER_PROBE_SECONDS": "1"})
    steps = [json.loads(x) for x in (run_dir / "events/rank-0.jsonl").read_text().splitlines()]
    return sum(s["duration_seconds"] for s in steps if s.get("type") == "step_completed" and s["step"] > 1)


def real() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        slow_dir, clean_dir = Path(tmp) / "slow", Path(tmp) / "clean"
        slow_s, clean_s = _run(slow_dir, "slow@step=5,rank=1,factor=1.3"), _run(clean_dir, "none")
        out = subprocess.run([sys.executable, "-m", "trainguard", "stragglers", str(slow_dir), "--json"],
                             check=True, capture_output=True, text=True).stdout
        clean = subprocess.run([sys.executable, "-m", "trainguard", "stragglers", str(clean_dir), "--json"],
                               check=True, capture_output=True, text=True).stdout
    doc, clean_doc = json.loads(out), json.loads(clean)
    first = doc["stragglers"][0] if doc["stragglers"] else {}
    measured = slow_s - clean_s
    return {"named_rank": first.get("rank"), "detected_step": first.get("detected_step"),
            "onset_step": first.get("onset_step"), "slowdown": first.get("slowdown"),
            "cost_seconds": first.get("cost_seconds"), "measured_difference_seconds": measured,
            "cost_error": (first["cost_seconds"] / measured - 1) if first and measured > 0 else None,
            "clean_run_flagged": len(clean_doc["stragglers"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=20)
    p.add_argument("--real", action="store_true", help="also run the two real multi-process runs (~25 s)")
    a = p.parse_args()
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
    result: dict[str, Any] = {"load_average_1_5_15_min_at_start": load, "synthetic": synthetic(a.streams),
                              "by_slowdown_busy_host": by_slowdown(a.streams)}
    if a.real:
        result["real_unmodified_ddp"] = real()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
