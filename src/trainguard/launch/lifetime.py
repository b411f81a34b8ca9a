"""No process outlives its job: a marker in every worker's environment, sweeps, and a lifeline.

Every process the agent starts for a run carries ``TRAINGUARD_PROCESS_TAG=<token>.<attempt>`` in its
environment, and so does everything those processes start (a data loader, a ``setsid`` helper, a shell
script's children), unless a program clears its environment on purpose. The token is random per agent
process. `ProcessTracker` finds them by reading ``/proc/<pid>/environ`` of this user's processes:

* at the end of each attempt and after every stop of the workers, tagged processes that are no longer
  descendants of the agent (their worker died, or they detached with ``setsid`` and a double fork) are
  SIGKILLed: stopping a worker's process group cannot reach a child that left the worker's session;
* at the end of the run, every tagged process is;
* when the agent itself dies, even by SIGKILL, its *lifeline* does it: a small process started at the
  beginning of the run in its own session, blocked reading a pipe from the agent. The kernel closes the
  pipe when the agent dies however it dies; the lifeline then sweeps every tagged process and exits.

Workers of auto-instrumented Python scripts also ask the kernel to SIGKILL them when the agent dies
(``PR_SET_PDEATHSIG``, `trainguard.worker.bootstrap.die_with_agent`); the lifeline covers everything
else (``--no-python`` programs, ``--no-auto-instrument``, the workers' own children). Python processes the
agent starts that are not workers (warm spares) carry no tag: they start through `die_with_parent_command`,
which sets ``PR_SET_PDEATHSIG`` before anything is imported.

Kills go through a pidfd opened before the tag is checked again, so a pid reused between the scan and the
kill is never signalled. Only processes of this user are read; others' environments are not readable and
their processes are not ours to end.

This file imports only the standard library: the lifeline runs it by path (``python -I -S lifetime.py``)
without importing trainguard.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import time

log = logging.getLogger(__name__)

TAG_ENV = "TRAINGUARD_PROCESS_TAG"
"""The environment variable that marks a run's processes: ``<token>.<attempt>``."""


DIE_WITH_PARENT = """\
import os, sys
if sys.platform.startswith("linux"):
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass
if os.getppid() != int(sys.argv[1]):
    os._exit(0)
import runpy
del sys.argv[:2]
sys.path[0] = os.getcwd()
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""
"""``python -c`` source run as ``-c DIE_WITH_PARENT <parent pid> MODULE ARGS...``: ``python -m MODULE ARGS...``
that first has the kernel SIGKILL it when its parent dies (Linux; elsewhere only the parent check). The
parent is checked after the call: one that died between the fork and the call would never signal. Only
``os`` and ``sys`` (already loaded by the interpreter) and ``ctypes`` come before the call, so a process
whose imports take seconds (torch, a script's modules) cannot outlive its parent while it imports."""


def die_with_parent_command(python: str, flags: list[str], module: str, args: list[str]) -> list[str]:
    """``python FLAGS -m MODULE ARGS`` as a child of this process that dies with it, by SIGKILL too
    (`DIE_WITH_PARENT`). The kernel signals when the *thread* that forked the child ends: start it from a
    thread that lives as long as the process (the main thread)."""
    return [python, *flags, "-c", DIE_WITH_PARENT, str(os.getpid()), module, *args]


def untagged_environ() -> dict[str, str]:
    """This process's environment without the run's process tag: for a process that must not be swept with
    the workers (the lifeline itself, a node's checkpoint-memory holder), and ends itself with the job."""
    return {k: v for k, v in os.environ.items() if k != TAG_ENV}


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _carries(pid: int, needle: bytes) -> bool:
    """Whether the environment of ``pid`` holds ``TRAINGUARD_PROCESS_TAG=<token>.`` (``needle``)."""
    env = _read(f"/proc/{pid}/environ")
    return env is not None and (env.startswith(needle) or b"\0" + needle in env)


def _ppid(pid: int) -> int | None:
    data = _read(f"/proc/{pid}/stat")
    if data is None:
        return None
    rest = data[data.rfind(b")") + 2:].split()  # the command name may hold spaces and parentheses
    if len(rest) < 2 or rest[0] in (b"Z", b"X"):  # a zombie runs nothing: nothing to end
        return None
    return int(rest[1])


def _pids() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return []


def tagged(token: str, exclude: frozenset[int] = frozenset()) -> dict[int, int]:
    """pid -> parent pid of this user's live processes that carry ``token``."""
    needle = f"{TAG_ENV}={token}.".encode()
    uid = os.getuid()
    out: dict[int, int] = {}
    for pid in _pids():
        if pid in exclude or pid == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        if _carries(pid, needle):
            ppid = _ppid(pid)
            if ppid is not None:
                out[pid] = ppid
    return out


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` in the process tree."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        ppid = _ppid(pid)
        if ppid is not None:
            children.setdefault(ppid, []).append(pid)
    out: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def kill_tagged(pids: list[int], token: str) -> list[int]:
    """SIGKILL each of ``pids`` that still carries ``token`` (checked after a pidfd pinned the process)."""
    needle = f"{TAG_ENV}={token}.".encode()
    killed = []
    for pid in pids:
        if not hasattr(os, "pidfd_open"):  # Linux < 5.3 or another system: a plain kill after the check
            if _carries(pid, needle):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            continue
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already
            continue
        try:
            if _carries(pid, needle):  # the pidfd holds the process: this is the one that carries the tag
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                killed.append(pid)
        except OSError:
            pass
        finally:
            os.close(fd)
    return killed


class ProcessTracker:
    """One agent's marker, its sweeps, and its lifeline."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token or secrets.token_hex(8)
        self.agent_pid = os.getpid()
        self._lifeline: subprocess.Popen[bytes] | None = None
        self.swept: list[int] = []
        """Every process a sweep of this tracker ended."""

    def environ(self, attempt: int) -> dict[str, str]:
        """The marker for the workers of ``attempt`` (added to their environment)."""
        return {TAG_ENV: f"{self.token}.{attempt}"}

    def server_environ(self) -> dict[str, str]:
        """The marker of the fork server (`trainguard.launch.fork_server`). Its forked ranks keep the environment
        the server was started with in ``/proc/<pid>/environ`` whatever ``os.environ`` they take, so this is the
        tag the sweeps find them (and a data loader they fork) by: within the agent's tree they are left alone
        until the end of the run, as every worker is."""
        return {TAG_ENV: f"{self.token}.server"}

    def _exclude(self) -> frozenset[int]:
        return frozenset({self.agent_pid, *([self._lifeline.pid] if self._lifeline is not None else [])})

    def sweep(self, *, orphans_only: bool = True) -> list[int]:
        """SIGKILL this run's processes that left the agent's process tree (``orphans_only``), or all of them
        (the end of the run). Returns the pids ended. Never raises: this runs on every stop path."""
        try:
            found = tagged(self.token, self._exclude())
            if orphans_only and found:
                found = {p: pp for p, pp in found.items() if p not in descendants(self.agent_pid)}
            if not found:
                return []
            killed = kill_tagged(sorted(found), self.token)
        except Exception as exc:  # a sweep must never stand in the way of the stop it follows
            log.warning("could not look for leftover processes of this run: %s", exc)
            return []
        if killed:
            self.swept.extend(killed)
            log.warning("ended %d process(es) of this run that outlived their worker: pid %s", len(killed),
                        ", ".join(map(str, killed)))
        return killed

    def start_lifeline(self) -> None:
        """Start the process that sweeps this run's processes when the agent dies (any way it dies)."""
        if self._lifeline is not None or not sys.platform.startswith("linux"):
            return
        env = untagged_environ()
        try:
            self._lifeline = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), "--lifeline", self.token],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                start_new_session=True)  # terminal signals and group kills of the agent do not reach it
        except OSError as exc:
            log.warning("no lifeline (workers may outlive an agent killed with SIGKILL): %s", exc)

    def close(self) -> list[int]:
        """The end of the run: sweep every tagged process, then let the lifeline go."""
        killed = self.sweep(orphans_only=False)
        lifeline, self._lifeline = self._lifeline, None
        if lifeline is not None:
            with contextlib.suppress(OSError):
                if lifeline.stdin is not None:
                    lifeline.stdin.close()  # it sweeps once more (nothing left) and exits
            try:
                lifeline.wait(timeout=5)
            except subprocess.TimeoutExpired:
                lifeline.kill()
                lifeline.wait()
        return killed


def _lifeline_main(token: str) -> int:
    """Block until the agent's end of the pipe closes (the agent ended or died), then end its processes."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        while os.read(0, 4096):
            pass
    for _ in range(3):  # processes forked while the first pass ran are found by the next
        found = tagged(token)
        if not found:
            break
        kill_tagged(sorted(found), token)
        time.sleep(0.05)
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["--lifeline"] and len(sys.argv) == 3:
    sys.exit(_lifeline_main(sys.argv[2]))
