"""Llama 3's root-cause taxonomy (arXiv 2407.21783, Table 5), the one definition that classification,
simulation and reports share."""

from __future__ import annotations

UNKNOWN = "Unknown"
"""The category (and group) of an interruption whose cause is not known."""

TABLE5_CATEGORIES: dict[str, str] = {
    "Faulty GPU": "GPU",
    "GPU HBM3 Memory": "GPU",
    "Software Bug": "Dependency",
    "Network Switch/Cable": "Network",
    "Host Maintenance": "Unplanned Maintenance",
    "GPU SRAM Memory": "GPU",
    "GPU System Processor": "GPU",
    "NIC": "Host",
    "NCCL Watchdog Timeouts": "Unknown",
    "Silent Data Corruption": "GPU",
    "GPU Thermal Interface + Sensor": "GPU",
    "SSD": "Host",
    "Power Supply": "Host",
    "Server Chassis": "Host",
    "IO Expansion Board": "Host",
    "Dependency": "Dependency",
    "CPU": "Host",
    "System Memory": "Host",
}
"""Table 5's 18 categories (names verbatim, in the paper's order) and the group each belongs to."""

TABLE5_GROUPS: dict[str, str] = {**TABLE5_CATEGORIES, UNKNOWN: UNKNOWN}
"""Every category a diagnosis may name (Table 5's and ``Unknown``) and its group."""

GROUPS: tuple[str, ...] = ("GPU", "Dependency", "Network", "Unplanned Maintenance", "Host", "Unknown")
"""Table 5's component groups."""


def group_of(category: str) -> str:
    """The Table 5 group of ``category`` (``Unknown`` for ``Unknown`` and unlisted categories)."""
    return TABLE5_GROUPS.get(category, UNKNOWN)
