"""Benchmark: trainguard's localization against torch's own analyzer (fr_trace) on the same dump files.

Per size it writes full torch-format NCCL dumps (``--entries`` entries with stack frames per rank,
complete pg_config, a planted hang), then measures in fresh processes: trainguard ``diagnose_path``
(wall seconds, peak RSS), merely unpickling every file (the floor any analyzer pays), and
``python -m torch.distributed.flight_recorder.fr_trace`` where it is expected to finish (else a lower
bound). A last row measures the supervisor's own evidence (few recent entries per rank) at
``--evidence-ranks``. Prints one JSON object.

    python benchmarks/localize.py --sizes 256,1024,4096 --fr-trace-max 1024
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PREFIX = "nccl_trace_rank_"

_CHILD_ANALYZE = """
import gc, json, resource, sys, time
from trainguard.localize import diagnose_path, unpickle
t = time.perf_counter(); c = time.process_time()
rep = diagnose_path(sys.argv[1])
out = {"seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c,
       "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
       "verdict": rep.verdict, "culprit_ranks": list(rep.culprit_ranks),
       "memory_guard": "rlimit-data" if unpickle._cap_enforced() else "opcode-walk"}
print(json.dumps(out))
"""

_CHILD_UNPICKLE = """
import gc, json, os, pickle, resource, sys, time
gc.disable()
d = sys.argv[1]
t = time.perf_counter(); c = time.process_time()
for name in sorted(os.listdir(d)):
    with open(os.path.join(d, name), "rb") as f:
        pickle.load(f)
print(json.dumps({"seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

_CHILD_FRTRACE = """
import contextlib, io, json, resource, runpy, sys, time
d, out_path = sys.argv[1], sys.argv[2]
sys.argv = ["fr_trace", d, "-p", "nccl_trace_rank_"]
buf = open(out_path + ".log", "w")
t = time.perf_counter()
try:
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        runpy.run_module("torch.distributed.flight_recorder.fr_trace", run_name="__main__")
except SystemExit:
    pass
finally:
    buf.close()
    with open(out_path, "w") as f:
        json.dump({"seconds": time.perf_counter() - t,
                   "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}, f)
"""


def _child(code: str, *args: str, timeout: float | None = None) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _fr_trace(directory: Path, timeout: float) -> dict[str, Any]:
    out = directory.parent / f"{directory.name}.frtrace.json"
    try:
        subprocess.run([sys.executable, "-c", _CHILD_FRTRACE, str(directory), str(out)], timeout=timeout,
                       capture_output=True, check=False)
    except subprocess.TimeoutExpired:
        return {"seconds": None, "timed_out": True}
    res = json.loads(out.read_text())
    log = Path(str(out) + ".log").read_text(errors="replace")
    m = re.search(r"missing ranks: \{([\d, ]+)\}", log) or re.search(r"Culprit rank (\d+)", log)
    res["culprit_ranks"] = sorted(int(x) for x in m.group(1).split(",")) if m else []
    res["log_lines"] = log.count("\n")
    return res


def measure(ranks: int, entries: int, tp: int, *, frames: int, fr_max: int, fr_timeout: float, work: Path,
            fr_reference: dict[str, Any] | None) -> dict[str, Any]:
    from trainguard.localize.synth import SynthConfig, write_dumps

    culprit = ranks // 3 + 1
    d = work / f"full-{ranks}"
    t = time.perf_counter()
    write_dumps(SynthConfig(ranks=ranks, entries_per_rank=entries, tp=tp, fault="hang", culprit=culprit,
                            frames=frames), d, prefix=PREFIX)
    gen = time.perf_counter() - t
    size = sum(p.stat().st_size for p in d.iterdir())
    # unpickle-only before and after ours (page cache and machine load vary); the faster one counts
    first = _child(_CHILD_UNPICKLE, str(d))
    ours = _child(_CHILD_ANALYZE, str(d))
    second = _child(_CHILD_UNPICKLE, str(d))
    floor = min(first, second, key=lambda r: r["seconds"])
    row: dict[str, Any] = {
        "mode": "full", "ranks": ranks, "entries_per_rank": entries, "frames_per_entry": frames, "tp": tp,
        "planted_culprit": culprit,
        "bytes_on_disk": size, "generate_seconds": round(gen, 2),
        "seconds": round(ours["seconds"], 3), "cpu_seconds": round(ours["cpu_seconds"], 3),
        "peak_rss_mb": round(ours["peak_rss_mb"], 1), "verdict": ours["verdict"],
        "culprit_ranks": ours["culprit_ranks"],
        "unpickle_only_seconds": round(floor["seconds"], 3),
        "unpickle_only_seconds_runs": [round(first["seconds"], 3), round(second["seconds"], 3)],
        "unpickle_only_cpu_seconds": round(floor["cpu_seconds"], 3),
        "unpickle_only_peak_rss_mb": round(floor["peak_rss_mb"], 1),
        "ratio_to_unpickle": round(ours["seconds"] / floor["seconds"], 2),
        "cpu_ratio_to_unpickle": round(ours["cpu_seconds"] / floor["cpu_seconds"], 2),
        "correct": ours["culprit_ranks"] == [culprit],
        "memory_guard": ours["memory_guard"],
    }
    if ranks <= fr_max:
        fr = _fr_trace(d, fr_timeout)
        if fr.get("timed_out"):
            row.update(fr_trace_seconds=None, fr_trace_lower_bound_seconds=fr_timeout,
                       fr_trace_bound_basis=f"killed after {fr_timeout:.0f} s")
        else:
            row.update(fr_trace_seconds=round(fr["seconds"], 2), fr_trace_peak_rss_mb=round(fr["peak_rss_mb"], 1),
                       fr_trace_culprit_ranks=fr["culprit_ranks"],
                       same_culprit=fr["culprit_ranks"] == ours["culprit_ranks"],
                       speedup_vs_fr_trace=round(fr["seconds"] / ours["seconds"], 1))
    elif fr_reference is not None:
        bound = fr_reference["fr_trace_seconds"] * ranks / fr_reference["ranks"]
        when = " measured in an earlier run" if fr_reference.get("earlier_run") else ""
        row.update(fr_trace_seconds=None, fr_trace_lower_bound_seconds=round(bound, 1),
                   fr_trace_bound_basis=(f"linear extrapolation from {fr_reference['ranks']} ranks{when} (not run: "
                                         "fr_trace keeps every file in memory and matches greedily, so its "
                                         "cost grows at least linearly)"),
                   speedup_vs_fr_trace_at_least=round(bound / ours["seconds"], 1))
    shutil.rmtree(d, ignore_errors=True)
    return row


def measure_evidence(ranks: int, recent: int, tp: int, work: Path) -> dict[str, Any]:
    from trainguard.localize.synth import SynthConfig, write_dumps

    culprit = ranks // 3 + 1
    d = work / f"evidence-{ranks}"
    write_dumps(SynthConfig(ranks=ranks, entries_per_rank=2000, tp=tp, fault="hang", culprit=culprit,
                            recent=recent), d, prefix=PREFIX)
    first = _child(_CHILD_UNPICKLE, str(d))
    ours = _child(_CHILD_ANALYZE, str(d))
    second = _child(_CHILD_UNPICKLE, str(d))
    floor = min(first, second, key=lambda r: r["seconds"])
    shutil.rmtree(d, ignore_errors=True)
    return {
        "mode": "evidence", "ranks": ranks, "entries_per_rank": recent, "tp": tp,
        "seconds": round(ours["seconds"], 3), "cpu_seconds": round(ours["cpu_seconds"], 3),
        "peak_rss_mb": round(ours["peak_rss_mb"], 1), "unpickle_only_seconds": round(floor["seconds"], 3),
        "unpickle_only_cpu_seconds": round(floor["cpu_seconds"], 3),
        "ratio_to_unpickle": round(ours["seconds"] / floor["seconds"], 2),
        "cpu_ratio_to_unpickle": round(ours["cpu_seconds"] / floor["cpu_seconds"], 2),
        "verdict": ours["verdict"], "culprit_ranks": ours["culprit_ranks"],
        "correct": ours["culprit_ranks"] == [culprit], "goal_under_10_seconds": ours["seconds"] < 10,
        "memory_guard": ours["memory_guard"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256,1024,4096", help="rank counts of full dumps (comma separated)")
    ap.add_argument("--entries", type=int, default=2000, help="entries per rank in full dumps (default 2000)")
    ap.add_argument("--tp", type=int, default=8, help="tensor-parallel group size (default 8)")
    ap.add_argument("--frames", type=int, default=24, help="stack frames per entry (default 24)")
    ap.add_argument("--fr-trace-max", type=int, default=1024, help="run fr_trace up to this many ranks")
    ap.add_argument("--fr-trace-timeout", type=float, default=900.0, help="seconds before fr_trace is stopped")
    ap.add_argument("--evidence-ranks", type=int, default=16384, help="ranks of the evidence-mode row (0: skip)")
    ap.add_argument("--evidence-entries", type=int, default=16, help="recent entries per rank in evidence mode")
    ap.add_argument("--fr-trace-reference", default=None, metavar="RANKS:SECONDS",
                    help="fr_trace time measured earlier at RANKS (same machine, same dumps) to extrapolate "
                         "lower bounds from when no size in this run runs fr_trace")
    ap.add_argument("--workdir", default=None, help="where to write dumps (default: a temporary directory)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if any(s < 2 for s in sizes) or args.entries < 1 or args.tp < 1 or args.frames < 1:
        ap.error("sizes must be >= 2 ranks, entries, tp and frames >= 1")
    if any(s % min(args.tp, s) for s in sizes):
        ap.error("--tp must divide every size")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tg-localize-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    reference = None
    if args.fr_trace_reference:
        try:
            ref_ranks, ref_seconds = args.fr_trace_reference.split(":")
            reference = {"ranks": int(ref_ranks), "fr_trace_seconds": float(ref_seconds), "earlier_run": True}
        except ValueError:
            ap.error("--fr-trace-reference must look like 1024:300.5")
    try:
        for n in sorted(sizes):
            print(f"[localize bench] {n} ranks x {args.entries} entries", file=sys.stderr, flush=True)
            row = measure(n, args.entries, min(args.tp, n), frames=args.frames, fr_max=args.fr_trace_max,
                          fr_timeout=args.fr_trace_timeout, work=work, fr_reference=reference)
            if row.get("fr_trace_seconds"):
                reference = row
            rows.append(row)
        if args.evidence_ranks:
            print(f"[localize bench] evidence mode, {args.evidence_ranks} ranks", file=sys.stderr, flush=True)
            rows.append(measure_evidence(args.evidence_ranks, args.evidence_entries, args.tp, work))
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({
        "benchmark": "localize",
        "anchor": "python -m torch.distributed.flight_recorder.fr_trace on the same files",
        "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg()[0],
        "sizes": rows,
    }, indent=2))


if __name__ == "__main__":
    main()
