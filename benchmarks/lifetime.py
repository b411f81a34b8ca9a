"""Time from SIGKILL of `trainguard run` to the job's last process gone, with a warm spare in each phase.

Phases (tests/e2e/_spare_phases.py, the driver the lifetime tests use): ``importing`` (a spare still loading
the script's imports), ``ready`` (a spare waiting for a rank), ``taking-over`` (spares that became the
ranks of a restart, with the refilled pool importing beside them). A job's processes are the agent, its
lifeline, its workers and its spares, found by a marker in their environment. Goal: <= 2 s in every
phase. ``--burn N`` repeats every phase with N busy-looping processes beside the job (a loaded node).

    .venv/bin/python benchmarks/lifetime.py [--reps 3] [--burn 2]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e._spare_phases import PHASES, kill_agent_in  # noqa: E402  (the tests' own driver)

GOAL_SECONDS = 2.0
BOUND_SECONDS = 30.0


def _section(reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for phase in PHASES:
        runs = []
        for _ in range(reps):
            with tempfile.TemporaryDirectory(prefix="tg-lifetime-") as tmp:
                runs.append(kill_agent_in(phase, Path(tmp), bound=BOUND_SECONDS))
        seconds = [r.seconds for r in runs if r.seconds is not None]
        out[phase] = {
            "seconds": [round(s, 3) for s in seconds],
            "median": round(statistics.median(seconds), 3) if seconds else None,
            "max": round(max(seconds), 3) if seconds else None,
            "outlived_bound": sum(r.seconds is None for r in runs),
            "processes_before_kill": [r.before for r in runs],
        }
    return out


def _met(section: dict[str, Any]) -> bool:
    return all(p["outlived_bound"] == 0 and p["max"] is not None and p["max"] <= GOAL_SECONDS
               for p in section.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--burn", type=int, default=0, help="busy-looping processes for a second, loaded pass")
    args = ap.parse_args()
    result: dict[str, Any] = {"goal_seconds": GOAL_SECONDS, "bound_seconds": BOUND_SECONDS, "reps": args.reps,
                              "cpus": os.cpu_count()}
    result["at_rest"] = _section(args.reps)
    result["met_at_rest"] = _met(result["at_rest"])
    if args.burn > 0:
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burn)]
        try:
            result["with_burners"] = {"burners": args.burn, **_section(args.reps)}
        finally:
            for b in burners:
                b.kill()
                b.wait()
        loaded = {k: v for k, v in result["with_burners"].items() if k in PHASES}
        result["met_with_burners"] = _met(loaded)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
