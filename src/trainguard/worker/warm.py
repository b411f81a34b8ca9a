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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.core import protocol
from trainguard.torch_api.c10d import PREWARM_MODULES
from trainguard.worker import import_ranks

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
    """``os.environ`` that notes which variables were read (installed only while preloading).

    A variable read while the environment is being listed (``dict(os.environ)``, ``os.environ.items()``: tqdm and
    fsspec copy it whole at import) is not a read of that variable: code that scans for its own prefix would
    otherwise make every spare unfit. Reading a name directly (``os.environ.get("RANK")``) is."""

    def __init__(self, real: MutableMapping[str, str]) -> None:
        self.real = real
        self.readers: dict[str, set[str]] = {}
        """Variable -> the modules whose code read it (`_reader`)."""
        self._listed: set[str] = set()
        """Keys handed out by a listing and not yet looked up by it."""

    def __getitem__(self, key: str) -> str:
        if key in self._listed:
            self._listed.discard(key)
        else:
            self.readers.setdefault(key, set()).add(_reader())
        return self.real[key]

    def __setitem__(self, key: str, value: str) -> None:
        self.real[key] = value

    def __delitem__(self, key: str) -> None:
        del self.real[key]

    def __iter__(self) -> Iterator[str]:
        for key in list(self.real):
            self._listed.add(key)
            yield key

    def __len__(self) -> int:
        return len(self.real)

    def copy(self) -> dict[str, str]:
        return dict(self.real)


_PASSING_THROUGH = frozenset({"os", "_collections_abc", "collections.abc", __name__})
"""Modules whose frames only pass a read on (``os.getenv``, ``Mapping.get`` (its module calls itself
``collections.abc``), this watch)."""


def _reader() -> str:
    """The module whose code asked for the variable being read."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in _PASSING_THROUGH:
        frame = frame.f_back  # type: ignore[assignment]
    return str(frame.f_globals.get("__name__", "")) if frame is not None else ""


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


@dataclass(frozen=True)
class Preloaded:
    """What a spare loaded ahead, and whether it can stand in for a rank's cold start."""

    count: int
    """Modules imported."""
    unfit: str | None = None
    """Why this spare cannot take a rank warm (None: it can)."""
    culprits: tuple[str, ...] = ()
    """The script's top-level imports whose loading read a rank's variables: later spares leave them out."""


def preload_watched(modules: list[str]) -> Preloaded:
    """`preload` of the script's top-level ``modules`` with reads of the environment watched, one module at a
    time, so that the ones that read a rank's variables are named."""
    real = os.environ
    watched = _WatchedEnviron(real)
    culprits: list[str] = []
    reads: set[str] = set()
    count = 0
    # Swapped, not cleared: os.getenv and `from os import environ` after this point read this object.
    os.environ = watched  # type: ignore[assignment]  # noqa: B003
    try:
        for name in modules:
            watched.readers.clear()
            count += preload([name])
            rank_reads = {var: who for var, who in watched.readers.items() if var in RANK_VARIABLES}
            # Reads by a framework module that import_ranks can set again after the fork do not count.
            covered = {reader for who in rank_reads.values() for reader in who if import_ranks.covered(reader, real)}
            new = {var for var, who in rank_reads.items() if not who <= covered}
            if new:
                culprits.append(name)
                reads |= new
    finally:
        os.environ = real  # noqa: B003
    if reads:
        return Preloaded(count, f"a module read {', '.join(sorted(reads))} while loaded ahead", tuple(culprits))
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return Preloaded(count, "a module initialized CUDA while loaded ahead")
    return Preloaded(count)


def skipped_imports(env: MutableMapping[str, str]) -> set[str]:
    """The top-level imports the agent asked this spare to leave for after its takeover (`protocol.SPARE_SKIP_ENV`)."""
    return {m for m in env.get(protocol.SPARE_SKIP_ENV, "").split(",") if m}


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
    count, modules = preload_ahead(command, module, os.environ)
    found = preload_watched(modules)
    if found.unfit is not None:  # the agent reads this line: it leaves the culprits out of its next spares
        print(f"warm spare {os.getpid()}: {protocol.SPARE_UNFIT} {found.unfit}; skip={','.join(found.culprits)}",
              flush=True)
    print(f"warm spare {os.getpid()}: {count + found.count} modules loaded in {time.monotonic() - t0:.2f}s; "
          "waiting", flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return 0  # the agent closed our input: no rank for us
    run_as_rank(json.loads(line), command, module, found.unfit)
    return 0


def preload_ahead(command: list[str], module: bool, env: MutableMapping[str, str]) -> tuple[int, list[str]]:
    """What a spare (or the fork server) loads first for ``command``: `ALWAYS`, with the script's folder on the
    path. Returns how many imported and the script's top-level imports to load next, watched (`preload_watched`),
    less those ``env`` says to skip."""
    if not module:
        sys.path[0] = str(Path(command[0]).resolve().parent)  # as `python script.py` would have it
    count = preload(list(ALWAYS))
    skip = skipped_imports(env)
    return count, [] if module else [m for m in top_level_imports(Path(command[0])) if m not in skip]


def run_as_rank(assignment: dict[str, Any], command: list[str], module: bool, unfit: str | None) -> None:
    """Become the rank ``assignment`` describes and run the script as ``__main__`` in this interpreter (or, when
    ``unfit``, start its command afresh in this process)."""
    _take_over(assignment)
    if unfit is not None:
        _cold_start(command, module, unfit)
    import_ranks.refresh_loaded(os.environ)  # what the frameworks loaded ahead kept of the spare's rank
    _install_hooks()
    sys.argv = list(command)
    if module:
        runpy.run_module(command[0], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(command[0], run_name="__main__")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
