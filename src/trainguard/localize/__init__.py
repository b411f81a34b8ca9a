"""Hang and desync localization from PyTorch flight-recorder dumps: which rank, which host, what.

Pure analysis (never imports torch). Entry point: `diagnose_path`. See docs/localize.md.
"""

from __future__ import annotations

from trainguard.localize.diagnose import analyze, diagnose_path, load_rank_map
from trainguard.localize.model import VERDICTS, EntryView, FileWarning, LocalizationReport, Problem
from trainguard.localize.reader import Dump, DumpError, decode_dump, read_dump, safe_unpickle
from trainguard.localize.report import render_text

__all__ = [
    "VERDICTS",
    "Dump",
    "DumpError",
    "EntryView",
    "FileWarning",
    "LocalizationReport",
    "Problem",
    "analyze",
    "decode_dump",
    "diagnose_path",
    "load_rank_map",
    "read_dump",
    "render_text",
    "safe_unpickle",
]
