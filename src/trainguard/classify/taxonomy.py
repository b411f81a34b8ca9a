"""The Llama 3 Table 5 root-cause taxonomy: categories, their component groups, and precedence tiers."""

from __future__ import annotations

from trainguard.taxonomy import GROUPS, TABLE5_CATEGORIES, UNKNOWN

CATEGORIES: dict[str, str] = TABLE5_CATEGORIES
"""Table 5's 18 categories (names verbatim, in the paper's order) and the group each belongs to."""

__all__ = ["CATEGORIES", "GROUPS", "TIERS", "UNKNOWN", "default_tier", "group_of"]

TIERS: tuple[str, ...] = ("hardware", "maintenance", "software", "timeout", "hint")
"""Precedence tiers, strongest first: a strong signal of an earlier tier outranks any later one."""


def group_of(category: str) -> str:
    """The Table 5 group of ``category`` (``Unknown`` for ``Unknown`` and unlisted categories)."""
    return CATEGORIES.get(category, UNKNOWN)


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
