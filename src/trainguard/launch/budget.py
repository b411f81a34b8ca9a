"""The restart budget: how many more restarts the job may take, and why it stopped taking them.

One owner for a number torch also keeps: `trainguard.launch.attempts.Attempts` holds it (and decides when it
is spent, refunded or stopped), and `trainguard.torch_api.elastic.ElasticAgentBase` sets torch's counter from
`RestartBudget.remaining` after every monitor round. Failures spend a restart; a planned
interruption (a node leaving for a waiting spare) and an in-process try that fell back to a whole-process
restart give theirs back; the no-progress rule or torch itself can stop restarts altogether.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RestartBudget:
    """Restarts left out of ``max_restarts``. Pure: no torch, no clock."""

    max_restarts: int
    """The job's budget (``--max-restarts``)."""
    used: int = 0
    """Restarts charged so far, net of refunds (a refund before its charge makes this -1 for a moment)."""
    stop_reason: str | None = None
    """Set once restarts are no longer allowed; never cleared."""

    def remaining(self) -> int:
        """Restarts the job may still take (0 once stopped)."""
        if self.stop_reason is not None:
            return 0
        return max(0, self.max_restarts - self.used)

    def spend(self) -> None:
        """A restart was charged (a failure, or an in-process try)."""
        self.used += 1

    def refund(self) -> None:
        """The restart this interruption causes is not a retry (a membership change, or the whole-process
        restart that replaces an in-process try already charged)."""
        self.used -= 1

    def stop(self, reason: str) -> None:
        """No more restarts, because of ``reason`` (the first reason given is kept)."""
        if self.stop_reason is None:
            self.stop_reason = reason
