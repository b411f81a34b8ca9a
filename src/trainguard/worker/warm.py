"""A warm spare worker: a process that has imported torch (and the script's imports) and waits for a rank.

The agent starts it as ``python -u -m trainguard.worker.warm [-m] SCRIPT ARGS...`` with its stdin a pipe.
It imports what the script imports at its top level, then blocks reading one JSON line from stdin:
``{"env": {...}, "stdout": path, "stderr": path}``, the environment and log files of the rank it replaces.
It takes them on and runs the script as ``__main__`` in this interpreter, so the rank skips the seconds of
importing torch. End of input (the agent went away) ends the spare. See docs/run.md ("Warm spares").
"""

from __future__ import annotations

import ast
import importlib
import json
import logging
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from trainguard.torch_api.c10d import PREWARM_MODULES

log = logging.getLogger(__name__)

ALWAYS = ("torch", "torch.distributed", "torch.optim", "torch.distributed.checkpoint", *PREWARM_MODULES,
          "trainguard.worker.library", "trainguard.worker.inprocess", "trainguard.checkpoint")
"""Imported by every spare, whatever the script. `PREWARM_MODULES` (about 2 s here) is what the first
flight-recorder dump with stack frames and ``torch.use_deterministic_algorithms`` import: every rank under
trainguard loads it soon after its first step anyway."""


def top_level_imports(script: Path) -> list[str]:
    """Absolute modules a script imports at its top level (``import a.b``, ``from a import b``)."""
    try:
        tree = ast.parse(script.read_text(), filename=str(script))
    except (OSError, SyntaxError, ValueError):
        return []
    out: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
    return out


def preload(modules: list[str]) -> int:
    """Import ``modules`` (failures are the script's business later); returns how many imported."""
    done = 0
    for name in modules:
        try:
            importlib.import_module(name)
            done += 1
        except Exception as exc:  # ImportError, or a module that needs its rank at import: it loads later
            log.debug("warm spare: not preloading %s (%s)", name, exc)
    return done


def _take_over(assignment: dict[str, Any]) -> None:
    """Become the rank: its environment, its log files, trainguard's automatic hooks if the agent wants them."""
    os.environ.update({str(k): str(v) for k, v in assignment["env"].items()})
    from trainguard.worker.bootstrap import die_with_agent

    die_with_agent()  # a rank now: it ends with the agent, as the ranks torch started do
    for fd, key in ((1, "stdout"), (2, "stderr")):
        path = assignment.get(key)
        if path:
            target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            os.dup2(target, fd)
            os.close(target)
    if os.environ.get("TRAINGUARD_AUTO") == "1" and os.environ.get("TRAINGUARD_AGENT_PID"):
        # The spare started with the hooks off (it had no rank yet); install them now, as the bootstrap
        # would have when the script imported torch.
        from trainguard.worker import autohooks
        from trainguard.worker.bootstrap import OWNER_ENV

        os.environ[OWNER_ENV] = str(os.getpid())
        autohooks.on_import("torch.distributed", sys.modules["torch.distributed"])
        autohooks.on_import("torch.optim", sys.modules["torch.optim"])


def main(argv: list[str]) -> int:
    module = bool(argv) and argv[0] == "-m"
    command = argv[1:] if module else argv
    if not command:
        print("usage: python -m trainguard.worker.warm [-m] SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    script = Path(command[0])
    if not module:
        sys.path[0] = str(script.resolve().parent)  # as `python script.py` would have it
    count = preload([*ALWAYS, *([] if module else top_level_imports(script))])
    print(f"warm spare {os.getpid()}: {count} modules loaded in {time.monotonic() - t0:.2f}s; waiting", flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return 0  # the agent closed our input: no rank for us
    _take_over(json.loads(line))
    sys.argv = list(command)
    if module:
        runpy.run_module(command[0], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
