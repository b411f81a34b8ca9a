"""The rank's control thread: answers the node agent's evidence requests while training runs or hangs.

It listens on a Linux abstract Unix socket named after the process id (``\\0trainguard-<pid>``), so the
agent, which knows its workers' pids, reaches each rank without any file or port to agree on. A gloo
collective waits with the GIL released, so this thread runs while the main thread is blocked in one.
Requests and replies are one JSON object per line.

Abstract sockets have no file permissions: any local process can bind a name or connect. So the kernel's
record of the peer (``SO_PEERCRED``) decides on both ends: the rank serves only this user's agent process
(``TRAINGUARD_AGENT_PID``), anyone else is disconnected before a byte is read; the agent talks only to a
listener created by the expected worker pid under its own uid. A rank whose name is already taken binds
``\\0trainguard-<pid>-<random>`` instead, which the agent finds in ``/proc/net/unix`` and checks the same way.
A reply of the wrong shape is dropped (`parse_reply`): it is evidence of nothing.
Requests are bounded (4 KiB, 2 s) and each accepted connection is served by its own short-lived thread, so
a stuck client cannot starve the agent. Dumps go only into the evidence folder fixed at worker start (see
`trainguard.core.safefs`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainguard.core.protocol import PROCESS_STATE_FILE, fr_trace_name, stacks_name
from trainguard.core.safefs import open_private_dir, write_file_at

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 4096
"""A request longer than this (without its newline) is dropped."""
REQUEST_DEADLINE_SECONDS = 2.0
"""Time a client has, from its connection being accepted, to send its whole request line."""
MAX_HANDLERS = 4
"""Connections served at once; more are closed at once (only the agent gets this far)."""
MAX_REPLY_BYTES = 1 << 20
MAX_ALTERNATES = 256
"""Alternative names of one pid the agent checks; more (someone else's squatting) are not looked at."""

_PEERCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}


def socket_name(pid: int) -> str:
    """Abstract-namespace socket address of the rank with this pid."""
    return f"\0trainguard-{pid}"


def alternate_names(pid: int) -> list[str]:
    """Abstract names ``\\0trainguard-<pid>-<suffix>`` that exist now (from ``/proc/net/unix``), where a rank
    whose own name was taken listens instead; whose they are is checked at connect (`connect_checked`)."""
    prefix = f"@trainguard-{pid}-"
    found: list[str] = []
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 8 and fields[-1].startswith(prefix) and fields[-1] not in found:
                    found.append(fields[-1])
    except OSError:
        return []
    return ["\0" + name[1:] for name in found[:MAX_ALTERNATES]]


def _bind_own_name(sock: socket.socket) -> str:
    """Bind ``sock`` to this process's name, or to a random alternative when someone else holds it."""
    import errno
    import secrets

    try:
        sock.bind(socket_name(os.getpid()))
        return socket_name(os.getpid())
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
    name = f"{socket_name(os.getpid())}-{secrets.token_hex(8)}"
    sock.bind(name)
    log.warning("control: the channel name of pid %d was taken by another process; listening under another",
                os.getpid())
    return name


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """``(pid, uid, gid)`` of the process at the other end of a connected Unix socket, from the kernel."""
    pid, uid, gid = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return pid, uid, gid


def format_all_stacks() -> str:
    """All Python threads' stacks, main thread first, like py-spy's dump."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()
    main_id = threading.main_thread().ident
    lines = [f"# pid {os.getpid()} at {time.time():.3f}\n"]
    for ident in sorted(frames, key=lambda i: (i != main_id, i)):
        lines.append(f"\nThread {ident} ({names.get(ident, '?')}):\n")
        lines.extend(traceback.format_stack(frames[ident]))
    return "".join(lines)


def torch_ready() -> bool:
    """Whether torch is imported and done initializing (touching it mid-import would wait on its import lock)."""
    torch = sys.modules.get("torch")
    dist = sys.modules.get("torch.distributed")
    if torch is None or dist is None:
        return False
    return not any(getattr(getattr(m, "__spec__", None), "_initializing", False) for m in (torch, dist))


def dump_flight_recorder(with_stack_traces: bool = True) -> bytes | None:
    """The flight recorder's buffer as torch's pickle, or None when torch.distributed is not up."""
    if not torch_ready():
        return None
    try:
        import torch.distributed as dist

        from trainguard.torch_api.c10d import dump_flight_recorder as torch_dump

        if not dist.is_available() or not dist.is_initialized():
            return None
        # CUDA builds keep NCCL collectives in NCCL's own recorder: torch_api picks it for the NCCL backend.
        return torch_dump("pickle", backend=dist.get_backend(), stack_traces=with_stack_traces)
    except Exception as exc:
        log.warning("flight-recorder dump failed: %s", exc)
        return None


def write_evidence(directory: Path, rank: int, *, preface: str = "") -> dict[str, Any]:
    """Write ``stacks_rank_<r>.txt`` (after ``preface``) and ``fr_trace_rank_<r>.pkl`` into ``directory``."""
    dfd = open_private_dir(directory)
    try:
        written: list[str] = []
        write_file_at(dfd, stacks_name(rank), (preface + format_all_stacks()).encode())
        written.append(stacks_name(rank))
        fr = dump_flight_recorder()
        if fr is not None:
            write_file_at(dfd, fr_trace_name(rank), fr)
            written.append(fr_trace_name(rank))
    finally:
        os.close(dfd)
    return {"ok": True, "files": written}


class ControlThread:
    """Daemon thread serving ``dump`` and ``ping`` requests on the rank's control socket.

    ``status`` returns the rank's ``{"step", "steps_done", "phase"}``; ``evidence_dir`` is the only folder
    dumps go to; ``agent_pid`` is the only process served (besides this user's uid check); ``prewarm``
    (called about twice a second until it returns True) pays the first dump's one-off cost early.
    """

    def __init__(self, rank: int, status: Callable[[], dict[str, Any]], *, evidence_dir: Path | None,
                 agent_pid: int | None, prewarm: Callable[[], bool] | None = None) -> None:
        self.rank = rank
        self._status = status
        self._evidence_dir = evidence_dir
        self._agent_pid = agent_pid
        self._uid = os.getuid()
        self._prewarm = prewarm
        self._slots = threading.BoundedSemaphore(MAX_HANDLERS)
        self._dump_lock = threading.Lock()
        self._refused = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self.name = _bind_own_name(self._sock)
            self._sock.listen(16)
        except OSError:
            self._sock.close()
            raise
        self._thread = threading.Thread(target=self._serve, name="trainguard-control", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):  # low priority: stay out of the training threads' way
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        self._sock.settimeout(0.5 if self._prewarm is not None else None)
        while True:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                self._maybe_prewarm()
                continue
            except OSError:
                return  # closed
            try:
                self._dispatch(conn)
            except Exception as exc:  # the thread must outlive any single bad connection
                log.warning("control connection failed: %s", exc)
                conn.close()

    def _allowed(self, conn: socket.socket) -> bool:
        try:
            pid, uid, _ = peer_credentials(conn)
        except OSError:
            return False
        if uid == self._uid and (self._agent_pid is None or pid == self._agent_pid):
            return True
        self._refused += 1
        if self._refused == 1:  # once: a scanner must not flood the rank's log
            log.warning("control: refused a connection from pid %d uid %d (only the agent, pid %s, is served)",
                        pid, uid, self._agent_pid)
        return False

    def _dispatch(self, conn: socket.socket) -> None:
        if not self._allowed(conn) or not self._slots.acquire(blocking=False):
            conn.close()  # without reading: nothing an outsider sends is ever parsed
            return
        deadline = time.monotonic() + REQUEST_DEADLINE_SECONDS
        try:
            threading.Thread(target=self._handle_and_release, args=(conn, deadline), name="trainguard-control-conn",
                             daemon=True).start()
        except BaseException:
            self._slots.release()
            conn.close()
            raise

    def _handle_and_release(self, conn: socket.socket, deadline: float) -> None:
        try:
            with conn:
                self._handle(conn, deadline)
        except Exception as exc:
            log.warning("control request failed: %s", exc)
        finally:
            self._slots.release()

    def _maybe_prewarm(self) -> None:
        assert self._prewarm is not None
        if self._prewarm():
            self._prewarm = None
            self._sock.settimeout(None)

    def _handle(self, conn: socket.socket, deadline: float) -> None:
        data = _read_request(conn, deadline)
        if data is None:
            return
        reply = self._reply(data)
        conn.settimeout(10.0)
        conn.sendall((json.dumps(reply) + "\n").encode())

    def _reply(self, data: bytes) -> dict[str, Any]:
        try:
            request = json.loads(data)
        except ValueError:
            return {"ok": False, "error": "not a JSON line"}
        if not isinstance(request, dict):
            return {"ok": False, "error": "a request is a JSON object"}
        if "dir" in request:
            return {"ok": False, "error": "requests may not name a folder: dumps go to the worker's evidence folder"}
        cmd = request.get("cmd")
        if cmd == "ping":
            return {"ok": True, "rank": self.rank, "pid": os.getpid(), **self._status()}
        if cmd == "dump":
            if self._evidence_dir is None:
                return {"ok": False, "error": "this worker has no evidence folder", **self._status()}
            if (self._evidence_dir / PROCESS_STATE_FILE).exists():
                # A request answered late (this rank was stopped while the agent asked): the agent's evidence
                # is in and its decision made; a dump now would replace what that decision used.
                return {"ok": False, "error": "the agent's evidence is already gathered", **self._status()}
            with self._dump_lock:
                try:
                    reply = write_evidence(self._evidence_dir, self.rank)
                except OSError as exc:
                    log.warning("control: cannot write evidence: %s", exc)
                    return {"ok": False, "error": f"cannot write evidence: {exc}", **self._status()}
            reply.update(self._status())
            return reply
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    def close(self) -> None:
        # shutdown wakes the thread blocked in accept(); close alone may not
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()


def _read_request(conn: socket.socket, deadline: float) -> bytes | None:
    """The request line (newline excluded), or None when it is too long, too slow or cut short."""
    buf = bytearray()
    while True:
        newline = buf.find(b"\n")
        if newline >= 0:
            return bytes(buf[:newline])
        if len(buf) > MAX_REQUEST_BYTES:
            return None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        conn.settimeout(remaining)
        try:
            chunk = conn.recv(MAX_REQUEST_BYTES + 1 - len(buf))
        except (TimeoutError, OSError):
            return None
        if not chunk:
            return None
        buf += chunk


def _read_reply(sock: socket.socket, deadline: float) -> bytes:
    data = bytearray()
    while b"\n" not in data:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no complete reply in time")
        sock.settimeout(remaining)
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > MAX_REPLY_BYTES:
            raise ValueError("reply too long")
    return bytes(data)


def parse_reply(data: bytes) -> dict[str, Any]:
    """A control reply as the agent may use it; `ValueError` when it is not one (not a JSON object, a
    field of the wrong type): a malformed answer is evidence of nothing."""
    if len(data) > MAX_REPLY_BYTES:
        raise ValueError("reply too long")
    try:
        reply = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("reply is not JSON") from None
    if not isinstance(reply, dict):
        raise ValueError("reply is not a JSON object")
    for key in ("step", "steps_done", "rank", "pid"):
        if key in reply and (type(reply[key]) is not int):
            raise ValueError(f"reply field {key!r} is not an integer")
    if "ok" in reply and not isinstance(reply["ok"], bool):
        raise ValueError("reply field 'ok' is not a boolean")
    for key in ("phase", "error"):
        if key in reply and reply[key] is not None and not isinstance(reply[key], str):
            raise ValueError(f"reply field {key!r} is not a string")
    files = reply.get("files", [])
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise ValueError("reply field 'files' is not a list of names")
    return reply


def connect_checked(pid: int, timeout_seconds: float) -> socket.socket:
    """A connection to the control channel of the rank with ``pid``: its own name, else an alternative one,
    whose listener the kernel says was created by ``pid`` under this user's uid. Another process holding
    the name is never talked to; `ConnectionRefusedError` when no such listener exists."""
    uid = os.getuid()
    squatted = False
    for name in (socket_name(pid), *alternate_names(pid)):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            # Short: a squatter that never accepts fills its backlog, and must not eat the request's time.
            s.settimeout(min(timeout_seconds, 1.0))
            s.connect(name)
            peer_pid, peer_uid, _ = peer_credentials(s)
            s.settimeout(timeout_seconds)
        except OSError:
            s.close()
            continue
        if peer_pid == pid and peer_uid == uid:
            return s
        s.close()
        squatted = True
    if squatted:
        raise ConnectionRefusedError(f"no control channel of pid {pid} (its name is held by another process)")
    raise ConnectionRefusedError(f"no control channel of pid {pid}")


def request(pid: int, payload: dict[str, Any], timeout_seconds: float = 10.0) -> dict[str, Any]:
    """Send one request to the rank with ``pid``; raises OSError/TimeoutError/ValueError on failure."""
    deadline = time.monotonic() + timeout_seconds
    with connect_checked(pid, timeout_seconds) as s:
        s.sendall((json.dumps(payload) + "\n").encode())
        data = _read_reply(s, deadline)
    return parse_reply(data)


def request_all(pids: Mapping[int, int], payload: dict[str, Any], timeout_seconds: float,
                max_parallel: int = 16) -> dict[int, dict[str, Any] | OSError | ValueError]:
    """`request` to every rank of ``pids`` (rank -> pid) at once: each rank's reply, or the `OSError` or
    `ValueError` its request ended in (``ConnectionRefusedError``/``FileNotFoundError``: nothing listens)."""
    def one(pid: int) -> dict[str, Any] | OSError | ValueError:
        try:
            return request(pid, payload, timeout_seconds)
        except (OSError, ValueError) as exc:
            return exc

    if not pids:
        return {}
    ranks = sorted(pids)
    with ThreadPoolExecutor(max_workers=min(max_parallel, len(ranks))) as pool:
        return dict(zip(ranks, pool.map(one, [pids[r] for r in ranks]), strict=True))
