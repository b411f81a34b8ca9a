"""The agent's response to silent data corruption a worker found: record it, roll the checkpoints back to
the last clean step at the restart, and exclude the culprit's node (the decisions are `trainguard.sdc.verdict`'s).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from trainguard.core.events import CheckpointRejected, Diagnosis, Event, FailureDetected, HealthCheckResult
from trainguard.launch.config import SupervisorConfig
from trainguard.launch.failures import FailureRecorder
from trainguard.sdc import verdict as sdc

log = logging.getLogger(__name__)


class CorruptionResponse:
    """Corruption found in an attempt: recorded when found, acted on at the restart, once every node has
    stopped its workers (`rollback` before the workers start, `exclusion_reasons` in the health gate)."""

    def __init__(self, cfg: SupervisorConfig, emit: Callable[[Event], None], recorder: FailureRecorder) -> None:
        self.cfg = cfg
        self.emit = emit
        self.recorder = recorder
        self.pending: tuple[sdc.SdcMarker, dict[int, str]] | None = None
        """Corruption found in the last attempt (marker, rank -> node): rollback and exclusion at the restart."""

    def found(self, attempt: int) -> sdc.SdcMarker | None:
        """The marker a rank of ``attempt`` left, once (None while one is pending)."""
        marker_file = sdc.marker_path(self.cfg.run_dir, attempt)
        if self.pending is None and os.path.lexists(marker_file):  # one stat per poll
            marker = sdc.read_marker(marker_file)
            if marker is not None and marker.attempt == attempt:
                return marker
        return None

    def record(self, marker: sdc.SdcMarker, attempt: int, wall: float) -> None:
        """Keep ``marker`` for the restart and, if this node claims the failure, write ``FailureDetected``
        (kind ``sdc``) and its ``Diagnosis``."""
        nodes = self.cfg.layout.rank_nodes(attempt)
        self.pending = (marker, nodes)
        culprits = list(marker.culprit_ranks)
        hosts = tuple(sorted({nodes.get(r, self.cfg.node_id) for r in culprits}))
        plan = sdc.rollback_plan(self._committed_checkpoints(), marker.last_clean_step)
        if plan.resume_step is not None:
            rollback = (f"rolling back to the checkpoint of step {plan.resume_step} (newest at or before the last "
                        f"clean step {marker.last_clean_step})")
        elif plan.set_aside:
            rollback = (f"no checkpoint at or before the last clean step {marker.last_clean_step}: "
                        f"restarting from the beginning")
        else:
            rollback = (f"WARNING: no trainguard checkpoint to roll back to: the restart resumes from the "
                        f"script's own checkpoint, which may be newer than the last clean step "
                        f"{marker.last_clean_step} and still carry the corruption")
            log.warning("sdc: %s", rollback)
        if plan.set_aside:
            rollback += f"; checkpoints {', '.join(str(s) for s in plan.set_aside)} set aside"
        exclusion = self._exclusion_note(marker, nodes)
        who = "culprit" if marker.majority else "suspects (no majority)"
        detail = f"{marker.explanation}; {who}: ranks {', '.join(map(str, culprits))}; {rollback}; {exclusion}"
        if self.recorder.claim(attempt):
            relative = str(sdc.marker_path(Path("."), attempt))
            record = FailureDetected(time=wall, host=self.cfg.node_id, attempt=attempt, kind="sdc",
                                     ranks=tuple(culprits), hosts=hosts,
                                     detection_latency_seconds=max(0.0, wall - marker.last_clean_time),
                                     step=marker.step, evidence=(relative,), detail=detail)
            self.recorder.add(record, Diagnosis(
                time=time.time(), host=self.cfg.node_id, attempt=attempt, category="Silent Data Corruption",
                group="GPU", verdict="sdc", culprit_ranks=tuple(culprits), culprit_hosts=hosts,
                confidence=0.9 if marker.majority else 0.5,
                explanation=f"parameter fingerprints after step {marker.step}: {marker.explanation}",
                evidence=(relative,)))

    def _exclusion_note(self, marker: sdc.SdcMarker, nodes: dict[int, str]) -> str:
        notes = []
        for node in sorted({nodes.get(r, self.cfg.node_id) for r in marker.culprit_ranks}):
            decision = sdc.exclusion_decision(marker, nodes, node, self.cfg.max_nodes)
            notes.append(f"node {node} excluded at the restart" if decision.exclude
                         else f"node {node} {decision.reason.partition('; ')[2]}")
        return "; ".join(notes) or "no node to exclude"

    def _committed_checkpoints(self) -> list[int]:
        from trainguard.checkpoint.manifest import committed_steps

        return committed_steps(self.cfg.checkpoint_dir)

    def exclusion_reasons(self, attempt: int) -> list[str]:
        """The reason to exclude this node when one of its ranks corrupted parameters in the last attempt.

        A node that cannot be excluded (the job's only node, or no majority named a culprit) is kept, and a
        failed low-severity ``sdc`` check records that it should be drained after the job.
        """
        if self.pending is None:
            return []
        marker, nodes = self.pending
        decision = sdc.exclusion_decision(marker, nodes, self.cfg.node_id, self.cfg.max_nodes)
        if decision.exclude:
            return [decision.reason]
        if decision.reason:
            self.emit(HealthCheckResult(time=time.time(), host=self.cfg.node_id, name="sdc", severity="low",
                                        ok=False, detail=decision.reason, attempt=attempt))
        return []

    def rollback(self) -> None:
        """Before the restart after corruption: move checkpoints newer than the last clean step aside
        (``.sdc-suspect-step-N-...``, kept as evidence), so the restore resumes from a clean one."""
        if self.pending is None:
            return
        marker, _ = self.pending
        self.pending = None
        plan = sdc.rollback_plan(self._committed_checkpoints(), marker.last_clean_step)
        for step in plan.set_aside:
            path = self.cfg.checkpoint_dir / f"step-{step}"
            aside = self.cfg.checkpoint_dir / f".sdc-suspect-step-{step}-a{marker.attempt}-{os.getpid()}"
            try:
                os.rename(path, aside)
            except FileNotFoundError:
                continue  # another node sharing the folder moved it first
            except OSError as exc:
                log.warning("sdc: cannot set aside %s (%s); the restore may pick it", path, exc)
                continue
            self.emit(CheckpointRejected(time=time.time(), host=self.cfg.node_id, attempt=marker.attempt, step=step,
                                         path=str(aside), reason=f"sdc: taken after the last clean step "
                                         f"{marker.last_clean_step} (corruption found after step {marker.step})"))
