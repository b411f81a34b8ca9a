"""Helpers for the ``trainguard run`` / ``demo`` end-to-end tests: a tiny GPT and event readers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TRAIN_GPT = ROOT / "examples" / "train_gpt.py"
TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq", "16", "--batch", "4", "--vocab", "64"]
TINY_DEMO = "d_model=32,layers=1,heads=2,seq=16,batch=4,vocab=64"


def trainguard(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a fresh interpreter, as a user would."""
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, check=False)


def start_trainguard(*args: str, log: Path) -> subprocess.Popen[bytes]:
    fh = log.open("wb")
    return subprocess.Popen([sys.executable, "-m", "trainguard", *args], stdout=fh, stderr=subprocess.STDOUT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def events(run_dir: Path, prefix: str = "") -> list[dict[str, Any]]:
    """All records of the event files whose name starts with ``prefix``."""
    out = []
    for path in sorted((run_dir / "events").glob(f"{prefix}*.jsonl")):
        out.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return out


def of_type(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == kind]
