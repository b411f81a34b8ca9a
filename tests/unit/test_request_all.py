"""worker.control.request_all: the agent's one fan-out of control requests (evidence dumps, straggler probes),
against real abstract sockets: each rank's reply or the error its request ended in, keyed by rank."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from trainguard.worker.control import request_all, socket_name

# Pids no process of this test machine is likely to have a control socket for.
_FAKE_PIDS = (4_100_001, 4_100_002, 4_100_003)


def _serve(pid: int, reply: bytes, stop: threading.Event) -> socket.socket:
    """A listener at the rank's address that answers every request line with ``reply`` (b"" closes)."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(socket_name(pid))
    srv.listen(4)
    srv.settimeout(0.1)

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(2)
                buf = b""
                while b"\n" not in buf:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    buf += chunk
                if reply:
                    conn.sendall(reply)

    threading.Thread(target=loop, daemon=True).start()
    return srv


@pytest.fixture
def servers() -> Iterator[threading.Event]:
    stop = threading.Event()
    socks = [_serve(_FAKE_PIDS[0], json.dumps({"ok": True, "files": ["fr_trace_rank_0.pkl"]}).encode() + b"\n", stop),
             _serve(_FAKE_PIDS[1], b"[1, 2]\n", stop)]  # not an object: a bad reply
    yield stop
    stop.set()
    for s in socks:
        s.close()


def test_replies_and_errors_by_rank(servers: threading.Event) -> None:
    got = request_all({0: _FAKE_PIDS[0], 1: _FAKE_PIDS[1], 2: _FAKE_PIDS[2]}, {"cmd": "dump"}, 2.0)
    assert list(got) == [0, 1, 2]
    assert got[0] == {"ok": True, "files": ["fr_trace_rank_0.pkl"]}
    assert isinstance(got[1], ValueError)  # answered, but not with an object
    assert isinstance(got[2], ConnectionRefusedError)  # nothing listens: no control thread


def test_no_ranks_no_requests() -> None:
    assert request_all({}, {"cmd": "dump"}, 1.0) == {}
