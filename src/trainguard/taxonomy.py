"""Llama 3's root-cause taxonomy (arXiv 2407.21783, Table 5): shared by classification, simulation, reports."""

from __future__ import annotations

UNKNOWN = "Unknown"

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

GROUPS: tuple[str, ...] = ("GPU", "Dependency", "Network", "Unplanned Maintenance", "Host", "Unknown")
"""Table 5's component groups."""
