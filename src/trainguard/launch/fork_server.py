"""The agent's side of the fork server (`trainguard.worker.zygote`): start it, ask it for ranks, learn their exits.

One server per node loads torch and the script's imports once; every rank it is asked for is a fork of it,
ready in milliseconds, at the first start and at every restart alike. The ranks are the server's children, so
each is handed to torch as a `ForkedProcess`: a ``subprocess.Popen`` whose exit status comes from the server's
reports instead of the agent's own ``waitpid``. See docs/run.md ("Fork server") and decisions N16.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from trainguard.core.protocol import FORK_RESERVE_BYTES, FORK_RESERVE_ENV, SPARE_SKIP_ENV
from trainguard.launch.lifetime import die_with_parent_command, untagged_environ

log = logging.getLogger(__name__)

WORKER_ENV_DEFAULTS = {"TORCH_FR_BUFFER_SIZE": "2000", "OMP_NUM_THREADS": "1"}
"""Set for the workers unless the job sets them: the flight recorder on, one OpenMP thread per rank (torchrun's
own default). The server gets them too, before it loads torch: some are read when a library loads."""

REPORT_SECONDS = 2.0
"""How long `ForkedProcess.poll` waits for the server's report of a rank it sees has ended (milliseconds: the
server reaps it at once)."""
REPLY_SECONDS = 10.0
"""How long a request waits for the server's answer (a fork: milliseconds) before the rank starts cold."""


def preloader_command(module: str, worker_args: tuple[str, ...], *lead: str) -> list[str]:
    """``python -u -m MODULE LEAD... SCRIPT ARGS...`` with the workers' interpreter, dying with this process
    (`die_with_parent_command`): a warm spare (`trainguard.worker.warm`) or the fork server. ``worker_args`` are
    the worker's arguments after the interpreter (``-u script.py ...`` or ``-u -m module ...``)."""
    rest = list(worker_args[1:] if worker_args[:1] == ("-u",) else worker_args)  # keep a script's own "-u"
    python = os.environ.get("PYTHON_EXEC", sys.executable)  # the workers' interpreter (`worker_entry`)
    return die_with_parent_command(python, ["-u"], module, [*lead, *rest])


def preloader_environ(skip: tuple[str, ...]) -> dict[str, str]:
    """The environment of a warm spare or the fork server: this process's less the run's process tag, trainguard's
    automatic hooks off until a rank is taken, and the script's imports to leave for after it (`SPARE_SKIP_ENV`)."""
    return {**untagged_environ(), "TRAINGUARD_AUTO": "0", SPARE_SKIP_ENV: ",".join(skip)}


class ForkedProcess(subprocess.Popen[bytes]):
    """A rank forked by the fork server, with the part of ``Popen``'s interface torch's process context and the
    agent use (``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``)."""

    def __init__(self, pid: int, args: list[str], server: ForkServer) -> None:
        # Popen's own __init__ would start a process: only the attributes its other methods read are set.
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None
        self._child_created = False  # Popen.__del__ reads it: nothing of ours to reap
        self._server = server
        self._ended = threading.Event()
        try:
            self._pidfd: int | None = os.pidfd_open(pid)  # readable once it has ended, child of ours or not
        except OSError:
            self._pidfd = None  # already reaped: its report is on its way

    def _exited(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)
        self._ended.set()

    def _gone(self) -> bool:
        """Whether the process has ended, reported or not (its pidfd is readable)."""
        if self._pidfd is None:
            return True
        watch = select.poll()
        watch.register(self._pidfd, select.POLLIN)
        return bool(watch.poll(0))

    def poll(self) -> int | None:
        # As with a child's waitpid, an exit is seen the moment it happens, not when the server's report is read:
        # the agent's own look at its ranks and torch's poll right after it must agree on who had ended (a report
        # read in between made torch's close of a survivor look like a second crash).
        if self.returncode is None and self._gone():
            self._ended.wait(REPORT_SECONDS)
        if self.returncode is None and not self._server.running() and not self._server.reading():
            # The server is gone and said nothing more: its children died with it (parent-death signal).
            self.returncode = -signal.SIGKILL
            self._ended.set()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._ended.wait(0.5 if left is None else min(left, 0.5))  # 0.5 s: a check that the server lives
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # once its exit is reported the pid may be another process's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def __del__(self) -> None:  # Popen's would reap a child of ours; this one is not
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = None


class ForkServer:
    """One node's fork server: `start` it, `wait_ready` (or check `ready`), then `spawn` ranks."""

    def __init__(self, args: tuple[str, ...], log_dir: Path, skip: tuple[str, ...] = (),
                 tag: dict[str, str] | None = None) -> None:
        self.args = args
        """The worker's arguments after the interpreter (``-u script.py ...`` or ``-u -m module ...``)."""
        self.log_dir = log_dir
        self.tag = tag or {}
        """The run's process marker for the server (`trainguard.launch.lifetime.ProcessTracker.server_environ`)."""
        self.skip = skip
        """The script's top-level imports left for after the fork (an earlier server found they read a rank's
        variables while loaded ahead)."""
        self.proc: subprocess.Popen[bytes] | None = None
        self.hello: dict[str, Any] | None = None
        """The server's first report: ``ready``, ``unfit`` (why not), ``skip`` (the imports to blame)."""
        self._ready = threading.Event()  # set by the hello, or when the server ended without one
        self._replies: dict[int, int] = {}
        self._replied = threading.Condition()
        self._children: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}  # exits reported before their process object was made
        self._next = 0
        self._lock = threading.Lock()  # one request on the pipe at a time
        self._reader: threading.Thread | None = None
        self._exits = threading.Event()
        """Set when a rank's exit is reported (or the server's reports end): wakes the agent's monitor round."""

    def command(self, reply_fd: int) -> list[str]:
        return preloader_command("trainguard.worker.zygote", self.args, str(reply_fd))

    def start(self) -> None:
        """Start the server (from the main thread: its parent-death signal fires when the starting thread ends)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        read_fd, write_fd = os.pipe()
        env = {**WORKER_ENV_DEFAULTS, **preloader_environ(self.skip), **self.tag,
               FORK_RESERVE_ENV: " " * FORK_RESERVE_BYTES}
        path = self.log_dir / "fork-server.log"
        try:
            with open(path, "ab") as out:
                self.proc = subprocess.Popen(self.command(write_fd), stdin=subprocess.PIPE, stdout=out,
                                             stderr=subprocess.STDOUT, env=env, pass_fds=(write_fd,),
                                             start_new_session=True)
        finally:
            os.close(write_fd)
        self._reader = threading.Thread(target=self._read, args=(read_fd,), name="fork-server-reader", daemon=True)
        self._reader.start()
        log.info("fork server started: pid %d", self.proc.pid)

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as replies:
            for line in replies:
                try:
                    record = json.loads(line)
                except ValueError:
                    log.warning("fork server: unreadable report %r", line[:200])
                    continue
                self._handle(record)
        self._ready.set()
        self._exits.set()
        with self._replied:
            self._replied.notify_all()

    def _handle(self, record: dict[str, Any]) -> None:
        if "probe" in record:
            log.warning("fork server: %s: %s now load after the fork (torch stays loaded ahead)", record.get("unfit"),
                        ", ".join(map(str, record.get("skip") or ())))
        elif "ready" in record:
            self.hello = record
            self._ready.set()
        elif "pid" in record:
            with self._replied:
                self._replies[int(record["id"])] = int(record["pid"])
                self._replied.notify_all()
        elif "exit" in record:
            pid, status = int(record["exit"]), int(record["status"])
            with self._replied:
                child = self._children.pop(pid, None)
                if child is None:
                    self._early[pid] = status
            if child is not None:
                child._exited(status)
            self._exits.set()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout: float) -> bool:
        """Block until a rank's exit is reported (True) or ``timeout`` passed (False)."""
        if self._exits.wait(timeout):
            self._exits.clear()  # an exit reported meanwhile is still seen: the round polls every rank
            return True
        return False

    def reading(self) -> bool:
        """Whether reports may still come (the pipe back is open)."""
        return self._reader is not None and self._reader.is_alive()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the server has loaded its imports (or ended); True when it can serve."""
        self._ready.wait(timeout)
        return self.ready()

    def ready(self) -> bool:
        return self.hello is not None and bool(self.hello.get("ready")) and self.running()

    def starting(self) -> bool:
        """Still loading: started, alive, no report yet."""
        return self.hello is None and self.running()

    def spawn(self, env: dict[str, str], stdout: str | None, stderr: str | None) -> ForkedProcess | None:
        """A rank forked with ``env`` (its full environment) and its log files; None when the server cannot
        serve (the rank then starts cold)."""
        if not self.ready() or self.proc is None or self.proc.stdin is None or not stdout or not stderr:
            return None  # without log files the rank writes where the agent does: only a cold start does that
        with self._lock:
            self._next += 1
            ident = self._next
            line = json.dumps({"id": ident, "env": env, "stdout": stdout, "stderr": stderr}) + "\n"
            try:
                self.proc.stdin.write(line.encode())
                self.proc.stdin.flush()
            except OSError:  # it died
                return None
            deadline = time.monotonic() + REPLY_SECONDS
            with self._replied:
                while ident not in self._replies and self.reading() and time.monotonic() < deadline:
                    self._replied.wait(max(0.0, deadline - time.monotonic()))
                pid = self._replies.pop(ident, None)
                if pid is None:
                    log.warning("fork server: no answer to a request; the rank starts cold")
                    return None
                child = ForkedProcess(pid, self.command(0), self)
                early = self._early.pop(pid, None)
                if early is None:
                    self._children[pid] = child
        if early is not None:
            child._exited(early)
        return child

    def close(self, grace_seconds: float) -> None:
        """End the server (its children, if any still run, die with it)."""
        if self.proc is None:
            return
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(grace_seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
