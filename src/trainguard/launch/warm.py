"""Warm spare workers kept by the agent: started ahead, torch already imported, handed a failed rank's place.

Each spare runs `trainguard.worker.warm` with the job's command and waits on its stdin. An in-process
restart (`trainguard.launch.inprocess`) gives the failed rank's environment and log files to a spare
instead of starting a cold process, then tops the pool up once the recovery is over.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from trainguard.launch.stop import stop_processes

log = logging.getLogger(__name__)


class WarmSpares:
    """A pool of ``count`` waiting spare processes for one agent."""

    def __init__(self, count: int, args: tuple[str, ...], log_dir: Path, grace_seconds: float) -> None:
        self.count = count
        self.args = args
        """The worker's arguments after the interpreter (``-u script.py ...`` or ``-u -m module ...``)."""
        self.log_dir = log_dir
        self.grace_seconds = grace_seconds
        self.spares: list[subprocess.Popen[bytes]] = []
        self._started = 0

    def _command(self) -> list[str]:
        rest = list(self.args[1:] if self.args[:1] == ("-u",) else self.args)  # keep a script's own "-u"
        python = os.environ.get("PYTHON_EXEC", sys.executable)  # the workers' interpreter (`worker_entry`)
        return [python, "-u", "-m", "trainguard.worker.warm", *rest]

    def fill(self) -> None:
        """Start spares until ``count`` are alive (with trainguard's automatic hooks off until they get a rank)."""
        self.spares = [p for p in self.spares if p.poll() is None]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        while len(self.spares) < self.count:
            env = {**os.environ, "TRAINGUARD_AUTO": "0"}
            with open(self.log_dir / f"spare-{self._started}.log", "ab") as out:
                proc = subprocess.Popen(self._command(), stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True)
            self._started += 1
            self.spares.append(proc)
            log.info("warm spare started: pid %d", proc.pid)

    def take(self, env: dict[str, str], stdout: str | None, stderr: str | None) -> subprocess.Popen[bytes] | None:
        """Hand a rank (its environment and log files) to a waiting spare; None when none is alive."""
        while self.spares:
            proc = self.spares.pop(0)
            if proc.poll() is not None or proc.stdin is None:
                continue
            line = json.dumps({"env": env, "stdout": stdout, "stderr": stderr}) + "\n"
            try:
                proc.stdin.write(line.encode())
                proc.stdin.close()
            except OSError:  # it died between the poll and the write
                continue
            return proc
        return None

    def close(self) -> None:
        """Stop every waiting spare (end of the run, or a whole-process restart)."""
        alive = [p for p in self.spares if p.poll() is None]
        if alive:
            stop_processes(alive, self.grace_seconds, signal.SIGTERM)
        self.spares = []

