"""A warm spare worker: a process that has imported torch (and the script's imports) and waits for a rank.

The agent starts it as ``python -u -m trainguard.worker.warm [-m] SCRIPT ARGS...`` with its stdin a pipe,
through a bootstrap that first makes it die with the agent (`trainguard.launch.lifetime.DIE_WITH_PARENT`).
It imports what the script imports at its top level, then blocks reading one JSON line from stdin:
``{"env": {...}, "stdout": path, "stderr": path}``, the environment and log files of the rank it replaces.
It takes them on and runs the script as ``__main__`` in this interpreter, so the rank skips the seconds of
importing torch. End of input (the agent went away) ends the spare. See docs/run.md ("Warm spares").

A module that reads a rank's variables (``RANK``, ``LOCAL_RANK``, ...) while it is loaded ahead, or that
initializes CUDA, would keep what it saw in the spare; such a spare becomes the rank by starting the
command afresh in its place (`os.execv`: same process, a cold start) and says so in one line.
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
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

from trainguard.torch_api.c10d import PREWARM_MODULES

log = logging.getLogger(__name__)

ALWAYS = ("torch", "torch.distributed", "torch.optim", "torch.distributed.checkpoint", *PREWARM_MODULES,
          "trainguard.worker.library", "trainguard.worker.inprocess", "trainguard.checkpoint")
"""Imported by every spare, whatever the script. `PREWARM_MODULES` (about 2 s here) is what the first
flight-recorder dump with stack frames and ``torch.use_deterministic_algorithms`` import: every rank under
trainguard loads it soon after its first step anyway."""


RANK_VARIABLES = frozenset({
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
    "CUDA_VISIBLE_DEVICES", "TRAINGUARD_ATTEMPT"})
"""Variables that differ between ranks or attempts: a module that reads one while loaded ahead is not
warm-startable (it would keep the spare's value, not its rank's)."""


class _WatchedEnviron(MutableMapping[str, str]):
    """``os.environ`` that notes which variables were read (installed only while preloading)."""

    def __init__(self, real: MutableMapping[str, str]) -> None:
        self.real = real
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return self.real[key]

    def __setitem__(self, key: str, value: str) -> None:
        self.real[key] = value

    def __delitem__(self, key: str) -> None:
        del self.real[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.real)

    def __len__(self) -> int:
        return len(self.real)

    def copy(self) -> dict[str, str]:
        return dict(self.real)


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


def preload_watched(modules: list[str]) -> tuple[int, str | None]:
    """`preload` with reads of the environment watched: how many imported, and why this spare cannot stand in
    for a rank's cold start (None: it can)."""
    real = os.environ
    watched = _WatchedEnviron(real)
    # Swapped, not cleared: os.getenv and `from os import environ` after this point read this object.
    os.environ = watched  # type: ignore[assignment]  # noqa: B003
    try:
        count = preload(modules)
    finally:
        os.environ = real  # noqa: B003
    rank_reads = sorted(watched.read & RANK_VARIABLES)
    if rank_reads:
        return count, f"a module read {', '.join(rank_reads)} while loaded ahead"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return count, "a module initialized CUDA while loaded ahead"
    return count, None


def _cold_start(command: list[str], module: bool, why: str) -> None:
    """Become the rank by starting its command afresh in this process (the agent already holds our pid)."""
    print(f"trainguard: warm start not possible ({why}): cold start", file=sys.stderr, flush=True)
    python = sys.executable
    os.execv(python, [python, "-u", *(["-m"] if module else []), *command])


def _take_over(assignment: dict[str, Any]) -> None:
    """Become the rank: its environment, its log files, trainguard's automatic hooks if the agent wants them."""
    os.environ.clear()  # exactly a cold worker's environment, nothing left of the spare's
    os.environ.update({str(k): str(v) for k, v in assignment["env"].items()})
    from trainguard.worker.bootstrap import die_with_agent

    die_with_agent()  # a rank now: it ends with the agent, as the ranks torch started do
    for fd, key in ((1, "stdout"), (2, "stderr")):
        path = assignment.get(key)
        if path:
            target = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
            os.dup2(target, fd)
            os.close(target)


def _install_hooks() -> None:
    """trainguard's automatic hooks and framework adapters, when the agent wants them for this rank."""
    from trainguard.worker import bootstrap

    if not bootstrap.enabled():
        return
    # The spare started with the hooks off (it had no rank yet): install the finder for what the script
    # imports from now on, and run the hooks of the watched modules the spare already loaded (torch's, and
    # a framework's trainer when the script imports it at its top level), as their import would have.
    os.environ[bootstrap.OWNER_ENV] = str(os.getpid())
    bootstrap.install()
    for name in bootstrap.watched():
        module = sys.modules.get(name)
        if module is not None:
            bootstrap.run_hooks(name, module)


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
    count = preload(list(ALWAYS))
    more, unfit = preload_watched([] if module else top_level_imports(script))
    print(f"warm spare {os.getpid()}: {count + more} modules loaded in {time.monotonic() - t0:.2f}s; waiting",
          flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return 0  # the agent closed our input: no rank for us
    _take_over(json.loads(line))
    if unfit is not None:
        _cold_start(command, module, unfit)
    _install_hooks()
    sys.argv = list(command)
    if module:
        runpy.run_module(command[0], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
