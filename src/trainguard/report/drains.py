"""The drain section of ``trainguard report``: which nodes the run drained in the scheduler, or chose not to.

From the run's ``node_drained`` records (`trainguard.health.drain`); ``report --json`` carries them as ``drains``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from trainguard.core.events import NodeDrained


def drain_section(run_dir: Any) -> dict[str, Any]:
    """``{"drains": [...]}``: every drain decision of the run, oldest first."""
    from trainguard.core.eventlog import SkippedRecords
    from trainguard.core.rundir import RunDir

    rd = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    found = [item.record for item in rd.load(skipped=SkippedRecords()) if isinstance(item.record, NodeDrained)]
    found.sort(key=lambda r: r.time)
    return {"drains": [{"time": r.time, "node": r.node, "status": r.status, "cause": r.cause, "reason": r.reason,
                        "scheduler": r.scheduler, "attempt": r.attempt, "decided_by": r.host, "detail": r.detail}
                       for r in found]}


def render_drains(doc: dict[str, Any]) -> list[str]:
    """Lines for the terminal report (none when the run drained nothing and refused nothing)."""
    drains = doc.get("drains") or []
    if not drains:
        return []
    lines = ["", "nodes drained in the scheduler (--drain-bad-nodes)",
             f"  {'at':<19}  {'node':<12} {'status':<15} {'cause':<9} reason / why not"]
    for d in drains:
        when = dt.datetime.fromtimestamp(d["time"]).strftime("%Y-%m-%d %H:%M:%S")
        why = d["reason"] if d["status"] == "drained" else f"{d['detail']}"
        lines.append(f"  {when:<19}  {d['node'][:12]:<12} {d['status']:<15} {d['cause']:<9} {why}")
    return lines
