"""The prepared GPU check: trainguard's NCCL, NVML and GPU-memory paths on one NVIDIA GPU, in one JSON object.

Runs from a source checkout (``PYTHONPATH=src``, nothing installed; ``scripts/gpu-check`` does that) on a
machine with one GPU, the torch it has (2.11-2.15), Python 3.11+, and only torch, numpy, psutil, xxhash
and nvidia-ml-py besides the standard library. Every section runs in its own process with its own
timeout under one global deadline (``--deadline``, 450 s), so the check always ends, and a failed section
never stops the others:

* ``demo_nccl``: the packaged demo (``python -m trainguard demo``, 1 rank, NCCL when CUDA is there) with a
  crash and a hang injected, next to the same demo without faults (same seed, run at the same time):
  both faults detected, resumed from checkpoints, final loss equal.
* ``nccl_flight_recorder``: a 1-rank NCCL group doing a few collectives, dumped through
  ``trainguard.torch_api.c10d`` as pickle and JSON (``nccl_trace_rank_0``), read by ``trainguard diagnose``.
* ``nvml``: ``trainguard health --json`` and the telemetry sampler (``trainguard.telemetry.samplers.GpuSource``)
  against ``nvidia-smi --query-gpu`` read in between.
* ``checkpoint_gpu``: a >= 2 GB model in GPU memory saved and restored by ``trainguard.Checkpointer`` and by
  plain DCP, side by side: stall, throughput, restore.
* ``overhead``: a ~300M-parameter GPT in bf16 under ``trainguard run`` vs bare ``torch.distributed.run``,
  same script (never importing trainguard), paired and interleaved.

``--cpu-smoke`` runs the same logic on CPU with gloo and tiny sizes (no GPU: NVML and nvidia-smi are
reported skipped, the NCCL parts run on gloo). It also hides the modules the GPU machine lacks
(``--hide-modules``) so the same import paths are exercised. Prints exactly one JSON object on stdout
(progress goes to stderr); ``--out FILE`` writes it there too. docs/gpu-check.md describes every figure.

    PYTHONPATH=src python benchmarks/gpu_check.py [--out FILE] [--deadline 450] [--only a,b] [--skip a,b]
    .venv/bin/python benchmarks/gpu_check.py --cpu-smoke

Only the standard library is imported at the top: the section processes import torch and trainguard, and
the overhead workload (``--overhead-worker``) imports torch only.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared helpers
from page_cache import evict_tree

THIS = Path(__file__).resolve()
ROOT = THIS.parents[1]
SRC = ROOT / "src"
FORMAT = 1
SECTIONS = ("demo_nccl", "nccl_flight_recorder", "nvml", "checkpoint_gpu", "overhead")
PARALLEL = ("demo_nccl", "nccl_flight_recorder", "nvml")
"""Sections that run at the same time (none of them times anything the others would disturb much)."""
DEFAULT_DEADLINE = 450.0
SECTION_CAPS = {"environment": 90.0, "demo_nccl": 240.0, "nccl_flight_recorder": 150.0, "nvml": 120.0,
                "checkpoint_gpu": 170.0, "overhead": 600.0}
"""Longest each section may run (seconds); the global deadline cuts these down."""
RESERVE_AFTER = {"parallel": 0.56, "checkpoint_gpu": 0.36}
"""Share of the deadline kept for what comes after a phase: the parallel phase leaves 56 % of it to the
checkpoint and overhead sections, the checkpoint section leaves 36 % to the overhead section."""
FINISH_MARGIN = 5.0
BACKSTOP_SECONDS = 10.0
"""How long past its own timeout a section process may run before the orchestrator stops it."""
"""Seconds kept at the end to assemble and print the result."""
SMI_FIELDS = ("index", "name", "temperature.gpu", "power.draw", "clocks.sm", "utilization.gpu", "memory.used")
DEFAULT_HIDDEN = ("re2", "starlette", "uvicorn", "plotly", "prometheus_client")
"""What ``--cpu-smoke`` hides by default: modules this project uses that the GPU machine does not have."""
PROBED_MODULES = ("torch", "numpy", "psutil", "xxhash", "pynvml", "packaging", "re2", "jinja2", "starlette",
                  "uvicorn", "plotly", "prometheus_client")
LOSS_TOLERANCE = 1e-6
"""Largest absolute difference between the final losses with and without faults that counts as equal."""
OVERHEAD_GOAL = 0.01
NVML_TOLERANCES: dict[str, tuple[float, float]] = {
    "temperature_c": (3.0, 0.0), "power_watts": (15.0, 0.10), "clock_mhz": (45.0, 0.05),
    "utilization_pct": (15.0, 0.0), "memory_used_mib": (1024.0, 0.02),
}
"""(absolute, relative) tolerance of each reading against nvidia-smi's: the larger of the two counts."""
SMI_TO_READING = {"temperature.gpu": "temperature_c", "power.draw": "power_watts", "clocks.sm": "clock_mhz",
                  "utilization.gpu": "utilization_pct", "memory.used": "memory_used_mib"}
SAMPLER_FIELDS = ("temperature_c", "power_watts", "clock_mhz")
"""The readings trainguard's telemetry sampler takes; the others are read with pynvml directly."""

RE2_STUB = '''"""Stand-in for google-re2, put on PYTHONPATH by benchmarks/gpu_check.py where re2 is not installed.

Importing it works (trainguard run imports trainguard.classify at start); any use raises ImportError, which
trainguard's classification treats as a failed classification (category Unknown).
"""


def __getattr__(name):
    raise ImportError(f"google-re2 is not installed (re2.{name} used; benchmarks/gpu_check.py stand-in)")
'''

HIDE_TEMPLATE = "raise ImportError({message!r})\n"


# --- pure helpers (tests/unit/test_gpu_check.py) --------------------------------------------------


class Deadline:
    """The global deadline: seconds left, and the timeout a section may have."""

    def __init__(self, total_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = float(total_seconds)
        self.clock = clock
        self.start = clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def remaining(self) -> float:
        return max(0.0, self.total - self.elapsed())

    def expired(self) -> bool:
        return self.remaining() <= FINISH_MARGIN

    def timeout_for(self, cap: float, reserve_fraction: float = 0.0) -> float:
        """Seconds a section may take: its cap, cut so that ``reserve_fraction`` of the whole deadline (for
        the sections after it) and the finishing margin are left; 0 when nothing is left."""
        left = self.remaining() - FINISH_MARGIN - reserve_fraction * self.total
        return max(0.0, min(cap, left))


def skipped(reason: str, *, ok: bool, **figures: Any) -> dict[str, Any]:
    """A section that did not run (``ok`` says whether that is expected here: no GPU in the smoke run)."""
    return {"ok": ok, "skipped": True, "reason": reason, **figures}


def failed(error: str, **figures: Any) -> dict[str, Any]:
    return {"ok": False, "skipped": False, "error": error, **figures}


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN), recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def normalize_section(name: str, result: Any) -> dict[str, Any]:
    """Every section result has ``ok`` (bool) and ``skipped`` (bool); a failure has ``error``."""
    if not isinstance(result, dict):
        return failed(f"section {name} returned {type(result).__name__}, not an object")
    out = dict(result)
    out["ok"] = bool(out.get("ok", False))
    out["skipped"] = bool(out.get("skipped", False))
    if not out["ok"] and not out["skipped"] and not out.get("error"):
        out["error"] = "; ".join(f"{k} failed" for k, v in (out.get("checks") or {}).items() if not v) \
            or "failed without an error message"
    return out


def assemble(mode: str, environment: dict[str, Any], sections: Mapping[str, Any], *, started: str,
             wall_seconds: float, deadline_seconds: float, findings: Sequence[str] = (),
             arguments: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The one JSON object the check prints."""
    norm = {name: normalize_section(name, sections.get(name, failed("not run"))) for name in SECTIONS
            if name in sections}
    collected = list(findings)
    goals: dict[str, Any] = {}
    for name, sec in norm.items():
        collected += [f"{name}: {f}" for f in sec.get("findings", []) if isinstance(f, str)]
        for goal, met in (sec.get("goals") or {}).items() if isinstance(sec.get("goals"), dict) else ():
            goals[f"{name}.{goal}"] = met
        if "goal_met" in sec:
            goals[f"{name}.goal_met"] = sec["goal_met"]
    return finite({
        "check": "trainguard gpu_check",
        "format": FORMAT,
        "mode": mode,
        "ok": bool(norm) and all(s["ok"] for s in norm.values()) and bool(environment.get("ok", True)),
        "started": started,
        "wall_seconds": round(wall_seconds, 2),
        "deadline_seconds": deadline_seconds,
        "environment": environment,
        "sections": norm,
        "summary": {n: ("skipped" if s["skipped"] else "ok" if s["ok"] else "failed") for n, s in norm.items()},
        "goals": goals if mode != "cpu-smoke" else {},
        "goals_note": "performance goals are judged in a GPU run only" if mode == "cpu-smoke" else None,
        "findings": collected,
        "arguments": dict(arguments or {}),
    })


def _number(text: str) -> float | None:
    t = text.strip()
    if not t or t.startswith("[") or t.upper() in {"N/A", "NA", "NOT SUPPORTED", "UNKNOWN ERROR", "ERR!"}:
        return None
    try:
        return float(t)
    except ValueError:
        return None


def parse_smi_csv(text: str, fields: Sequence[str] = SMI_FIELDS) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits``: numbers as floats (``index``
    as int), ``name`` as text, ``[N/A]``/``[Not Supported]`` as None. A name containing commas is rejoined;
    a line with too few fields raises ValueError naming it."""
    rows: list[dict[str, Any]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        parts = [p.strip() for p in line.split(",")]
        extra = len(parts) - len(fields)
        if extra > 0 and "name" in fields:
            at = list(fields).index("name")
            parts = [*parts[:at], ", ".join(parts[at : at + extra + 1]), *parts[at + extra + 1 :]]
        if len(parts) != len(fields):
            raise ValueError(f"nvidia-smi line has {len(parts)} fields, expected {len(fields)}: {line!r}")
        row: dict[str, Any] = {}
        for key, value in zip(fields, parts, strict=True):
            if key == "name":
                row[key] = value
            elif key == "index":
                num = _number(value)
                row[key] = int(num) if num is not None else None
            else:
                row[key] = _number(value)
        rows.append(row)
    return rows


def within(reading: float | None, reference: float | None, abs_tol: float, rel_tol: float) -> bool | None:
    """Whether ``reading`` matches ``reference`` within the larger tolerance; None when either is missing."""
    if reading is None or reference is None:
        return None
    return abs(reading - reference) <= max(abs_tol, rel_tol * abs(reference))


def compare_round(before: Mapping[str, float | None], smi: Mapping[str, Any], after: Mapping[str, float | None],
                  tolerances: Mapping[str, tuple[float, float]] = NVML_TOLERANCES) -> dict[str, Any]:
    """One reading of nvidia-smi between two NVML readings: per field the three values, nvidia-smi minus the
    NVML mean, and whether nvidia-smi lies within tolerance of the bracket the two NVML readings span."""
    out: dict[str, Any] = {}
    for smi_key, key in SMI_TO_READING.items():
        a, b, s = before.get(key), after.get(key), smi.get(smi_key)
        known = [v for v in (a, b) if v is not None]
        entry: dict[str, Any] = {"nvml_before": a, "nvidia_smi": s, "nvml_after": b}
        if known and s is not None:
            lo, hi = min(known), max(known)
            abs_tol, rel_tol = tolerances.get(key, (0.0, 0.0))
            slack = max(abs_tol, rel_tol * abs(s))
            entry["difference"] = round(s - statistics.fmean(known), 3)
            entry["within_tolerance"] = lo - slack <= s <= hi + slack
        else:
            entry["difference"] = None
            entry["within_tolerance"] = None
        out[key] = entry
    return out


def summarize_rounds(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per field over the rounds: largest |difference| and whether every comparable round was in tolerance."""
    out: dict[str, Any] = {}
    for key in SMI_TO_READING.values():
        diffs = [r[key]["difference"] for r in rounds if r.get(key, {}).get("difference") is not None]
        oks = [r[key]["within_tolerance"] for r in rounds if r.get(key, {}).get("within_tolerance") is not None]
        out[key] = {"max_abs_difference": round(max((abs(d) for d in diffs), default=0.0), 3) if diffs else None,
                    "rounds_compared": len(oks), "all_within_tolerance": all(oks) if oks else None,
                    "tolerance_abs_rel": list(NVML_TOLERANCES.get(key, (0.0, 0.0)))}
    return out


def step_losses(lines: Iterable[str]) -> dict[int, float]:
    """Step -> loss of the last ``step_completed`` record of each step (a restart re-executes steps)."""
    out: dict[int, float] = {}
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("type") == "step_completed" and isinstance(rec.get("step"), int) \
                and isinstance(rec.get("loss"), (int, float)):
            out[rec["step"]] = float(rec["loss"])
    return out


def compare_losses(fault_free: Mapping[int, float], with_faults: Mapping[int, float], target_step: int,
                   tolerance: float = LOSS_TOLERANCE) -> dict[str, Any]:
    """The final (target step) loss of both runs and every step's loss both runs recorded, compared."""
    a, b = fault_free.get(target_step), with_faults.get(target_step)
    common = sorted(set(fault_free) & set(with_faults))
    diffs = [abs(fault_free[s] - with_faults[s]) for s in common]
    diff = abs(a - b) if a is not None and b is not None else None
    return {
        "target_step": target_step, "final_loss_fault_free": a, "final_loss_with_faults": b,
        "abs_difference": diff, "bitwise_equal": a is not None and a == b, "tolerance_abs": tolerance,
        "equal_within_tolerance": diff is not None and diff <= tolerance,
        "steps_compared": len(common), "max_abs_difference_any_step": max(diffs) if diffs else None,
    }


def pair_order(index: int) -> tuple[str, str]:
    """A B, B A, A B, ...: pairs alternate which launcher goes first, so a drift in the machine cancels."""
    return ("trainguard", "torchrun") if index % 2 == 0 else ("torchrun", "trainguard")


def overhead_summary(pairs: Sequence[Mapping[str, Any]], goal: float = OVERHEAD_GOAL) -> dict[str, Any]:
    """Median over pairs of trainguard's median step time over bare torchrun's (and the same for means)."""
    ratios = [p["ratio_median"] for p in pairs if p.get("ratio_median") is not None]
    mean_ratios = [p["ratio_mean"] for p in pairs if p.get("ratio_mean") is not None]
    if not ratios:
        return {"median_ratio": None, "overhead_fraction": None, "mean_ratio": None, "goal_overhead_below": goal,
                "goal_met": None}
    median_ratio = statistics.median(ratios)
    return {"median_ratio": round(median_ratio, 5), "overhead_fraction": round(median_ratio - 1.0, 5),
            "mean_ratio": round(statistics.median(mean_ratios), 5) if mean_ratios else None,
            "goal_overhead_below": goal, "goal_met": median_ratio - 1.0 < goal}


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object a command printed on stdout (the last line that starts one, or the whole text)."""
    text = text.strip()
    if not text:
        return None
    with contextlib.suppress(ValueError):
        obj = json.loads(text)
        return obj if isinstance(obj, dict) else None
    start = text.find("{")
    while start != -1:
        with contextlib.suppress(ValueError):
            obj = json.loads(text[start:])
            return obj if isinstance(obj, dict) else None
        start = text.find("{", start + 1)
    return None


def tail(text: str, lines: int = 15, limit: int = 3000) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])[-limit:]


# --- processes ------------------------------------------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(entry))
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; empty elsewhere)."""
    kids = _children_map()
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen[Any], grace: float = 8.0) -> None:
    """SIGTERM the process and everything below it (a supervisor stops its workers on SIGTERM), then
    SIGKILL whatever is left after ``grace`` seconds."""
    pids = {proc.pid, *descendants(proc.pid)}
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    pids |= set(descendants(proc.pid)) if proc.poll() is None else set()
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


@dataclass
class Done:
    """How a command ended."""

    rc: int | None
    out: str
    err: str
    seconds: float
    timed_out: bool

    def brief(self) -> dict[str, Any]:
        return {"exit_code": self.rc, "seconds": round(self.seconds, 2), "timed_out": self.timed_out}


class Proc:
    """A command in its own session, stdout and stderr to files, stopped with its whole tree on timeout."""

    def __init__(self, cmd: Sequence[str], *, logs: Path, name: str, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, stdout: Any = None, stderr: Any = None) -> None:
        logs.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = logs / f"{name}.stdout", logs / f"{name}.stderr"
        self.t0 = time.monotonic()
        with open(self.out_path, "wb") as out_fh, open(self.err_path, "wb") as err_fh:
            self.popen = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL,
                                          stdout=stdout if stdout is not None else out_fh,
                                          stderr=stderr if stderr is not None else err_fh,
                                          env=dict(env) if env is not None else None, cwd=cwd,
                                          start_new_session=True)

    def wait(self, timeout: float) -> Done:
        timed_out = False
        try:
            self.popen.wait(timeout=max(0.1, timeout))
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(self.popen)
        seconds = time.monotonic() - self.t0
        return Done(None if timed_out else self.popen.returncode, _read(self.out_path), _read(self.err_path),
                    seconds, timed_out)

    def stop(self) -> None:
        if self.popen.poll() is None:
            kill_tree(self.popen, grace=3.0)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def run_cmd(cmd: Sequence[str], timeout: float, *, logs: Path, name: str, env: Mapping[str, str] | None = None,
            cwd: Path | None = None) -> Done:
    return Proc(cmd, logs=logs, name=name, env=env, cwd=cwd).wait(timeout)


def progress(message: str) -> None:
    print(f"gpu_check: {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- section context --------------------------------------------------------------------------------


@dataclass
class Context:
    """What a section process gets from the orchestrator (a JSON file)."""

    name: str
    mode: str
    """``gpu`` or ``cpu-smoke``."""
    tmp: Path
    deadline_at: float
    """Wall-clock (time.time()) second by which the section must have finished."""
    out: Path
    params: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def smoke(self) -> bool:
        return self.mode == "cpu-smoke"

    @property
    def cuda(self) -> bool:
        return bool(self.environment.get("cuda_available")) and not self.smoke

    @property
    def py(self) -> str:
        return sys.executable

    def remaining(self) -> float:
        return max(0.0, self.deadline_at - time.time())

    def budget(self, cap: float, keep: float = 0.0) -> float:
        """A sub-command's timeout: ``cap``, cut to what is left of the section less ``keep`` seconds (at most
        half of what is left: a short section still gives its main command most of its time)."""
        left = self.remaining()
        return max(1.0, min(cap, left - min(keep, left / 2)))

    def logs(self) -> Path:
        return self.tmp / "logs" / self.name

    def save(self, result: Mapping[str, Any]) -> None:
        """Write the result so far (a section stopped by its timeout still reports what it measured)."""
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(finite(dict(result)), default=str))
        os.replace(tmp, self.out)

    def say(self, message: str) -> None:
        progress(f"[{self.name}] {message}")


def trainguard_cmd(ctx: Context, *args: str) -> list[str]:
    return [ctx.py, "-m", "trainguard", *args]


def read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def records(path: Path, record_type: str | None = None) -> list[dict[str, Any]]:
    out = []
    for line in read_lines(path):
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict) and (record_type is None or rec.get("type") == record_type):
                out.append(rec)
    return out


def dump_summary(data: Any) -> dict[str, Any]:
    """Entry count, states, op names and timing fields of a flight-recorder dump already decoded."""
    if not isinstance(data, dict):
        return {"decoded": False}
    entries = data.get("entries") or []
    entries = [e for e in entries if isinstance(e, dict)]
    states = Counter(str(e.get("state")) for e in entries)
    ops = Counter(str(e.get("profiling_name")) for e in entries)
    timed = sum(1 for e in entries if e.get("time_discovered_started_ns") or e.get("duration_ms"))
    return {"decoded": True, "version": data.get("version"), "entries": len(entries), "states": dict(states),
            "ops": dict(ops), "entries_with_timing": timed,
            "comm_lib_version": data.get("comm_lib_version") or data.get("nccl_version"),
            "process_groups": len(data.get("pg_status") or {})}


def read_dump(path: Path) -> dict[str, Any]:
    """A dump file summarized: pickles through trainguard's restricted unpickler, JSON with json."""
    raw = path.read_bytes()
    if path.suffix == ".json" or raw[:1] == b"{":
        return {"file": path.name, "bytes": len(raw), **dump_summary(json.loads(raw))}
    from trainguard.localize.unpickle import safe_unpickle

    return {"file": path.name, "bytes": len(raw), **dump_summary(safe_unpickle(raw))}


def diagnose(ctx: Context, path: Path, name: str) -> dict[str, Any]:
    done = run_cmd(trainguard_cmd(ctx, "diagnose", str(path), "--json"), ctx.budget(60), logs=ctx.logs(), name=name)
    rep = parse_json_object(done.out)
    if rep is None:
        return {**done.brief(), "error": tail(done.err) or "no JSON from diagnose"}
    return {**done.brief(), "verdict": rep.get("verdict"), "backend": rep.get("backend"),
            "format_versions": rep.get("format_versions"), "ranks_analyzed": rep.get("ranks_analyzed"),
            "culprit_ranks": rep.get("culprit_ranks"), "warnings": rep.get("warnings"),
            "explanation": str(rep.get("explanation", ""))[:400]}


# --- environment ----------------------------------------------------------------------------------


def fs_type(path: Path) -> str:
    """The file-system type of the mount holding ``path`` (from /proc/mounts), or ``?``."""
    best, kind = "", "?"
    target = str(path.resolve()).rstrip("/") + "/"
    for line in read_lines(Path("/proc/mounts")):
        parts = line.split()
        if len(parts) < 3:
            continue
        mount = parts[1].replace("\\040", " ").rstrip("/") + "/"
        if target.startswith(mount) and len(mount) > len(best):
            best, kind = mount, parts[2]
    return kind


def section_environment(ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": True, "python": platform.python_version(), "executable": sys.executable,
                           "platform": platform.platform(), "cpus": os.cpu_count(), "hostname": socket.gethostname()}
    modules: dict[str, str] = {}
    for name in PROBED_MODULES:
        try:
            mod = importlib.import_module(name)
            modules[name] = "ok " + str(getattr(mod, "__version__", "") or "").strip()
        except Exception as exc:
            modules[name] = f"missing ({type(exc).__name__}: {exc})"[:200]
    out["modules"] = modules
    try:
        import torch

        out["torch"] = str(torch.__version__)
        out["torch_cuda"] = getattr(torch.version, "cuda", None)
        out["cuda_available"] = bool(torch.cuda.is_available())
        if out["cuda_available"]:
            out["cuda_devices"] = torch.cuda.device_count()
            out["gpu_name"] = torch.cuda.get_device_name(0)
            with contextlib.suppress(Exception):
                v = torch.cuda.nccl.version()
                out["nccl_version"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
            props = torch.cuda.get_device_properties(0)
            out["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    except Exception as exc:
        out["ok"] = False
        out["error"] = f"torch: {type(exc).__name__}: {exc}"
        out["cuda_available"] = False
    try:
        import trainguard

        out["trainguard_file"] = str(Path(trainguard.__file__).resolve())
        out["trainguard_from_this_checkout"] = str(SRC.resolve()) in out["trainguard_file"]
    except Exception as exc:
        out["ok"] = False
        out["error"] = f"trainguard: {type(exc).__name__}: {exc}"
        return out
    try:
        from trainguard.torch_api.features import probe

        out["torch_support"] = probe().to_json()
    except Exception as exc:
        out["torch_support"] = f"probe failed: {type(exc).__name__}: {exc}"
    try:
        importlib.import_module("trainguard.classify")
        out["classify_import"] = "ok"
    except Exception as exc:
        out["classify_import"] = f"failed ({type(exc).__name__}: {exc})"[:300]
    tmp = ctx.tmp
    usage = shutil.disk_usage(tmp)
    out["tmp_dir"] = {"path": str(tmp), "filesystem": fs_type(tmp), "free_gb": round(usage.free / 1e9, 1)}
    out["nvidia_smi"] = shutil.which("nvidia-smi")
    return out


# --- demo_nccl ------------------------------------------------------------------------------------


def _demo_params(ctx: Context) -> dict[str, int]:
    # A save waits for the previous one, so by step 2k+1 the checkpoint of step k is committed whatever the
    # speed of the disk: each fault lands after one that surely is (a crash right after a save would find
    # only that save's uncommitted staging and start over, which proves nothing about resuming).
    if ctx.smoke:
        return {"steps": 12, "ckpt_every": 3, "crash": 7, "hang": 10}
    return {"steps": 30, "ckpt_every": 5, "crash": 11, "hang": 21}


def section_demo_nccl(ctx: Context) -> dict[str, Any]:
    if not ctx.smoke and not ctx.cuda:
        return skipped("no CUDA device: the demo would run on gloo", ok=False)
    p = {**_demo_params(ctx), **ctx.params.get("demo", {})}
    inject = f"crash@step={p['crash']},rank=0;hang@step={p['hang']},rank=0"
    base = ["demo", "--ranks", "1", "--steps", str(p["steps"]), "--ckpt-every", str(p["ckpt_every"]),
            "--seed", "0", "--json"]
    runs = {"fault_free": ctx.tmp / "demo-fault-free", "with_faults": ctx.tmp / "demo-with-faults"}
    result: dict[str, Any] = {"ok": False, "skipped": False, "parameters": {**p, "inject": inject, "ranks": 1},
                              "expected_backend": "nccl" if ctx.cuda else "gloo", "findings": []}
    ctx.say(f"two demos at once: fault-free and {inject} ({p['steps']} steps)")
    procs = {
        name: Proc(trainguard_cmd(ctx, *base, "--inject", "none" if name == "fault_free" else inject,
                                  "--run-dir", str(run_dir)), logs=ctx.logs(), name=name)
        for name, run_dir in runs.items()
    }
    demos: dict[str, Any] = {}
    for name, proc in procs.items():
        done = proc.wait(ctx.budget(SECTION_CAPS["demo_nccl"], keep=40))
        j = parse_json_object(done.out) or {}
        demos[name] = {**done.brief(), **{k: j.get(k) for k in ("status", "reason", "completed_steps", "target_steps",
                                                                 "final_loss", "ettr", "attempts", "wall_seconds",
                                                                 "interruptions", "unfired_faults")}}
        if done.timed_out:
            demos[name]["error"] = f"stopped after {done.seconds:.0f}s (the section's time ran out)"
        elif not j:
            demos[name]["error"] = tail(done.err) or "no JSON from the demo"
        ctx.say(f"{name}: exit {done.rc} in {done.seconds:.1f}s, status {j.get('status')}")
    result["runs"] = demos
    ctx.save(result)
    faulty = runs["with_faults"]
    rep_done = run_cmd(trainguard_cmd(ctx, "report", str(faulty), "--json"), ctx.budget(60, keep=10), logs=ctx.logs(),
                       name="report")
    rep = parse_json_object(rep_done.out) or {}
    interruptions = [{k: i.get(k) for k in ("attempt", "kind", "step", "detection_latency_seconds", "culprit_ranks",
                                            "verdict", "category", "time_lost_seconds")}
                     for i in rep.get("interruptions") or []]
    result["report"] = {**rep_done.brief(), "status": rep.get("status"), "ettr": rep.get("ettr"),
                        "attempts": rep.get("attempts"), "interruptions": interruptions}
    if not rep:
        result["report"]["error"] = tail(rep_done.err) or "no JSON from report"
    kinds = [i.get("kind") for i in interruptions]
    # Losses from rank 0's events (the last execution of each step), compared step by step.
    losses = {name: step_losses(read_lines(d / "events" / "rank-0.jsonl")) for name, d in runs.items()}
    result["loss"] = compare_losses(losses["fault_free"], losses["with_faults"], p["steps"])
    loads = [{"attempt": r.get("attempt"), "step": r.get("step"), "seconds": r.get("seconds"), "bytes": r.get("bytes")}
             for r in records(faulty / "events" / "rank-0.jsonl", "checkpoint_loaded")]
    result["restores"] = loads
    # The evidence of the hang: which recorder the dump came from, what it holds, what diagnose says.
    hang_attempts = [i.get("attempt") for i in interruptions if i.get("kind") == "hang"]
    dumps = sorted(faulty.glob("diagnostics/attempt-*/fr_trace_rank_*.pkl"))
    if hang_attempts:
        preferred = [d for d in dumps if d.parent.name == f"attempt-{hang_attempts[0]}"]
        dumps = preferred or dumps
    if dumps:
        dump = dumps[0]
        try:
            result["hang_dump"] = read_dump(dump)
        except Exception as exc:
            result["hang_dump"] = {"file": str(dump), "error": f"{type(exc).__name__}: {exc}"}
        result["hang_dump"]["diagnose"] = diagnose(ctx, dump.parent, "diagnose-hang")
    else:
        result["hang_dump"] = {"error": "no flight-recorder dump in the run's diagnostics"}
    backend = (result["hang_dump"].get("diagnose") or {}).get("backend")
    result["backend_seen"] = backend
    tele = Counter(str(r.get("source")) for f in sorted(faulty.glob("events/telemetry-*.jsonl"))
                   for r in records(f, "telemetry_sample"))
    result["telemetry_samples"] = dict(tele)
    clean_ok = demos["fault_free"].get("status") == "completed" and demos["fault_free"].get("exit_code") == 0
    faulty_ok = demos["with_faults"].get("status") == "completed" and demos["with_faults"].get("exit_code") == 0
    checks = {
        "fault_free_completed": clean_ok,
        "with_faults_completed": faulty_ok,
        "crash_detected": "crash" in kinds,
        "hang_detected": "hang" in kinds,
        "every_fault_fired": demos["with_faults"].get("unfired_faults") == [],
        "resumed_from_checkpoint": sum(1 for r in loads if (r.get("step") or 0) > 0) >= 2,
        "final_loss_equal": bool(result["loss"]["equal_within_tolerance"]),
        f"backend_{result['expected_backend']}": backend == result["expected_backend"],
    }
    if ctx.cuda:  # the agent's telemetry sampler takes one sample per attempt at least
        checks["telemetry_sampled_the_gpu"] = tele.get("gpu", 0) > 0
    result["checks"] = checks
    result["ok"] = all(checks.values())
    if backend is not None and backend != result["expected_backend"]:
        result["findings"].append(f"the demo's collectives ran on {backend}, expected {result['expected_backend']} "
                                  "(src/trainguard/examples/train_gpt.py picks the backend)")
    for i in interruptions:
        if i.get("kind") == "hang" and not i.get("culprit_ranks"):
            result["findings"].append(f"the 1-rank hang of attempt {i.get('attempt')} was detected with no culprit "
                                      f"rank named (verdict {i.get('verdict')}): with one rank nobody is 'behind'")
    if not result["ok"]:
        result["error"] = "; ".join(k for k, v in checks.items() if not v) + " failed" + "".join(
            f"; {n}: {d['error']}" for n, d in demos.items() if d.get("error"))
        result["logs_tail"] = {n: tail((ctx.logs() / f"{n}.stderr").read_text(errors="replace"), 12)
                               for n in runs if (ctx.logs() / f"{n}.stderr").exists()}
        result["rank_logs_tail"] = {f"{n}/{log.relative_to(d)}": tail(log.read_text(errors="replace"), 10)
                                    for n, d in runs.items() for log in sorted(d.glob("logs/attempt-*/rank-0.log"))}
    return result


# --- nccl_flight_recorder ----------------------------------------------------------------------------


FR_OPS = 5
"""all_reduces the flight-recorder worker runs (then one all_gather and one broadcast)."""


def fr_worker(argv: Sequence[str]) -> int:
    """``--fr-worker``: a 1-rank process group, a few collectives, the flight recorder dumped four ways."""
    ap = argparse.ArgumentParser(prog="gpu_check.py --fr-worker")
    ap.add_argument("--fr-worker", action="store_true")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--backend", default="nccl")
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    from trainguard.torch_api import c10d

    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    cuda = "nccl" in args.backend  # "nccl", or a mixed "cpu:gloo,cuda:nccl" group
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    t = torch.ones(1 << 20, device=device)
    for _ in range(FR_OPS):
        dist.all_reduce(t)
    gathered = [torch.empty_like(t)]
    dist.all_gather(gathered, t)
    dist.broadcast(t, 0)
    if cuda:
        torch.cuda.synchronize()
    time.sleep(0.5)  # NCCL's watchdog marks finished work as it polls
    prefix = "nccl" if cuda else "fr"
    info: dict[str, Any] = {"backend": dist.get_backend(), "value_after_all_reduce": float(t[0]),
                            "ops_issued": FR_OPS + 2}
    # pickle/json: what the section asks for (backend="nccl"); generic: the generic recorder; worker_choice: what
    # trainguard's own worker asks for, dist.get_backend() (worker/control.py), which differs for a mixed group.
    for fmt, sub, name in (("pickle", "pickle", f"{prefix}_trace_rank_0"),
                           ("json", "json", f"{prefix}_trace_rank_0.json"),
                           ("pickle", "generic", "fr_trace_rank_0.pkl"),
                           ("pickle", "worker_choice", f"{prefix}_trace_rank_0")):
        backend = {"generic": None, "worker_choice": info["backend"]}.get(sub, "nccl" if cuda else args.backend)
        fn, extra = c10d.dump_function(fmt, backend)
        key = f"{sub}_function"
        info[key] = getattr(fn, "__name__", None) if fn is not None else None
        info[f"{sub}_extra_arguments"] = sorted(extra)
        try:
            data = c10d.dump_flight_recorder(fmt, backend=backend)
        except Exception as exc:
            info[f"{sub}_error"] = f"{type(exc).__name__}: {exc}"
            continue
        if data is None:
            info[f"{sub}_error"] = "this torch has no dump function"
            continue
        (out / sub).mkdir(parents=True, exist_ok=True)
        (out / sub / name).write_bytes(data)
        info[f"{sub}_bytes"] = len(data)
    (out / "worker.json").write_text(json.dumps(info))
    dist.destroy_process_group()
    return 0


def _fr_mixed(ctx: Context, env: Mapping[str, str]) -> dict[str, Any]:
    """The flight-recorder worker on a ``cpu:gloo,cuda:nccl`` default group (one group, two backends)."""
    d = ctx.tmp / "flight-recorder-mixed"
    done = run_cmd([ctx.py, str(THIS), "--fr-worker", "--dir", str(d), "--backend", "cpu:gloo,cuda:nccl"],
                   ctx.budget(90, keep=10), logs=ctx.logs(), name="worker-mixed", env=env)
    out: dict[str, Any] = done.brief()
    try:
        info = json.loads((d / "worker.json").read_text())
    except (OSError, ValueError):
        out["error"] = f"the worker wrote no result: {tail(done.err)}"
        return out
    out.update({"get_backend": info.get("backend"), "worker_choice_function": info.get("worker_choice_function"),
                "nccl_function": info.get("pickle_function")})
    for sub, key in (("worker_choice", "nccl_entries_in_worker_choice"), ("pickle", "nccl_entries_asking_nccl")):
        files = sorted((d / sub).glob("*")) if (d / sub).is_dir() else []
        if files:
            with contextlib.suppress(Exception):
                ops = read_dump(files[0]).get("ops") or {}
                out[key] = sum(n for op, n in ops.items() if op.startswith("nccl:"))
    return out


def section_nccl_flight_recorder(ctx: Context) -> dict[str, Any]:
    backend = "nccl" if ctx.cuda else "gloo"
    result: dict[str, Any] = {"ok": False, "skipped": False, "backend": backend, "findings": []}
    if ctx.smoke:
        result["nccl"] = "skipped: no GPU in the CPU smoke run; the same steps ran on gloo"
    elif not ctx.cuda:
        return skipped("no CUDA device: NCCL needs a GPU", ok=False)
    d = ctx.tmp / "flight-recorder"
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
           "TORCH_NCCL_ENABLE_TIMING": "1"}
    result["worker_environment"] = {k: env[k] for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE",
                                                        "TORCH_NCCL_ENABLE_TIMING")}
    ctx.say(f"1-rank {backend} group, {FR_OPS + 2} collectives, dumps")
    done = run_cmd([ctx.py, str(THIS), "--fr-worker", "--dir", str(d), "--backend", backend],
                   ctx.budget(120, keep=20), logs=ctx.logs(), name="worker", env=env)
    result["worker"] = done.brief()
    try:
        info = json.loads((d / "worker.json").read_text())
    except (OSError, ValueError):
        why = f"stopped after {done.seconds:.0f}s (the section's time ran out)" if done.timed_out else \
            f"exit {done.rc}: {tail(done.err)}"
        result["error"] = f"the worker wrote no result ({why})"
        return result
    result["worker"].update(info)
    result["dump_functions"] = {"pickle": info.get("pickle_function"), "json": info.get("json_function"),
                                "generic": info.get("generic_function")}
    ctx.save(result)
    dumps: dict[str, Any] = {}
    for sub in ("pickle", "json", "generic", "worker_choice"):
        files = sorted((d / sub).glob("*")) if (d / sub).is_dir() else []
        if not files:
            dumps[sub] = {"error": info.get(f"{sub}_error", "no dump written")}
            continue
        try:
            dumps[sub] = read_dump(files[0])
        except Exception as exc:
            dumps[sub] = {"file": files[0].name, "error": f"{type(exc).__name__}: {exc}"}
        dumps[sub]["diagnose"] = diagnose(ctx, d / sub, f"diagnose-{sub}")
    result["dumps"] = dumps
    expected_fn = "_dump_nccl_trace" if backend == "nccl" else "_dump_fr_trace"
    used = info.get("pickle_function")
    backend_aware = "backend" in (info.get("pickle_extra_arguments") or [])
    result["used_nccl_own_recorder"] = used == "_dump_nccl_trace"
    result["used_backend_aware_generic"] = backend_aware
    issued = int(info.get("ops_issued", FR_OPS + 2))
    checks: dict[str, bool] = {}
    for sub in ("pickle", "json"):
        s = dumps.get(sub, {})
        diag = s.get("diagnose") or {}
        checks[f"{sub}_has_every_collective"] = (s.get("entries") or 0) >= issued
        checks[f"{sub}_diagnosed_healthy"] = diag.get("verdict") == "healthy" and diag.get("exit_code") == 0
        checks[f"{sub}_backend_{backend}"] = diag.get("backend") == backend
        if backend == "nccl":
            checks[f"{sub}_entries_completed"] = (s.get("states") or {}).get("completed", 0) >= issued
    checks["dump_function_as_expected"] = used == expected_fn or backend_aware
    result["checks"] = checks
    result["ok"] = all(checks.values())
    if backend == "nccl":
        result["mixed_backend"] = _fr_mixed(ctx, env)
        mixed = result["mixed_backend"]
        if mixed.get("nccl_entries_in_worker_choice") == 0 and (mixed.get("nccl_entries_asking_nccl") or 0) > 0:
            result["findings"].append(
                f"with a '{mixed.get('get_backend')}' default group trainguard's worker dump "
                f"({mixed.get('worker_choice_function')}, asked with dist.get_backend()) holds no NCCL entry while "
                "NCCL's recorder holds them: src/trainguard/torch_api/c10d.py dump_function compares backend == "
                "'nccl' exactly")
    generic_entries = dumps.get("generic", {}).get("entries")
    if backend == "nccl" and used == "_dump_nccl_trace" and generic_entries:
        result["findings"].append(f"the generic recorder holds {generic_entries} entries too: check whether "
                                  "_dump_fr_trace alone would have been enough on this torch")
    return result


# --- nvml -----------------------------------------------------------------------------------------


def nvml_readings(nvml: Any, source: Any, host: str) -> list[dict[str, Any]]:
    """One reading per GPU: the telemetry sampler's fields (``source.sample``) plus utilization, memory used and
    name read with pynvml directly (the sampler does not take them)."""
    samples = {s.device: s for s in source.sample(time.time(), host)}
    out = []
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception:
        count = len(samples)
    for i in range(count):
        s = samples.get(f"gpu{i}")
        row: dict[str, Any] = {"index": i, "sampled": s is not None}
        for key in SAMPLER_FIELDS:
            row[key] = getattr(s, key, None) if s is not None else None
        row["max_clock_mhz"] = getattr(s, "max_clock_mhz", None) if s is not None else None
        row["throttle_reasons"] = getattr(s, "throttle_reasons", None) if s is not None else None
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
        except Exception:
            out.append(row)
            continue
        util = getattr(nvml, "nvmlDeviceGetUtilizationRates", None)
        mem = getattr(nvml, "nvmlDeviceGetMemoryInfo", None)
        name = getattr(nvml, "nvmlDeviceGetName", None)
        with contextlib.suppress(Exception):
            row["utilization_pct"] = float(util(h).gpu) if util else None
        with contextlib.suppress(Exception):
            row["memory_used_mib"] = float(mem(h).used) / 2**20 if mem else None
        with contextlib.suppress(Exception):
            raw = name(h) if name else None
            row["name"] = raw.decode() if isinstance(raw, bytes) else raw
        out.append(row)
    return out


def nvml_compare(nvml: Any, source: Any, smi: Callable[[], str], rounds: int = 3,
                 pause: float = 0.5) -> dict[str, Any]:
    """``rounds`` times: NVML, nvidia-smi, NVML; compared per GPU and field."""
    per_round: list[dict[str, Any]] = []
    by_gpu: dict[int, list[dict[str, Any]]] = {}
    for r in range(rounds):
        before = nvml_readings(nvml, source, "gpu-check")
        t0 = time.monotonic()
        rows = parse_smi_csv(smi())
        smi_seconds = time.monotonic() - t0
        after = nvml_readings(nvml, source, "gpu-check")
        record: dict[str, Any] = {"round": r, "nvidia_smi_seconds": round(smi_seconds, 3), "gpus": []}
        for row in rows:
            idx = row.get("index")
            b = next((x for x in before if x["index"] == idx), None)
            a = next((x for x in after if x["index"] == idx), None)
            if b is None or a is None:
                continue
            cmp = compare_round(b, row, a)
            by_gpu.setdefault(int(idx or 0), []).append(cmp)
            record["gpus"].append({"index": idx, "name_nvidia_smi": row.get("name"), "name_nvml": b.get("name"),
                                   "throttle_reasons": b.get("throttle_reasons"),
                                   "max_clock_mhz": b.get("max_clock_mhz"), **cmp})
        per_round.append(record)
        if r + 1 < rounds:
            time.sleep(pause)
    summary = {str(i): summarize_rounds(c) for i, c in by_gpu.items()}
    return {"rounds": per_round, "summary": summary}


def sampler_ok(summary: Mapping[str, Any]) -> bool:
    """Every GPU's sampler fields were compared at least once and always within tolerance."""
    if not summary:
        return False
    for gpu in summary.values():
        for key in SAMPLER_FIELDS:
            f = gpu.get(key) or {}
            if not f.get("rounds_compared") or not f.get("all_within_tolerance"):
                return False
    return True


def health_gpu_direct(nvml: Any) -> list[dict[str, Any]]:
    """The NVML checks that do not need the classifier, run one by one (used when `check_gpus` as a whole
    failed, e.g. because its XID check could not load the classification rules)."""
    from trainguard.health import gpu as g

    nvml.nvmlInit()
    try:
        handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
        results = [*g._ecc_and_remap(nvml, handles), g._nvlink(nvml, handles), g._thermal(nvml, handles, 87),
                   g._pcie(nvml, handles)]
    finally:
        nvml.nvmlShutdown()
    return [{"name": r.name, "ok": r.ok, "skipped": r.skipped, "severity": r.severity, "detail": r.detail}
            for r in results]


def _health(ctx: Context, *, without: str | None = None) -> dict[str, Any]:
    """``trainguard health --json``; ``without``: a PYTHONPATH entry left out (the re2 stand-in)."""
    env = dict(os.environ)
    if without:
        env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p != without)
    done = run_cmd(trainguard_cmd(ctx, "health", "--json"), ctx.budget(90, keep=25), logs=ctx.logs(),
                   name="health-without-stand-in" if without else "health", env=env)
    try:
        checks = json.loads(done.out)
    except ValueError:
        return {**done.brief(), "error": tail(done.err) or "no JSON from health"}
    rows = [{k: c.get(k) for k in ("name", "ok", "skipped", "severity", "detail")} for c in checks
            if isinstance(c, dict)]
    gpu_rows = [r for r in rows if str(r["name"]).startswith("gpu")]
    return {**done.brief(), "gpu_checks": gpu_rows,
            "torch_devices": next((r for r in rows if r["name"] == "torch_devices"), None),
            "failed": [r["name"] for r in rows if not r["ok"]]}


def section_nvml(ctx: Context) -> dict[str, Any]:
    result: dict[str, Any] = {"ok": False, "skipped": False, "findings": []}
    ctx.say("trainguard health --json")
    health = _health(ctx)
    result["health"] = health
    ctx.save(result)
    gpu_rows = health.get("gpu_checks") or []
    collapsed = len(gpu_rows) == 1 and gpu_rows[0]["name"] == "gpus" and not gpu_rows[0]["ok"]
    if collapsed:
        result["findings"].append(f"trainguard health reported no NVML check at all, only "
                                  f"'gpus: {gpu_rows[0]['detail']}' (one exception in check_gpus drops every "
                                  "GPU check)")
    stand_in = ctx.environment.get("re2_stand_in_dir")
    if stand_in:  # what a user of this machine gets: the same checks without the stand-in re2
        bare = _health(ctx, without=str(stand_in))
        rows = bare.get("gpu_checks") or []
        result["health_without_re2_stand_in"] = {k: bare.get(k) for k in ("exit_code", "gpu_checks", "error")}
        if len(rows) == 1 and rows[0]["name"] == "gpus" and not rows[0]["ok"]:
            result["findings"].append(f"without google-re2 `trainguard health` reports no NVML check, only 'gpus: "
                                      f"{rows[0]['detail']}' (src/trainguard/health/gpu.py: _xids imports "
                                      "trainguard.classify, and one exception in check_gpus drops every GPU check)")
    smi_path = shutil.which("nvidia-smi")
    if ctx.smoke or smi_path is None:
        why = "no GPU: CPU smoke run" if ctx.smoke else "no GPU: nvidia-smi not found"
        from trainguard.health.fake import FakeGpu, FakeNvml
        from trainguard.telemetry.samplers import GpuSource

        fake = FakeNvml([FakeGpu()])
        gpu = fake.gpus[0]
        line = f"0, Fake GPU, {gpu.temperature_c}, {(gpu.power_mw or 0) / 1000:.2f}, {gpu.sm_clock_mhz}, [N/A], [N/A]"
        logic = nvml_compare(fake, GpuSource(fake), lambda: line, rounds=2, pause=0.0)
        logic["health_direct"] = health_gpu_direct(fake)
        return skipped(why, ok=ctx.smoke and "error" not in health, health=health, logic_check_fake_nvml=logic,
                       logic_check_ok=sampler_ok(logic["summary"]), findings=result["findings"])
    try:
        import pynvml

        from trainguard.telemetry.samplers import GpuSource
    except Exception as exc:
        result["error"] = f"pynvml or trainguard.telemetry.samplers unavailable: {type(exc).__name__}: {exc}"
        return result
    source = GpuSource.load()
    if source is None:
        result["error"] = "trainguard.telemetry.samplers.GpuSource.load() found no NVML"
        return result
    query = "--query-gpu=" + ",".join(SMI_FIELDS)

    def smi() -> str:
        done = run_cmd([smi_path, query, "--format=csv,noheader,nounits"], ctx.budget(20, keep=5), logs=ctx.logs(),
                       name="nvidia-smi")
        if done.rc != 0:
            raise RuntimeError(f"nvidia-smi exit {done.rc}: {tail(done.err or done.out)}")
        return done.out

    ctx.say("telemetry sampler vs nvidia-smi")
    try:
        pynvml.nvmlInit()
        try:
            cmp = nvml_compare(pynvml, source, smi)
        finally:
            pynvml.nvmlShutdown()
            source.close()
    except Exception as exc:
        result["error"] = f"comparison failed: {type(exc).__name__}: {exc}"
        result["traceback"] = tail(traceback.format_exc(), 8)
        return result
    result["comparison"] = cmp
    if collapsed:
        try:
            result["health_direct"] = health_gpu_direct(pynvml)
        except Exception as exc:
            result["health_direct"] = [{"error": f"{type(exc).__name__}: {exc}"}]
    checks = {
        "health_ran": "error" not in health and health.get("exit_code") in (0, 1),
        "health_nvml_checks_ran": bool(gpu_rows) and not collapsed and not all(r["skipped"] for r in gpu_rows),
        "sampler_matches_nvidia_smi": sampler_ok(cmp["summary"]),
    }
    result["checks"] = checks
    result["ok"] = all(checks.values())
    return result


# --- checkpoint_gpu -------------------------------------------------------------------------------


ASYNC_SAVES = (1, 2, 3)
"""Async saves measured per method: the first allocates staging buffers, the best of the others counts."""


def _ratio(num: float | None, den: float | None) -> float | None:
    return round(num / den, 4) if num is not None and den else None


def section_checkpoint_gpu(ctx: Context) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.nn as nn

    from trainguard import CheckpointConfig, Checkpointer

    gb = float(ctx.params.get("ckpt_gb", 0.064 if ctx.smoke else 2.0))
    dim = 1024 if ctx.smoke else 8192
    layers = max(1, math.ceil(gb * 1e9 / (dim * dim * 4)))
    nbytes_planned = layers * dim * dim * 4
    base = ctx.tmp / "checkpoints"
    base.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(base).free
    result: dict[str, Any] = {"ok": False, "skipped": False, "directory": str(base), "filesystem": fs_type(base),
                              "free_gb_before": round(free / 1e9, 1), "findings": []}
    if not ctx.smoke and not ctx.cuda:
        return skipped("no CUDA device: the model must live in GPU memory", ok=False)
    need = 5 * nbytes_planned + 1e9
    if free < need:
        return skipped(f"not enough disk in {base}: {free / 1e9:.1f} GB free, need {need / 1e9:.1f}", ok=False)
    if result["filesystem"] in ("tmpfs", "ramfs"):
        result["findings"].append(f"{base} is on {result['filesystem']}: disk figures are memory figures")
    device = torch.device("cuda", 0) if ctx.cuda else torch.device("cpu")
    if ctx.cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if ctx.cuda else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    async_pg = dist.new_group(backend="gloo")  # plain async_save's background collectives, as DCP advises
    torch.manual_seed(0)
    with torch.no_grad():
        model = nn.Sequential(*[nn.Linear(dim, dim, bias=False, device=device) for _ in range(layers)])
    state = {"model": model.state_dict()}
    nbytes = sum(t.numel() * t.element_size() for t in state["model"].values())
    reference = [t.detach().clone() for t in state["model"].values()]
    result.update({"state_bytes": nbytes, "state_gb": round(nbytes / 1e9, 3), "tensors": layers,
                   "tensor_shape": [dim, dim], "dtype": "float32", "device": str(device),
                   "process_group": f"{backend} (1 rank); plain async_save on its own gloo group"})
    ctx.say(f"{nbytes / 1e9:.2f} GB in {layers} tensors on {device}")

    def settle(evict: Path | None = None) -> None:
        if ctx.cuda:
            torch.cuda.synchronize()
        os.sync()
        if evict is not None:
            evict_tree(evict)

    def timed(fn: Callable[[], Any], evict: Path | None = None) -> float:
        settle(evict)
        t0 = time.perf_counter()
        fn()
        if ctx.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def scramble() -> None:
        with torch.no_grad():
            for t in state["model"].values():
                t.zero_()

    def verified() -> bool:
        return all(torch.equal(a, b) for a, b in zip(state["model"].values(), reference, strict=True))

    tg: dict[str, Any] = {"async_stall_seconds": [], "async_total_seconds": []}
    plain: dict[str, Any] = {"async_stall_seconds": [], "async_total_seconds": []}
    result["trainguard"], result["dcp"] = tg, plain
    sync = Checkpointer(base / "tg-sync", CheckpointConfig(async_save=False, keep_last=1))
    tg["sync_save_seconds"] = timed(lambda: sync.save(1, state))
    ctx.save(result)
    plain["save_seconds"] = timed(lambda: dcp.save(state, checkpoint_id=base / "dcp-sync"))
    ctx.save(result)
    ckpt = Checkpointer(base / "tg-async", CheckpointConfig(async_save=True, keep_last=1))
    for i in ASYNC_SAVES:  # the first save allocates the staging buffers; the later ones are the steady state
        settle()
        t0 = time.perf_counter()
        ckpt.save(i, state)
        tg["async_stall_seconds"].append(time.perf_counter() - t0)
        ckpt.wait()
        tg["async_total_seconds"].append(time.perf_counter() - t0)
        ctx.save(result)
    ckpt.close()
    for i in ASYNC_SAVES:
        settle()
        target = base / f"dcp-async-{i}"
        t0 = time.perf_counter()
        fut = dcp.async_save(state, checkpoint_id=target, process_group=async_pg)
        plain["async_stall_seconds"].append(time.perf_counter() - t0)
        fut.result()
        plain["async_total_seconds"].append(time.perf_counter() - t0)
        shutil.rmtree(target, ignore_errors=True)
        ctx.save(result)
    shutil.rmtree(base / "tg-async", ignore_errors=True)
    ctx.say("restores (files evicted from the page cache first)")
    scramble()
    restored: list[Any] = []
    tg["restore_seconds"] = timed(lambda: restored.append(sync.restore(state)), evict=base / "tg-sync")
    tg["restore_step"] = restored[0]
    tg["restore_verified"] = verified()
    sync.close()
    ctx.save(result)
    scramble()
    plain["load_seconds"] = timed(lambda: dcp.load(state, checkpoint_id=base / "dcp-sync"), evict=base / "dcp-sync")
    plain["load_verified"] = verified()
    dist.destroy_process_group()
    def gbs(seconds: float) -> float | None:
        return round(nbytes / 1e9 / seconds, 3) if seconds else None

    tg_stall, dcp_stall = min(tg["async_stall_seconds"][1:]), min(plain["async_stall_seconds"][1:])
    tg_total, dcp_total = min(tg["async_total_seconds"][1:]), min(plain["async_total_seconds"][1:])
    result["steady_state"] = {"trainguard_async_stall_seconds": round(tg_stall, 4),
                              "dcp_async_stall_seconds": round(dcp_stall, 4),
                              "trainguard_async_total_seconds": round(tg_total, 4),
                              "dcp_async_total_seconds": round(dcp_total, 4),
                              "rule": "best of the async saves after the first (which allocates buffers)"}
    result["gb_per_second"] = {
        "trainguard_sync_save": gbs(tg["sync_save_seconds"]), "dcp_save": gbs(plain["save_seconds"]),
        "trainguard_async_total": gbs(tg_total), "dcp_async_total": gbs(dcp_total),
        "trainguard_restore": gbs(tg["restore_seconds"]), "dcp_load": gbs(plain["load_seconds"]),
    }
    ratios = {
        "async_stall_time": _ratio(tg_stall, dcp_stall),
        "sync_save_throughput": _ratio(plain["save_seconds"], tg["sync_save_seconds"]),
        "async_total_throughput": _ratio(dcp_total, tg_total),
        "restore_throughput": _ratio(plain["load_seconds"], tg["restore_seconds"]),
        "async_stall_over_sync_save_time": _ratio(tg_stall, tg["sync_save_seconds"]),
    }
    result["ratios_trainguard_over_dcp"] = ratios
    result["goals"] = {
        "async_stall_at_most_dcp_async_stall": (ratios["async_stall_time"] or 2.0) <= 1.0,
        "save_at_least_95pct_of_dcp_save": (ratios["sync_save_throughput"] or 0) >= 0.95,
        "async_save_at_least_95pct_of_dcp_async_save": (ratios["async_total_throughput"] or 0) >= 0.95,
        "async_stall_at_most_5pct_of_sync_save": (ratios["async_stall_over_sync_save_time"] or 1) <= 0.05,
    }
    for k in ("sync_save_seconds", "restore_seconds"):
        tg[k] = round(tg[k], 4)
    for k in ("save_seconds", "load_seconds"):
        plain[k] = round(plain[k], 4)
    for d in (tg, plain):
        for k in ("async_stall_seconds", "async_total_seconds"):
            d[k] = [round(x, 4) for x in d[k]]
    checks = {"trainguard_restore_verified": bool(tg["restore_verified"]) and tg["restore_step"] == 1,
              "dcp_load_verified": bool(plain["load_verified"])}
    result["checks"] = checks
    result["ok"] = all(checks.values())
    shutil.rmtree(base, ignore_errors=True)
    return result


# --- overhead ------------------------------------------------------------------------------------


def _gpt_model(vocab: int, d: int, layers: int, heads: int, seq: int) -> Any:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, c // heads).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
            x = x + self.proj(y)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok.weight  # tied, as GPT-2

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    return GPT()


def overhead_worker(argv: Sequence[str]) -> int:
    """``--overhead-worker``: an ordinary DDP training script (never imports trainguard) timing its own steps."""
    ap = argparse.ArgumentParser(prog="gpu_check.py --overhead-worker")
    ap.add_argument("--overhead-worker", action="store_true")
    ap.add_argument("--steps", type=int, default=105)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--timing-out", required=True)
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = _gpt_model(args.vocab, args.d_model, args.layers, args.heads, args.seq).to(device=device, dtype=dtype)
    params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, device_ids=[local] if cuda else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    gen = torch.Generator(device=device).manual_seed(1)
    times: list[float] = []
    loss = torch.zeros(())
    for _ in range(args.steps):
        t0 = time.perf_counter()
        batch = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device, generator=gen)
        logits = ddp(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab).float(), batch[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        Path(args.timing_out).write_text(json.dumps({
            "step_seconds": times, "parameters": params, "device": str(device), "dtype": args.dtype,
            "backend": dist.get_backend(), "final_loss": float(loss), "tokens_per_step": args.batch * args.seq,
            "threads": torch.get_num_threads(),
            "environment": {k: v for k, v in sorted(os.environ.items())
                            if k.startswith(("OMP_", "MKL_", "TORCH_", "NCCL_", "CUDA_", "PYTORCH_"))},
        }))
    dist.destroy_process_group()
    return 0


def _overhead_params(ctx: Context) -> dict[str, Any]:
    if ctx.smoke:
        p: dict[str, Any] = {"vocab": 256, "d_model": 64, "layers": 2, "heads": 4, "seq": 32, "batch": 4,
                             "dtype": "fp32", "steps": 25, "warmup": 5, "pairs": 1}
    else:
        p = {"vocab": 32768, "d_model": 1024, "layers": 24, "heads": 16, "seq": 1024, "batch": 16, "dtype": "bf16",
             "steps": 105, "warmup": 15, "pairs": 3}
    p.update(ctx.params.get("overhead", {}))
    return p


def section_overhead(ctx: Context) -> dict[str, Any]:
    p = _overhead_params(ctx)
    if not ctx.smoke and not ctx.cuda:
        return skipped("no CUDA device: the workload is a GPU training step", ok=False)
    result: dict[str, Any] = {"ok": False, "skipped": False, "parameters": p, "pairs": [], "findings": [],
                              "timing": "the script's own perf_counter around each step, ending with "
                                        "torch.cuda.synchronize(); median over the steps after warm-up"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env["OMP_NUM_THREADS"] = "1"  # trainguard sets it for workers; bare torchrun does not with 1 rank
    worker = [str(THIS), "--overhead-worker", "--steps", str(p["steps"]), "--vocab", str(p["vocab"]),
              "--d-model", str(p["d_model"]), "--layers", str(p["layers"]), "--heads", str(p["heads"]),
              "--seq", str(p["seq"]), "--batch", str(p["batch"]), "--dtype", str(p["dtype"])]
    auto_steps: list[int] = []
    pair_seconds: list[float] = []
    worker_env: dict[str, dict[str, str]] = {}

    def one(which: str, tag: str) -> dict[str, Any]:
        timing = ctx.tmp / f"timing-{tag}.json"
        args = [*worker, "--timing-out", str(timing)]
        if which == "trainguard":
            run_dir = ctx.tmp / f"overhead-run-{tag}"
            cmd = trainguard_cmd(ctx, "run", "--standalone", "--nproc-per-node", "1", "--run-dir", str(run_dir),
                                 "--no-health-checks", "--quiet", *args)
        else:
            cmd = [ctx.py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", *args]
        done = run_cmd(cmd, ctx.budget(240, keep=5), logs=ctx.logs(), name=f"{which}-{tag}", env=env)
        out: dict[str, Any] = {"launcher": which, **done.brief()}
        try:
            data = json.loads(timing.read_text())
        except (OSError, ValueError):
            out["error"] = f"no step times (exit {done.rc}): {tail(done.err)}"
            return out
        steps = data["step_seconds"][int(p["warmup"]):]
        out.update({"median_step_seconds": round(statistics.median(steps), 6),
                    "mean_step_seconds": round(statistics.fmean(steps), 6), "steps_timed": len(steps),
                    "max_step_seconds": round(max(steps), 6), "parameters": data.get("parameters"),
                    "backend": data.get("backend"), "tokens_per_step": data.get("tokens_per_step"),
                    "threads": data.get("threads")})
        worker_env[which] = data.get("environment") or {}
        if which == "trainguard":
            events = sorted((ctx.tmp / f"overhead-run-{tag}" / "events").glob("rank-*.jsonl"))
            n = sum(len(records(e, "step_completed")) for e in events)
            out["step_events_recorded"] = n
            auto_steps.append(n)
            shutil.rmtree(ctx.tmp / f"overhead-run-{tag}" / "checkpoints", ignore_errors=True)
        return out

    for i in range(int(p["pairs"])):
        if pair_seconds and ctx.remaining() < max(pair_seconds) * 1.2 + 10:
            result["stopped_early"] = f"after {i} pairs: the next would pass the deadline"
            break
        t0 = time.monotonic()
        order = pair_order(i)
        ctx.say(f"pair {i + 1}/{p['pairs']}: {order[0]} then {order[1]}")
        runs = {which: one(which, f"{i}-{which}") for which in order}
        pair: dict[str, Any] = {"index": i, "order": list(order), "runs": runs}
        tgr, bare = runs["trainguard"], runs["torchrun"]
        if "median_step_seconds" in tgr and "median_step_seconds" in bare:
            pair["ratio_median"] = round(tgr["median_step_seconds"] / bare["median_step_seconds"], 5)
            pair["ratio_mean"] = round(tgr["mean_step_seconds"] / bare["mean_step_seconds"], 5)
        result["pairs"].append(pair)
        pair_seconds.append(time.monotonic() - t0)
        result.update(overhead_summary(result["pairs"]))
        ctx.save(result)
        if "ratio_median" not in pair:
            result["error"] = "; ".join(f"{w}: {r.get('error')}" for w, r in runs.items() if r.get("error"))
            break
    result.update(overhead_summary(result["pairs"]))
    bare_medians = [p_["runs"]["torchrun"].get("median_step_seconds") for p_ in result["pairs"]]
    bare_medians = [m for m in bare_medians if m is not None]
    if bare_medians:
        med = statistics.median(bare_medians)
        result["step_seconds_torchrun"] = round(med, 6)
        result["step_in_50_to_200_ms"] = 0.05 <= med <= 0.2
    params_n = next((r.get("parameters") for pr in result["pairs"] for r in pr["runs"].values()
                     if r.get("parameters")), None)
    result["model_parameters"] = params_n
    tg_env, bare_env = worker_env.get("trainguard", {}), worker_env.get("torchrun", {})
    result["worker_environment_differences"] = {  # torch/NCCL/CUDA/thread settings one launcher set and not the other
        k: {"trainguard": tg_env.get(k), "torchrun": bare_env.get(k)}
        for k in sorted(set(tg_env) | set(bare_env)) if tg_env.get(k) != bare_env.get(k)}
    result["pair_seconds"] = [round(s, 1) for s in pair_seconds]
    checks = {
        "at_least_one_pair": any("ratio_median" in pr for pr in result["pairs"]),
        "automatic_steps_recorded": bool(auto_steps) and min(auto_steps) >= int(p["steps"]),
    }
    result["checks"] = checks
    result["ok"] = all(checks.values()) and "error" not in result
    if auto_steps and min(auto_steps) < int(p["steps"]):
        result["findings"].append(f"trainguard run recorded {min(auto_steps)} step events for {p['steps']} optimizer "
                                  "steps: the automatic instrumentation missed steps")
    if result.get("goal_met") is False and not ctx.smoke:
        result["findings"].append(f"overhead {result['overhead_fraction']:.2%} is above the {OVERHEAD_GOAL:.0%} goal")
    return result


SECTION_FUNCTIONS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "environment": section_environment,
    "demo_nccl": section_demo_nccl,
    "nccl_flight_recorder": section_nccl_flight_recorder,
    "nvml": section_nvml,
    "checkpoint_gpu": section_checkpoint_gpu,
    "overhead": section_overhead,
}


def run_section_here(context_file: Path) -> int:
    """``--section``: one section in this process; its result goes to the context's ``out`` file."""
    raw = json.loads(context_file.read_text())
    ctx = Context(name=raw["name"], mode=raw["mode"], tmp=Path(raw["tmp"]), deadline_at=float(raw["deadline_at"]),
                  out=Path(raw["out"]), params=raw.get("params", {}), environment=raw.get("environment", {}))
    t0 = time.monotonic()
    try:
        result = SECTION_FUNCTIONS[ctx.name](ctx)
    except BaseException as exc:  # a section reports every failure, KeyboardInterrupt too
        partial: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            partial = json.loads(ctx.out.read_text())
        result = {**partial, "ok": False, "skipped": False, "error": f"{type(exc).__name__}: {exc}"[:1000],
                  "traceback": tail(traceback.format_exc(), 12)}
    result.setdefault("seconds", round(time.monotonic() - t0, 2))
    ctx.save(result)
    return 0


# --- orchestrator ---------------------------------------------------------------------------------


@dataclass
class Orchestrator:
    args: argparse.Namespace
    mode: str
    tmp: Path
    deadline: Deadline
    env: dict[str, str]
    environment: dict[str, Any] = field(default_factory=dict)
    running: list[Proc] = field(default_factory=list)

    def start(self, name: str, timeout: float) -> tuple[Proc, Path, float]:
        out = self.tmp / f"section-{name}.json"
        ctx_file = self.tmp / f"context-{name}.json"
        ctx_file.write_text(json.dumps({
            "name": name, "mode": self.mode, "tmp": str(self.tmp / name), "deadline_at": time.time() + timeout,
            "out": str(out), "params": self.params(), "environment": self.environment,
        }))
        (self.tmp / name).mkdir(parents=True, exist_ok=True)
        progress(f"[{name}] started (timeout {timeout:.0f}s, {self.deadline.remaining():.0f}s left overall)")
        proc = Proc([sys.executable, str(THIS), "--section", str(ctx_file)], logs=self.tmp / "logs", name=name,
                    env=self.env, cwd=ROOT, stdout=sys.stderr.fileno(), stderr=sys.stderr.fileno())
        self.running.append(proc)
        return proc, out, timeout

    def finish(self, name: str, proc: Proc, out: Path, timeout: float) -> dict[str, Any]:
        # The section enforces its own budget; the orchestrator's kill is the backstop (a bit later).
        done = proc.wait(max(1.0, timeout + BACKSTOP_SECONDS - (time.monotonic() - proc.t0)))
        self.running.remove(proc)
        result: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            result = json.loads(out.read_text())
        if done.timed_out:
            result = {**result, "ok": False, "skipped": False,
                      "error": f"timed out after {done.seconds:.0f}s (section timeout {timeout:.0f}s); figures so "
                               "far are kept"}
        elif not result:
            result = failed(f"section process exited {done.rc} without a result")
        if done.timed_out or "seconds" not in result:
            result["seconds"] = round(done.seconds, 2)
        label = "skipped" if result.get("skipped") else "ok" if result.get("ok") else "FAILED"
        why = f": {str(result.get('error') or result.get('reason'))[:200]}" if label != "ok" else ""
        progress(f"[{name}] {label} in {result['seconds']:.1f}s{why}")
        return result

    def run_one(self, name: str, timeout: float) -> dict[str, Any]:
        if timeout <= 1.0:
            return skipped("global deadline reached before this section could start", ok=False)
        proc, out, timeout = self.start(name, timeout)
        return self.finish(name, proc, out, timeout)

    def params(self) -> dict[str, Any]:
        p: dict[str, Any] = {}
        if self.args.ckpt_gb is not None:
            p["ckpt_gb"] = self.args.ckpt_gb
        over: dict[str, Any] = {}
        if self.args.overhead_pairs is not None:
            over["pairs"] = self.args.overhead_pairs
        if self.args.overhead_steps is not None:
            over["steps"] = self.args.overhead_steps
        if over:
            p["overhead"] = over
        return p

    def stop_all(self) -> None:
        for proc in list(self.running):
            proc.stop()


def make_shims(base: Path, hide: Sequence[str]) -> Path | None:
    """A folder of modules that raise ImportError, put first on PYTHONPATH (the smoke run's stand-in for the
    GPU machine's missing packages)."""
    if not hide:
        return None
    d = base / "hidden-modules"
    d.mkdir(parents=True, exist_ok=True)
    for name in hide:
        (d / f"{name}.py").write_text(HIDE_TEMPLATE.format(
            message=f"No module named {name!r} (hidden by gpu_check --hide-modules, as on the GPU machine)"))
    return d


def child_env(paths: Sequence[Path]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    parts = [str(p) for p in paths] + [str(SRC)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    seen: list[str] = []
    for part in parts:
        if part not in seen:
            seen.append(part)
    env["PYTHONPATH"] = os.pathsep.join(seen)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def environment_findings(env: Mapping[str, Any], stub_used: bool) -> list[str]:
    out = []
    modules = env.get("modules") or {}
    if str(modules.get("re2", "")).startswith("missing"):
        out.append("google-re2 is not importable here; `trainguard run` and `trainguard demo` need it at start "
                   "(src/trainguard/launch/agent.py imports trainguard.classify, which imports re2 without a "
                   "fallback)" + ("; this check put a stand-in re2 on PYTHONPATH that raises on use, so runs "
                                  "start and classification degrades to Unknown" if stub_used else ""))
    if str(modules.get("packaging", "")).startswith("missing"):
        out.append("packaging is not importable: trainguard then reports any torch as outside the supported "
                   "range (src/trainguard/torch_api/features.py _in_range)")
    return out


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", help="also write the JSON object to this file")
    ap.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE, help="global deadline in seconds (450)")
    ap.add_argument("--cpu-smoke", action="store_true", help="run every section's logic on CPU, tiny sizes")
    ap.add_argument("--only", default="", help="comma-separated sections to run (default: all)")
    ap.add_argument("--skip", default="", help="comma-separated sections to leave out")
    ap.add_argument("--tmp-dir", default=None, help="where scratch files go (default: the system temp dir)")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the scratch directory (logs, run dirs)")
    ap.add_argument("--hide-modules", default=None,
                    help=f"modules to make unimportable (default with --cpu-smoke: {','.join(DEFAULT_HIDDEN)})")
    ap.add_argument("--no-re2-stub", action="store_true",
                    help="do not put a stand-in re2 on PYTHONPATH when google-re2 is missing")
    ap.add_argument("--ckpt-gb", type=float, default=None, help="checkpoint_gpu state size in GB (2.0; smoke 0.064)")
    ap.add_argument("--overhead-pairs", type=int, default=None, help="overhead pairs (3; smoke 1)")
    ap.add_argument("--overhead-steps", type=int, default=None, help="steps per overhead run (105; smoke 25)")
    ap.add_argument("--section", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = [s for s in args.only.split(",") if s] or list(SECTIONS)
    bad = [s for s in [*names, *(x for x in args.skip.split(",") if x)] if s not in SECTIONS]
    if bad:
        ap.error(f"unknown section(s) {bad}; known: {', '.join(SECTIONS)}")
    if not 30 <= args.deadline <= 3600:
        ap.error("--deadline must be between 30 and 3600 seconds")
    args.sections = [s for s in SECTIONS if s in names and s not in args.skip.split(",")]
    return args


def pick_tmp(requested: str | None) -> Path:
    base = Path(requested) if requested else Path(tempfile.gettempdir())
    if requested is None and fs_type(base) in ("tmpfs", "ramfs"):
        base = ROOT / ".gpu-check-tmp"  # checkpoints must go to a disk, not memory
    base.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="tg-gpu-check-", dir=base))


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    deadline = Deadline(args.deadline)
    mode = "cpu-smoke" if args.cpu_smoke else "gpu"
    tmp = pick_tmp(args.tmp_dir)
    hide = [m for m in (args.hide_modules if args.hide_modules is not None
                        else ",".join(DEFAULT_HIDDEN) if args.cpu_smoke else "").split(",") if m]
    shim = make_shims(tmp, hide)
    orch = Orchestrator(args, mode, tmp, deadline, child_env([shim] if shim else []))
    sections: dict[str, Any] = {}
    findings: list[str] = []
    env: dict[str, Any] = {}
    progress(f"{mode} run, deadline {args.deadline:.0f}s, scratch {tmp}")
    try:
        env = orch.run_one("environment", deadline.timeout_for(SECTION_CAPS["environment"]))
        env.pop("findings", None)
        stub_used = False
        classify_broken = str(env.get("classify_import", "ok")) != "ok"
        if classify_broken and str((env.get("modules") or {}).get("re2", "")).startswith("missing") \
                and not args.no_re2_stub:
            stub = tmp / "re2-stand-in"
            stub.mkdir(exist_ok=True)
            (stub / "re2.py").write_text(RE2_STUB)
            orch.env = child_env([stub, *([shim] if shim else [])])
            stub_used = True
            env["re2_stand_in_dir"] = str(stub)
        env["re2_stand_in_used"] = stub_used
        env["hidden_modules"] = hide
        orch.environment = env
        findings += environment_findings(env, stub_used)
        if not args.cpu_smoke and not env.get("cuda_available"):
            findings.append("no CUDA device visible: the GPU sections are reported skipped (use --cpu-smoke "
                            "to exercise the logic on CPU)")
        parallel = [s for s in PARALLEL if s in args.sections]
        if parallel:
            timeout = deadline.timeout_for(max(SECTION_CAPS[s] for s in parallel), RESERVE_AFTER["parallel"]
                                           if {"checkpoint_gpu", "overhead"} & set(args.sections) else 0.0)
            started_procs = {s: orch.start(s, min(timeout, SECTION_CAPS[s])) for s in parallel} if timeout > 1 else {}
            for s in parallel:
                sections[s] = orch.finish(s, *started_procs[s]) if s in started_procs else \
                    skipped("global deadline reached before this section could start", ok=False)
        if "checkpoint_gpu" in args.sections:
            reserve = RESERVE_AFTER["checkpoint_gpu"] if "overhead" in args.sections else 0.0
            sections["checkpoint_gpu"] = orch.run_one("checkpoint_gpu",
                                                      deadline.timeout_for(SECTION_CAPS["checkpoint_gpu"], reserve))
        if "overhead" in args.sections:
            sections["overhead"] = orch.run_one("overhead", deadline.timeout_for(SECTION_CAPS["overhead"]))
    except KeyboardInterrupt:
        findings.append("interrupted: the sections not finished are reported as failed")
        orch.stop_all()
        env = orch.environment or {"ok": False, "error": "interrupted"}
    finally:
        orch.stop_all()
    for s in args.sections:  # after an interruption: what the sections had written
        if s in sections:
            continue
        partial: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            partial = json.loads((tmp / f"section-{s}.json").read_text())
        if partial and "seconds" in partial:  # it had finished
            sections[s] = partial
        else:
            sections[s] = {**partial, **failed("not run to its end (interrupted)")}
    result = assemble(mode, env, sections, started=started, wall_seconds=deadline.elapsed(),
                      deadline_seconds=args.deadline, findings=findings,
                      arguments={k: v for k, v in vars(args).items() if k != "section"})
    result["scratch_dir"] = str(tmp) if args.keep_tmp else None
    if not args.keep_tmp:
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            (ROOT / ".gpu-check-tmp").rmdir()
    return result


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--overhead-worker"]:
        return overhead_worker(argv)
    if argv[:1] == ["--fr-worker"]:
        return fr_worker(argv)
    args = parse_args(argv)
    if args.section:
        return run_section_here(Path(args.section))
    signal.signal(signal.SIGTERM, _interrupt)
    result = orchestrate(args)
    text = json.dumps(result, indent=2, default=str)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text, flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
