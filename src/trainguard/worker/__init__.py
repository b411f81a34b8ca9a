"""In-rank library: step/phase marks, step events, heartbeats to the node agent, evidence on request.

Public as ``trainguard.attach()``. See docs/run.md.
"""

from __future__ import annotations

from trainguard.worker.library import StepContext, Worker, attach, parse_heartbeat, pg_timeout

__all__ = ["StepContext", "Worker", "attach", "parse_heartbeat", "pg_timeout"]
