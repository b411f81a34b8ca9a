"""The fork server: one interpreter that loads torch and the script's imports once, then forks every rank.

The agent starts it as ``python -u -m trainguard.worker.zygote FD [-m] SCRIPT ARGS...`` (through the bootstrap
that first makes it die with the agent), with its stdin a pipe of requests and ``FD`` a pipe back. It loads
what a warm spare loads: torch, then, in a forked child that serves, the script's top-level imports, watched
(`_load`: a module that reads a rank's variables is left for after the fork, at the cost of loading the others
once more, never torch). The serving process says so on ``FD`` as one JSON line (``{"ready": ...}``, or why it
cannot serve; ``{"probe": ...}`` before it when a module was left out). Then each request line, ``{"id": N,
"env": {...}, "stdout": path, "stderr": path}``, is answered at once with ``{"id": N, "pid": P}``: a forked child
that becomes that rank
(its own session, its environment and log files, the script run as ``__main__``) with torch already loaded.
When a child ends, ``{"exit": P, "status": S}`` (the raw wait status) follows; the agent knows its ranks'
exits only from these lines, since the children are this process's, not the agent's. End of input (the agent
went away or is done) ends the server; its children die with it (parent-death signal), as ranks die with
their agent. See docs/run.md ("Fork server") and decisions N16.
"""

from __future__ import annotations

import gc
import json
import os
import select
import sys
import time
from pathlib import Path
from typing import Any

from trainguard.core import protocol
from trainguard.worker import warm
from trainguard.worker.bootstrap import die_with_parent


def show_environment(env: dict[str, str], start: dict[str, str]) -> bool:
    """Make ``/proc/<pid>/environ`` of this forked rank show its own variables (``RANK``, the run's process tag):
    the kernel shows the memory where the server's start-up environment was, whatever ``os.environ`` holds now.
    Those of ``env`` that differ from ``start`` are written over the `protocol.FORK_RESERVE_ENV` variable, after
    the server's own ones (readers that keep the last of a repeated name see the rank's); the rest of that memory
    is left as it was, since a library may still point into it. False when there is no room (nothing is written)."""
    try:
        fields = Path("/proc/self/stat").read_bytes().rsplit(b")", 1)[1].split()
        begin, end = int(fields[47]), int(fields[48])  # env_start, env_end (fields 50 and 51)
        import ctypes

        block = ctypes.string_at(begin, end - begin)
    except (OSError, IndexError, ValueError):
        return False
    mark = block.find(b"\0" + protocol.FORK_RESERVE_ENV.encode() + b"=")
    if mark < 0:
        return False
    stop = block.find(b"\0", mark + 1)
    room = (stop if stop >= 0 else len(block)) - mark - 1
    own = b"".join(f"{k}={v}".encode(errors="surrogateescape") + b"\0" for k, v in env.items() if start.get(k) != v)
    if len(own) > room:
        return False
    ctypes.memmove(begin + mark + 1, own + b"\0" * (room - len(own)), room)
    return True


def _send(fd: int, record: dict[str, Any]) -> None:
    data = (json.dumps(record) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def _become_child(reply_fd: int, pidfds: dict[int, int], parent: int) -> None:
    """In a freshly forked child: its own session (torch stops a rank by its process group), death with the
    server, none of the server's descriptors, and the entropy a cold interpreter would have."""
    os.setsid()
    die_with_parent(parent)
    for fd in (reply_fd, *pidfds.values()):
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # a cold rank's stdin is not the server's request pipe
    os.close(null)
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:  # Python's `random` reseeds itself after a fork; numpy's global state does not
        numpy_random.seed()


def serve(reply_fd: int) -> dict[str, Any] | None:
    """Answer requests until end of input (None, in the server) or until this process is a forked child (its
    assignment, returned in the child only)."""
    parent = os.getpid()
    pidfds: dict[int, int] = {}  # child pid -> pidfd: readable once it has ended
    buffer = b""
    stdin = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([stdin, *pidfds.values()], [], [])
        for pid, fd in list(pidfds.items()):
            if fd in readable:
                _, status = os.waitpid(pid, 0)
                os.close(fd)
                del pidfds[pid]
                _send(reply_fd, {"exit": pid, "status": status})
        if stdin not in readable:
            continue
        chunk = os.read(stdin, 1 << 16)
        if not chunk:
            return None
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            # The server's objects (torch, the script's imports) go to the collector's permanent generation:
            # a rank's collections, and the ones at its interpreter's exit, no longer walk them, each of which
            # wrote into every inherited page (a forked rank took 1.3 s to exit normally, 0.3 s with this).
            gc.freeze()
            pid = os.fork()
            if pid == 0:
                _become_child(reply_fd, pidfds, parent)
                return dict(request)
            pidfds[pid] = os.pidfd_open(pid)
            _send(reply_fd, {"id": request["id"], "pid": pid})


def _load(command: list[str], module: bool, reply_fd: int) -> tuple[int, warm.Preloaded]:
    """Load torch here, then the script's imports in a forked child that will serve: if they read a rank's
    variables, that child names the modules and ends, and another child loads the rest (once), so the script's
    own modules are loaded again but torch never is. This process then waits for the serving child and ends with
    it. Returns (count of `warm.ALWAYS` modules, what the serving process loaded) in the process that serves."""
    count, modules = warm.preload_ahead(command, module, os.environ)
    if not modules:
        return count, warm.preload_watched([])  # still the CUDA check
    for round_ in range(2):
        read_fd, write_fd = os.pipe()
        parent = os.getpid()
        child = os.fork()
        if child == 0:
            os.close(read_fd)
            die_with_parent(parent)
            found = warm.preload_watched(modules)
            _send(write_fd, {"unfit": found.unfit, "culprits": list(found.culprits)})
            os.close(write_fd)
            if found.unfit is None:
                return count, found
            os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as verdict_pipe:
            raw = verdict_pipe.read()
        verdict: dict[str, Any] = json.loads(raw) if raw.strip() else {"unfit": "loading the script's imports "
                                                                               "ended the process", "culprits": []}
        if verdict["unfit"] is None:  # that child serves; this process only waits for it
            _, status = os.waitpid(child, 0)
            os._exit(max(0, os.waitstatus_to_exitcode(status)))
        os.waitpid(child, 0)
        culprits = [m for m in verdict["culprits"] if m in modules]
        if not culprits or round_:
            return count, warm.Preloaded(0, verdict["unfit"], tuple(culprits))
        print(f"fork server {os.getpid()}: {protocol.SPARE_UNFIT} {verdict['unfit']}; skip={','.join(culprits)}",
              flush=True)
        _send(reply_fd, {"probe": True, "unfit": verdict["unfit"], "skip": culprits})
        modules = [m for m in modules if m not in culprits]
    raise AssertionError("unreachable")  # the second round always returns


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m trainguard.worker.zygote FD [-m] SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    reply_fd = int(argv[0])
    start = dict(os.environ)  # as the kernel keeps it for /proc/<pid>/environ (`show_environment`)
    module = argv[1] == "-m"
    command = argv[2:] if module else argv[1:]
    t0 = time.monotonic()
    count, found = _load(command, module, reply_fd)
    seconds = round(time.monotonic() - t0, 3)
    if found.unfit is not None:
        print(f"fork server {os.getpid()}: {protocol.SPARE_UNFIT} {found.unfit}; skip={','.join(found.culprits)}",
              flush=True)
    else:
        print(f"fork server {os.getpid()}: {count + found.count} modules loaded in {seconds:.2f}s; serving",
              flush=True)
    _send(reply_fd, {"ready": found.unfit is None, "unfit": found.unfit, "skip": list(found.culprits),
                     "modules": count + found.count, "seconds": seconds})
    if found.unfit is not None:
        return 0  # its forks would start cold: the agent turns the server off and keeps warm spares
    assignment = serve(reply_fd)
    if assignment is None:
        return 0
    env = {str(k): str(v) for k, v in assignment["env"].items()}
    if not show_environment(env, start):
        print("trainguard: /proc/<pid>/environ of this rank shows the fork server's environment", file=sys.stderr)
    warm.run_as_rank(assignment, command, module, None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
