"""Run the real ``trainguard`` command in a subprocess (what users and scripts see)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


def trainguard(*args: str, timeout: float = 120, env: dict[str, str] | None = None,
               cwd: str | None = None) -> Result:
    full_env = {**os.environ, **(env or {})}
    p = subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True, text=True,
                       timeout=timeout, env=full_env, cwd=cwd)
    return Result(p.returncode, p.stdout, p.stderr)


def assert_one_line_error(r: Result, code: int) -> None:
    """A clear error: the documented exit code, one line on stderr, no traceback."""
    assert r.code == code, (r.code, r.err)
    assert "Traceback" not in r.err
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1, r.err
