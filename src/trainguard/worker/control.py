"""The rank's control thread: answers the node agent's evidence requests while training runs or hangs.

It listens on a Linux abstract Unix socket named after the process id (``\\0trainguard-<pid>``), so the
agent, which knows its workers' pids, reaches each rank without any file or port to agree on. A gloo
collective waits with the GIL released, so this thread runs while the main thread is blocked in one.
Requests and replies are one JSON object per line.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def socket_name(pid: int) -> str:
    """Abstract-namespace socket address of the rank with this pid."""
    return f"\0trainguard-{pid}"


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


def dump_flight_recorder(with_stack_traces: bool = True) -> bytes | None:
    """The flight recorder's buffer as torch's pickle, or None when torch.distributed is not up."""
    try:
        import torch._C._distributed_c10d as c10d
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        name = "_dump_fr_trace"
        if dist.get_backend() == "nccl" and hasattr(c10d, "_dump_nccl_trace"):
            name = "_dump_nccl_trace"  # CUDA builds keep NCCL collectives in their own recorder
        dump = getattr(c10d, name)
        return bytes(dump(includeCollectives=True, includeStackTraces=with_stack_traces, onlyActive=False))
    except Exception as exc:
        log.warning("flight-recorder dump failed: %s", exc)
        return None


def write_evidence(directory: Path, rank: int) -> dict[str, Any]:
    """Write ``fr_trace_rank_<r>.pkl`` and ``stacks_rank_<r>.txt`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    stacks = directory / f"stacks_rank_{rank}.txt"
    stacks.write_text(format_all_stacks())
    written.append(stacks.name)
    fr = dump_flight_recorder()
    if fr is not None:
        tmp = directory / f".fr_trace_rank_{rank}.pkl.tmp"
        tmp.write_bytes(fr)
        os.replace(tmp, directory / f"fr_trace_rank_{rank}.pkl")
        written.append(f"fr_trace_rank_{rank}.pkl")
    return {"ok": True, "files": written}


class ControlThread:
    """Daemon thread serving ``dump`` and ``ping`` requests on the rank's control socket."""

    def __init__(self, rank: int, status: Any, *, prewarm: bool = True) -> None:
        self.rank = rank
        self._status = status
        self._prewarm = prewarm
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(socket_name(os.getpid()))
        self._sock.listen(8)
        self._thread = threading.Thread(target=self._serve, name="trainguard-control", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):  # low priority: stay out of the training threads' way
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        self._sock.settimeout(0.5 if self._prewarm else None)
        while True:
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                self._maybe_prewarm()
                continue
            except OSError:
                return
            with conn:
                try:
                    self._handle(conn)
                except Exception as exc:
                    log.warning("control request failed: %s", exc)

    def _maybe_prewarm(self) -> None:
        """The first dump with stack traces costs ~1-2 s (symbolizer import): pay it early, once."""
        if self._status.steps_done < 1:
            return
        self._prewarm = False
        self._sock.settimeout(None)
        dump_flight_recorder()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(30)
        data = _read_line(conn)
        if not data.endswith(b"\n"):
            return
        request = json.loads(data)
        cmd = request.get("cmd")
        reply: dict[str, Any]
        if cmd == "ping":
            reply = {"ok": True, "rank": self.rank, **self._status.snapshot()}
        elif cmd == "dump":
            reply = write_evidence(Path(request["dir"]), self.rank)
            reply.update(self._status.snapshot())
        else:
            reply = {"ok": False, "error": f"unknown command {cmd!r}"}
        conn.sendall((json.dumps(reply) + "\n").encode())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


def _read_line(sock: socket.socket) -> bytes:
    """Bytes up to and including the first newline, or whatever came before the peer closed."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def request(pid: int, payload: dict[str, Any], timeout_seconds: float = 10.0) -> dict[str, Any]:
    """Send one request to the rank with ``pid``; raises OSError/TimeoutError/ValueError on failure."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_seconds)
        s.connect(socket_name(pid))
        s.sendall((json.dumps(payload) + "\n").encode())
        data = _read_line(s)
    reply = json.loads(data)
    if not isinstance(reply, dict):
        raise ValueError("bad reply")
    return reply
