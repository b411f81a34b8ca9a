"""The drain section of ``trainguard report``: which nodes the run drained in the scheduler, or chose not to.

From the run's ``node_drained`` records (`trainguard.health.drain`); ``report --json`` carries them as ``drains``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from trainguard.core.events import NodeDrained


def drain_section(run_dir: Any) -> dict[str, Any]:
    """``{"drains": [...]}``: every drain decision of the run, oldest first; ``run_dir`` may also be a run already
    read by `trainguard.accounting.stepfold.fold_run`."""
    from trainguard.accounting.stepfold import FoldedRun
    from trainguard.core.eventlog import SkippedRecords, iter_run
    from trainguard.core.rundir import RunDir

    if isinstance(run_dir, FoldedRun):
        found = [item.record for item in run_dir.items if isinstance(item.record, NodeDrained)]
    else:
        root = run_dir.root if isinstance(run_dir, RunDir) else run_dir
        found = [record for _, _, record in iter_run(root, skipped=SkippedRecords()) if isinstance(record, NodeDrained)]
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
