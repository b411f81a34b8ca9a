"""The fork server: one interpreter that loads torch and the script's imports once, then forks every rank.

The agent starts it as ``python -u -m trainguard.worker.zygote FD [-m] SCRIPT ARGS...`` (through the bootstrap
that first makes it die with the agent), with its stdin a pipe of requests and ``FD`` a pipe back. It loads
what a warm spare loads (`trainguard.worker.warm.preload_for`) and says so on ``FD`` as one JSON line
(``{"ready": ...}``, or why it cannot serve). Then each request line, ``{"id": N, "env": {...}, "stdout": path,
"stderr": path}``, is answered at once with ``{"id": N, "pid": P}``: a forked child that becomes that rank
(its own session, its environment and log files, the script run as ``__main__``) with torch already loaded.
When a child ends, ``{"exit": P, "status": S}`` (the raw wait status) follows; the agent knows its ranks'
exits only from these lines, since the children are this process's, not the agent's. End of input (the agent
went away or is done) ends the server; its children die with it (parent-death signal), as ranks die with
their agent. See docs/run.md ("Fork server") and decisions N16.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from pathlib import Path
from typing import Any

from trainguard.core import protocol
from trainguard.worker import warm

PDEATHSIG = 1
"""``prctl`` option: the signal a process gets when its parent dies (``PR_SET_PDEATHSIG``)."""


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
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PDEATHSIG, 9, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the server died between the fork and the call
        os._exit(1)
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
            pid = os.fork()
            if pid == 0:
                _become_child(reply_fd, pidfds, parent)
                return dict(request)
            pidfds[pid] = os.pidfd_open(pid)
            _send(reply_fd, {"id": request["id"], "pid": pid})


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m trainguard.worker.zygote FD [-m] SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    reply_fd = int(argv[0])
    start = dict(os.environ)  # as the kernel keeps it for /proc/<pid>/environ (`show_environment`)
    module = argv[1] == "-m"
    command = argv[2:] if module else argv[1:]
    t0 = time.monotonic()
    count, found = warm.preload_for(command, module, os.environ)
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
        return 0  # its forks would start cold: the agent starts another server without the culprits, or none
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
