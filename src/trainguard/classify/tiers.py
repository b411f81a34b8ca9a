"""Precedence tiers of classification rules: which kind of signal outranks which (docs/classify.md)."""

from __future__ import annotations

from trainguard.core.taxonomy import UNKNOWN, group_of

__all__ = ["TIERS", "default_tier"]

TIERS: tuple[str, ...] = ("hardware", "maintenance", "software", "timeout", "hint")
"""Precedence tiers, strongest first: a strong signal of an earlier tier outranks any later one."""


def default_tier(category: str) -> str:
    """The tier a rule gets when its data file names none."""
    if category == UNKNOWN:
        return "hint"
    if category == "Host Maintenance":
        return "maintenance"
    if category == "NCCL Watchdog Timeouts":
        return "timeout"
    if group_of(category) == "Dependency":
        return "software"
    return "hardware"
