"""The restart policy's no-progress rule (pure logic): stop restarting when attempts stop moving training on.

An attempt made progress when its highest completed step went beyond every earlier attempt's, or when a
newer checkpoint got committed: trainguard's own, or one the script's framework saved (reported by its
adapter, `trainguard.launch.framework_progress`). With an adapter the steps are the framework's global step,
which continues across restarts (a job resuming 150 -> 250 -> 350 steps beyond each attempt before it),
whatever the optimizer's own count does. ``max_no_progress_attempts`` failed attempts in a row without
progress end the run; elastic's restart budget (``--max-restarts``) is checked alongside.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttemptOutcome:
    """What one failed attempt achieved."""

    best_step: int | None
    """Highest step any local rank completed in the attempt (heartbeats); None when unknown."""
    latest_checkpoint: int | None
    """Newest committed trainguard checkpoint step after the attempt; None when there is none."""
    framework_checkpoint: int | None = None
    """Newest checkpoint the script's framework saved so far (the highest global step of its adapter's successful
    ``checkpoint_save_finished`` records); None when no adapter reported one."""


@dataclass(frozen=True)
class PolicyDecision:
    """What to do after a failed attempt."""

    stop: bool
    """True: do not restart."""
    reason: str | None
    """Why the run stops (None when it goes on)."""
    progressed: bool
    """Whether this attempt made progress."""
    attempts_without_progress: int
    """Failed attempts in a row without progress, this one included."""


class NoProgressRule:
    """Counts failed attempts in a row that neither stepped beyond the best so far nor saved a newer checkpoint."""

    def __init__(self, max_no_progress_attempts: int, max_restarts: int) -> None:
        self.max_no_progress_attempts = max_no_progress_attempts
        self.max_restarts = max_restarts
        self.best_step: int | None = None
        self.best_checkpoint: int | None = None
        self.best_framework_checkpoint: int | None = None
        self.without_progress = 0

    def on_failure(self, outcome: AttemptOutcome, restarts_left: int) -> PolicyDecision:
        stepped = outcome.best_step is not None and outcome.best_step > (self.best_step or 0)
        saved = _newer(outcome.latest_checkpoint, self.best_checkpoint)
        framework_saved = _newer(outcome.framework_checkpoint, self.best_framework_checkpoint)
        if stepped:
            self.best_step = outcome.best_step
        if saved:
            self.best_checkpoint = outcome.latest_checkpoint
        if framework_saved:
            self.best_framework_checkpoint = outcome.framework_checkpoint
        progressed = stepped or saved or framework_saved
        self.without_progress = 0 if progressed else self.without_progress + 1
        reason: str | None = None
        if self.without_progress >= self.max_no_progress_attempts:
            framework = (f", framework's: {self.best_framework_checkpoint}"
                         if self.best_framework_checkpoint is not None else "")
            reason = (f"no progress: no step beyond {self.best_step or 0} and no new checkpoint "
                      f"(latest: {self.best_checkpoint}{framework}) across {self.without_progress} failed attempts")
        elif restarts_left <= 0:
            reason = f"restart budget spent ({self.max_restarts} restarts)"
        return PolicyDecision(reason is not None, reason, progressed, self.without_progress)


def _newer(step: int | None, best: int | None) -> bool:
    return step is not None and (best is None or step > best)
