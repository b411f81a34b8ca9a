"""Pure reading of the peers benchmark's records: step logs -> fault-to-step gaps, NVRx's log -> detections, tables.

No torch and no process handling here, so the rules that turn records into the published figures are unit
tested (tests/unit/test_peers_summary.py). benchmarks/peers.py runs the systems and calls these.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# "[2026-12-05 10:26:18,258] [WARNING] [RankMonServer27905@vm:0] Did not get subsequent heartbeat. ..."
_NVRX_HANG = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})\] \[WARNING\] \[RankMonServer\d+@[^:\]]*:(\d+)\] "
                        r"(Did not get (?:initial|subsequent) heartbeat|Section '.*' has been open|Was out of section)")


@dataclass(frozen=True)
class CrashGap:
    """What one crash run's step logs say."""

    fault_time: float
    """Wall-clock time of the crashed rank's last logged step (it kills itself right after logging it)."""
    first_new_step_seconds: float
    """Fault -> the moment every rank has completed a step after the fault (the slowest rank's first)."""
    survivor_stall_seconds: float | None
    """For systems whose other ranks keep their processes (torchft): fault -> their first step after it."""


def crash_gap(lines: Iterable[Mapping[str, Any]], fault_rank: int, fault_step: int,
              continuing_ranks: Sequence[int] = ()) -> CrashGap:
    """Fault -> first new step from step-log lines ``{restart, rank, step, time}``.

    A rank in ``continuing_ranks`` keeps its process through the fault, so a step after the fault step that it
    logs counts (the fault step itself may end on it just after the crashed rank logged it: not recovery);
    every other rank counts only steps of a restarted process (``restart >= 1``), so a step the old process
    squeezed in before being stopped is not taken for recovery.
    """
    rows = list(lines)
    # The first step at or after ``fault_step`` (a torchft group that joins late heals to its peer's step and may
    # never log the step itself; its copy of the script kills itself at the first one past it).
    faults = sorted((r["time"], r["step"]) for r in rows
                    if r["rank"] == fault_rank and r["restart"] == 0 and r["step"] >= fault_step)
    if not faults:
        raise ValueError(f"rank {fault_rank} never logged step {fault_step} in its first launch")
    fault, fault_step = faults[0]
    firsts: dict[int, float] = {}
    for r in rows:
        if r["rank"] in continuing_ranks:
            if r["time"] <= fault or r["step"] <= fault_step:
                continue
        elif r["time"] <= fault or r["restart"] < 1:
            continue
        firsts[r["rank"]] = min(firsts.get(r["rank"], r["time"]), r["time"])
    ranks = {r["rank"] for r in rows}
    missing = sorted(ranks - set(firsts))
    if missing:
        raise ValueError(f"ranks {missing} completed no step after the fault")
    stalls = [firsts[r] - fault for r in continuing_ranks if r in firsts]
    return CrashGap(fault, max(firsts.values()) - fault, max(stalls) if stalls else None)


def nvrx_detections(log_text: str) -> list[tuple[float, int]]:
    """(wall-clock time, rank) of each hang NVRx's rank monitors report, in log order.

    The log's timestamps are local time with milliseconds, as NVRx's formatter writes them.
    """
    out = []
    for line in log_text.splitlines():
        m = _NVRX_HANG.match(line)
        if m:
            stamp = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
            out.append((stamp, int(m.group(3))))
    return out


def spread(values: Iterable[float | None]) -> dict[str, Any]:
    """Median, min and max of the measured values; ``missing`` counts runs with no value (never / error)."""
    vals = list(values)
    got = [v for v in vals if v is not None]
    return {"median": round(statistics.median(got), 3) if got else None,
            "min": round(min(got), 3) if got else None, "max": round(max(got), 3) if got else None,
            "n": len(got), "missing": len(vals) - len(got)}


def _cell(s: Mapping[str, Any], never: str) -> str:
    if not s["n"]:
        return never
    text = f"{s['median']:.2f} s ({s['min']:.2f}-{s['max']:.2f})" if s["n"] > 1 else f"{s['median']:.2f} s"
    return text + (f", {never} in {s['missing']}" if s["missing"] else "")


def table(summary: Mapping[str, Mapping[str, Any]], labels: Mapping[str, str], cap_seconds: float) -> str:
    """The markdown table of docs/peers.md from the benchmark's per-system summary."""
    never = f"none within {cap_seconds:g} s"
    head = ("| system | crash at step 2: fault -> first new step | crash mid-run: fault -> first new step "
            "| hang (SIGSTOP): detection | hang: culprit named right |\n|---|---|---|---|---|")
    rows = [head]
    for name, s in summary.items():
        cells = []
        for fault in ("crash_early", "crash_mid"):
            cells.append(_cell(s[fault]["first_new_step"], "no restart") if fault in s else "not run")
        if "hang" in s:
            cells.append(_cell(s["hang"]["detection"], never))
            right, named = s["hang"]["culprit_right"], s["hang"]["culprit_named"]
            cells.append(f"{right} of {named}" if named else "names no rank")
        else:
            cells += ["not run", "not run"]
        rows.append(f"| {labels.get(name, name)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
