"""The data behind a run's charts and tables, shared by the dashboard and the HTML report.

`build_view` turns a run directory into one JSON-ready dict: the `trainguard report --json` document
unchanged, plus the progress timeline with its markers, interruption evidence, the straggler and
telemetry series when the run has such records, and the thermal and power sections. Pure: no web
framework, no plotting library.
"""

from __future__ import annotations

import bisect
import errno
import math
import os
import stat
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from trainguard.accounting.goodput import BUCKETS, GoodputReport, compute_goodput, judge_records
from trainguard.core.eventlog import SkippedRecords
from trainguard.core.events import (
    AttemptStarted,
    CheckpointLoaded,
    CheckpointSaveFinished,
    Diagnosis,
    Event,
    FailureDetected,
    PlannedInterruption,
    RunStarted,
    StepCompleted,
    StepSpan,
    final_run_end,
)
from trainguard.core.rundir import RunDir
from trainguard.report.thermal_power import sections

VIEW_VERSION = 1
"""Bumped when the layout of the view document changes (the dashboard's JavaScript reads it)."""

BUCKET_LABELS: dict[str, str] = {
    "startup": "start-up",
    "checkpoint_save": "checkpoint save stalls",
    "checkpoint_restore": "checkpoint restore",
    "lost_progress": "lost progress",
    "detection": "detection delay",
    "restart": "restart gap",
    "straggler": "straggler slowdown",
    "other": "other",
}
"""Short names of the badput buckets for chart axes (unknown future buckets show their key)."""

MAX_PROGRESS_POINTS = 6000
"""Points of the progress line; longer histories are thinned evenly (first and last of each attempt kept)."""
MAX_MARKERS = 6000
"""Markers of one kind (checkpoints of a 54-day run are ~4,000); beyond it they are thinned evenly."""
MAX_HEATMAP_RANKS = 256
"""Ranks shown in the straggler heat map: the ones with the highest peak slowdown."""
HEATMAP_BINS = 60
MAX_TELEMETRY_SERIES = 64
MAX_TELEMETRY_POINTS = 1500
"""Points per telemetry series; thinned evenly beyond it."""
EVIDENCE_DIRS = ("diagnostics", "logs")
"""Top-level folders of a run whose files the dashboard serves as evidence (never checkpoints or events)."""


def _thin(n: int, limit: int) -> list[int]:
    """Indices of at most ``limit`` of ``n`` items, evenly spread, first and last always kept."""
    if n <= limit:
        return list(range(n))
    step = (n - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)})


def _r(x: float) -> float:
    """Seconds rounded to milliseconds: enough for any chart, and a third of the JSON."""
    return round(x, 3)


def open_evidence(root: str | os.PathLike[str], rel: str) -> int:
    """A read-only descriptor of the evidence file or folder ``rel`` of the run directory ``root``; the caller
    closes it. `OSError` (`FileNotFoundError` for a path that is not evidence) when it may not be read.

    ``rel`` must start with one of `EVIDENCE_DIRS`. Every component below the run directory is opened relative
    to the one before it with ``O_NOFOLLOW``, so a symlink at any depth is refused (the folder itself, a
    folder inside it, the file), also one pointing inside the run: trainguard writes none there, a link is
    only ever someone else's idea, and refusing them all leaves no link to judge. Opening by descriptor also
    means nothing can be swapped for a link between the check and the read. The run directory itself may be
    reached through links (``runs/x -> /scratch/x``): that is the operator's choice, made on the command line.
    Only regular files and folders are answered (a FIFO or device is refused without blocking on it).
    """
    parts = PurePosixPath(rel).parts
    if not parts or parts[0] not in EVIDENCE_DIRS or any(p in ("..", "/") or "\0" in p for p in parts):
        raise FileNotFoundError(errno.ENOENT, "not an evidence path", rel)
    fd = os.open(os.fspath(root), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts):
            # O_NONBLOCK: opening a FIFO planted under an evidence name must not hang the reader.
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
            below = os.open(name, flags if i == len(parts) - 1 else flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise FileNotFoundError(errno.ENOENT, "not a regular file or folder", rel)
        return fd
    except BaseException:
        os.close(fd)
        raise


def evidence_link(root: Path, item: str) -> dict[str, Any]:
    """One evidence entry: a path under the run's evidence folders that exists (``file``/``dir``), else ``text``.

    Evidence comes from event files, which anyone who can write the run directory controls: a path is
    only offered as a link when the dashboard would serve it (`open_evidence`).
    """
    rel = item.strip()
    if rel and not os.path.isabs(rel):
        try:
            fd = open_evidence(root, rel)
        except (OSError, ValueError):
            pass
        else:
            try:
                kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
            finally:
                os.close(fd)
            return {"text": rel, "path": PurePosixPath(rel).as_posix(), "kind": kind}
    return {"text": item, "path": None, "kind": "text"}


def build_view(run: str | os.PathLike[str] | RunDir, report: GoodputReport | None = None) -> dict[str, Any]:
    """Everything the run page draws, for one run directory (raises `InputError` like `compute_goodput`)."""
    rd = run if isinstance(run, RunDir) else RunDir(run)
    report = report if report is not None else compute_goodput(rd)
    # The same plausible records the report accounted (its warnings already list the rest).
    kept, _ = judge_records(rd.load(skipped=SkippedRecords()))
    records = [item.record for item in kept]
    offsets = report.clock_offsets_seconds

    def t(e: Event) -> float:
        return e.time - offsets.get(e.host, 0.0)

    run_started = next((e for e in records if isinstance(e, RunStarted)), None)
    run_ended = final_run_end(records)  # the last one: a requeued job has one per allocation
    step_starts = [t(e) - e.duration_seconds for e in records if isinstance(e, (StepCompleted, StepSpan))]
    start = t(run_started) if run_started is not None else min([t(e) for e in records] + step_starts)
    progress = _progress(records, t, start)
    config = run_started.config if run_started is not None else {}
    return {
        "version": VIEW_VERSION,
        "report": report.to_json(),
        "run": {
            "start_epoch": start,
            "last_event_seconds": _r(max(t(e) for e in records) - start),
            "ended": run_ended is not None,
            "world_size": run_started.world_size if run_started else None,
            "nnodes": run_started.nnodes if run_started else None,
            "simulated": bool(run_started and run_started.synthetic and config.get("simulator") == "trainguard.sim"),
            "records": len(records),
        },
        "bucket_order": list(BUCKETS),
        "bucket_labels": {b: BUCKET_LABELS.get(b, b) for b in BUCKETS},
        "timeline": {"progress": progress.points, "markers": _markers(records, t, start, progress)},
        "interruption_details": _interruption_details(rd.root, records, report),
        "stragglers": _stragglers(records, t, start),
        "telemetry": _telemetry(records, t, start),
        "thermal_power": sections(records, rd.root),
    }


class _Progress:
    """Step over time per attempt: the line of the timeline, and the step at any moment for markers."""

    def __init__(self, per_attempt: dict[int, list[tuple[float, int]]]) -> None:
        self.per_attempt = per_attempt
        self._all: list[tuple[float, int]] | None = None
        self.points: dict[str, list[Any]] = {"t": [], "step": [], "attempt": []}
        total = sum(len(v) for v in per_attempt.values())
        share = max(2, MAX_PROGRESS_POINTS // max(len(per_attempt), 1)) if total > MAX_PROGRESS_POINTS else None
        for attempt in sorted(per_attempt):
            pts = per_attempt[attempt]
            keep = _thin(len(pts), share) if share else range(len(pts))
            for i in keep:
                self.points["t"].append(_r(pts[i][0]))
                self.points["step"].append(pts[i][1])
                self.points["attempt"].append(attempt)
            # A gap between attempts: the line drops back to the restored step instead of joining them.
            self.points["t"].append(None)
            self.points["step"].append(None)
            self.points["attempt"].append(attempt)

    def step_at(self, attempt: int | None, when: float) -> int | None:
        """The last step an attempt had finished at ``when`` (any attempt's if ``attempt`` is unknown)."""
        pts = self.per_attempt.get(attempt) if attempt is not None else None
        if pts is None:
            if self._all is None:
                self._all = sorted(p for v in self.per_attempt.values() for p in v)
            pts = self._all
        i = bisect.bisect_right(pts, (when, math.inf)) - 1
        return pts[i][1] if i >= 0 else (pts[0][1] if pts else None)


def _progress(records: Sequence[Event], t: Any, start: float) -> _Progress:
    ends: dict[tuple[int, int], float] = {}
    begins: dict[int, tuple[float, int]] = {}
    spans: list[tuple[int, float, float, int, int]] = []
    for e in records:
        if isinstance(e, StepCompleted):
            end = t(e) - start
            key = (e.attempt, e.step)
            ends[key] = max(end, ends.get(key, -math.inf))
            b = (end - e.duration_seconds, e.step - 1)
        elif isinstance(e, StepSpan):
            end = t(e) - start
            spans.append((e.attempt, end - e.duration_seconds, end, e.first_step, e.last_step))
            b = (end - e.duration_seconds, e.first_step - 1)
        else:
            continue
        if e.attempt not in begins or b < begins[e.attempt]:
            begins[e.attempt] = b
    per_attempt: dict[int, list[tuple[float, int]]] = defaultdict(list)
    for (attempt, step), end in ends.items():
        per_attempt[attempt].append((end, step))
    for attempt, s0, s1, first, last in spans:
        per_attempt[attempt] += [(s0, first - 1), (s1, last)]
    for attempt, b in begins.items():
        per_attempt[attempt].append(b)
    return _Progress({a: sorted(set(v)) for a, v in per_attempt.items()})


def _columns(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows as columns (smaller JSON, and what the plotting library takes), thinned to `MAX_MARKERS`."""
    rows.sort(key=lambda r: r["t"])
    keep = _thin(len(rows), MAX_MARKERS)
    out: dict[str, Any] = {k: [rows[i].get(k) for i in keep] for k in ("t", "step", "label")}
    out["count"] = len(rows)
    return out


def _ranks_text(ranks: Sequence[int]) -> str:
    shown = ",".join(str(r) for r in ranks[:8])
    return f"rank {shown}" + (f" (+{len(ranks) - 8})" if len(ranks) > 8 else "") if ranks else ""


_FROM_TIER = {"memory": " from memory", "peer": " from a peer's copy"}
"""How a restore marker names the tier a checkpoint came from (storage: nothing)."""


def _save_label(s: dict[str, Any]) -> str:
    """A save marker's words: a storage save or a memory-tier copy, done or failed."""
    if not s["ok"]:
        what = "memory copy" if s["tier"] else "save"
        return f"{what} of step {s['step']} failed: {s['error'] or '?'}"
    done = f"copied step {s['step']} to memory" if s["tier"] else f"saved step {s['step']}"
    return f"{done} (stall {s['blocking']:.1f} s)"


def _markers(records: Sequence[Event], t: Any, start: float, progress: _Progress) -> dict[str, Any]:
    failures: list[dict[str, Any]] = []
    detections: list[dict[str, Any]] = []
    restarts: list[dict[str, Any]] = []
    planned: list[dict[str, Any]] = []
    stragglers: list[dict[str, Any]] = []
    saves: dict[tuple[int, int, str], dict[str, Any]] = {}
    loads: dict[int, dict[str, Any]] = {}
    for e in records:
        when = t(e) - start
        if isinstance(e, FailureDetected):
            onset = when - e.detection_latency_seconds
            step = e.step if e.step is not None else progress.step_at(e.attempt, onset)
            who = " ".join(filter(None, [_ranks_text(e.ranks), ",".join(e.hosts[:3])]))
            failures.append({"t": _r(onset), "step": step, "label": f"{e.kind} (attempt {e.attempt}) {who}".strip()})
            detections.append({"t": _r(when), "step": step,
                               "label": f"{e.kind} detected after {e.detection_latency_seconds:.1f} s"})
        elif isinstance(e, AttemptStarted) and e.attempt > 0:
            step = e.resume_step if e.resume_step is not None else 0
            restarts.append({"t": _r(when), "step": step, "attempt": e.attempt})
        elif isinstance(e, PlannedInterruption):
            planned.append({"t": _r(when), "step": progress.step_at(e.attempt, when),
                            "label": f"planned: {e.reason or 'maintenance'}"})
        elif isinstance(e, CheckpointLoaded):  # one marker per attempt, not one per rank
            r = loads.setdefault(e.attempt, {"t": when, "step": e.step, "seconds": e.seconds, "tier": e.tier})
            r["t"], r["seconds"] = max(r["t"], when), max(r["seconds"], e.seconds)
        elif isinstance(e, CheckpointSaveFinished):
            key = (e.attempt, e.step, e.tier)  # a memory copy of a step storage also saved is its own marker
            s = saves.setdefault(key, {"t": when, "step": e.step, "ok": True, "blocking": 0.0, "error": "",
                                       "tier": e.tier})
            s["t"] = max(s["t"], when)
            s["ok"] = s["ok"] and e.ok
            s["blocking"] = max(s["blocking"], e.blocking_seconds)
            s["error"] = s["error"] or e.error
        elif e.TYPE == "straggler_detected":
            rank = getattr(e, "rank", None)
            stragglers.append({"t": _r(when), "step": getattr(e, "step", None) or progress.step_at(None, when),
                               "label": f"straggler rank {rank} x{getattr(e, 'slowdown', 1.0):.2f}"})
    for r in restarts:  # the step restored, where the attempt says (the agent names storage's newest only)
        r["step"] = loads[r["attempt"]]["step"] if r["attempt"] in loads else r["step"]
        r["label"] = f"attempt {r.pop('attempt')} from step {r['step']}"
    restores = [{"t": _r(r["t"]), "step": r["step"],
                 "label": f"restored step {r['step']}{_FROM_TIER.get(r['tier'], '')} in {r['seconds']:.1f} s"}
                for r in loads.values()]
    ok = [{"t": _r(s["t"]), "step": s["step"], "label": _save_label(s)} for s in saves.values() if s["ok"]]
    bad = [{"t": _r(s["t"]), "step": s["step"], "label": _save_label(s)} for s in saves.values() if not s["ok"]]
    return {"failures": _columns(failures), "detections": _columns(detections), "restarts": _columns(restarts),
            "planned": _columns(planned), "checkpoints": _columns(ok), "failed_checkpoints": _columns(bad),
            "restores": _columns(restores), "stragglers": _columns(stragglers)}


def _interruption_details(root: Path, records: Sequence[Event], report: GoodputReport) -> list[dict[str, Any]]:
    """Per interruption of the report (same order): detail, explanation and evidence, as the report chose them."""
    first_failure: dict[int, FailureDetected] = {}
    diagnosis: dict[int, Diagnosis] = {}
    for e in records:
        if isinstance(e, FailureDetected):
            cur = first_failure.get(e.attempt)
            if cur is None or e.time < cur.time:
                first_failure[e.attempt] = e
        elif isinstance(e, Diagnosis) and (e.attempt not in diagnosis
                                           or e.confidence > diagnosis[e.attempt].confidence):
            diagnosis[e.attempt] = e  # as the report: the most confident one, the first on a tie
    out = []
    for i in report.interruptions:
        f = None if i.planned else first_failure.get(i.attempt)
        d = None if i.planned else diagnosis.get(i.attempt)
        evidence = list(dict.fromkeys([*(f.evidence if f else ()), *(d.evidence if d else ())]))
        out.append({
            "attempt": i.attempt,
            "detail": f.detail if f else "",
            "explanation": d.explanation if d else "",
            "confidence": d.confidence if d else None,
            "evidence": [evidence_link(root, item) for item in evidence[:50]],
        })
    return out


def _stragglers(records: Sequence[Event], t: Any, start: float) -> dict[str, Any] | None:
    """Detections and a rank x time heat map of each rank's own step time relative to the median rank.

    Only for runs with ``straggler_detected`` records. Own time is the step minus its ``comm_wait`` phase
    where the script reports phases (in a synchronous step every rank's total is the same: the slow one
    is the rank that waits least); without phases the map shows step times and the detections mark the rank.
    """
    found = [e for e in records if e.TYPE == "straggler_detected"]
    if not found:
        return None
    detections = [{
        "t": _r(t(e) - start), "attempt": getattr(e, "attempt", None), "rank": getattr(e, "rank", None),
        "node": getattr(e, "node", ""), "step": getattr(e, "step", None), "onset_step": getattr(e, "onset_step", None),
        "slowdown": getattr(e, "slowdown", None), "cost_seconds": getattr(e, "cost_seconds", None),
        "signal": getattr(e, "signal", ""), "action": getattr(e, "action", ""), "detail": getattr(e, "detail", ""),
    } for e in sorted(found, key=lambda e: e.time)]
    own: dict[tuple[int, int], dict[int, tuple[float, float]]] = defaultdict(dict)
    for e in records:
        if isinstance(e, StepCompleted):
            work = e.duration_seconds - float(e.phases.get("comm_wait", 0.0) or 0.0)
            own[(e.attempt, e.step)][e.rank] = (t(e) - start, max(work, 0.0))
    heat: dict[str, Any] | None = None
    # Columns are runs of consecutive steps (not fixed time bins, which leave holes between sparse steps),
    # placed at their mean end time.
    ordered = sorted(((max(when for when, _ in per.values()), per) for per in own.values() if len(per) >= 2),
                     key=lambda item: item[0])
    if ordered:
        groups = min(HEATMAP_BINS, len(ordered))
        cells: dict[tuple[int, int], list[float]] = defaultdict(list)
        centers: list[float] = []
        for g in range(groups):
            chunk = ordered[g * len(ordered) // groups:(g + 1) * len(ordered) // groups]
            centers.append(sum(end for end, _ in chunk) / len(chunk))
            for _, per in chunk:
                median = statistics.median(w for _, w in per.values())
                if median > 0:
                    for rank, (_, work) in per.items():
                        cells[(rank, g)].append(work / median)
        value = {k: statistics.median(v) for k, v in cells.items()}
        peak: dict[int, float] = defaultdict(float)
        for (rank, _), v in value.items():
            peak[rank] = max(peak[rank], v)
        ranks = sorted(sorted(peak, key=lambda r: -peak[r])[:MAX_HEATMAP_RANKS])
        if ranks:
            heat = {
                "t": [_r(c) for c in centers],
                "ranks": ranks,
                "z": [[(round(value[(r, g)], 4) if (r, g) in value else None) for g in range(groups)] for r in ranks],
                "ranks_total": len(peak),
            }
    return {"detections": detections, "heatmap": heat}


def _telemetry(records: Sequence[Event], t: Any, start: float) -> dict[str, Any] | None:
    """Temperature, clock and power over time per host and device; only for runs with ``telemetry_sample``."""
    series: dict[str, list[Event]] = defaultdict(list)
    for e in records:
        if e.TYPE == "telemetry_sample":
            series[f"{e.host}/{getattr(e, 'device', '') or '?'}"].append(e)
    if not series:
        return None
    out = []
    for name in sorted(series)[:MAX_TELEMETRY_SERIES]:
        samples = sorted(series[name], key=lambda e: e.time)
        keep = _thin(len(samples), MAX_TELEMETRY_POINTS)
        picked = [samples[i] for i in keep]
        out.append({
            "name": name,
            "source": getattr(picked[0], "source", ""),
            "t": [_r(t(e) - start) for e in picked],
            "temperature_c": [getattr(e, "temperature_c", None) for e in picked],
            "clock_mhz": [getattr(e, "clock_mhz", None) for e in picked],
            "power_watts": [getattr(e, "power_watts", None) for e in picked],
        })
    return {"series": out, "series_total": len(series)}
