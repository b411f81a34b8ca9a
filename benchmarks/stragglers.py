"""Benchmark: straggler detection latency, cost accuracy, false positives and analysis speed; optionally on real runs.

Synthetic part: ``--streams`` slowed streams (1.3x from step 10, 2-8 ranks, noisy) and as many clean ones; reports
detection latency (steps after onset), cost error against the time the slowness really added, clean streams
flagged, and the analysis speed on a large job. ``--real``: an unmodified DDP script under ``trainguard run``,
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
    result: dict[str, Any] = {"synthetic": synthetic(a.streams)}
    if a.real:
        result["real_unmodified_ddp"] = real()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
