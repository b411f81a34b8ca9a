"""worker.control.request_all: the agent's one fan-out of control requests (evidence dumps, straggler probes),
against real abstract sockets held by real processes: each rank's reply or the error its request ended in, keyed
by rank; a listener of another process at a rank's name is never talked to, and a malformed reply is no reply."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.worker.control import parse_reply, request, request_all, socket_name

# A pid no process of this test machine is likely to have a control socket for.
_FAKE_PID = 4_100_003

# A listener at ``argv[1]`` (``@`` for the abstract namespace; the process's own name when empty, its own name
# with ``-<suffix>`` when ``-<suffix>``) that answers every request line with argv[2].
_SERVE = r"""
import os, socket, sys
name = sys.argv[1]
if not name or name.startswith("-"):
    name = "@trainguard-%d%s" % (os.getpid(), name)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind("\0" + name[1:])
srv.listen(4)
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    with conn:
        buf = b""
        while b"\n" not in buf:
            chunk = conn.recv(4096)
            if not chunk:
                break
            buf += chunk
        conn.sendall(sys.argv[2].encode())
"""


def _serve(reply: bytes, name: str = "") -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", _SERVE, name, reply.decode()], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [_serve(json.dumps({"ok": True, "files": ["fr_trace_rank_0.pkl"]}).encode() + b"\n"),
             _serve(b"[1, 2]\n")]  # not an object: a bad reply
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_replies_and_errors_by_rank(servers: list[subprocess.Popen[bytes]]) -> None:
    got = request_all({0: servers[0].pid, 1: servers[1].pid, 2: _FAKE_PID}, {"cmd": "dump"}, 2.0)
    assert list(got) == [0, 1, 2]
    assert got[0] == {"ok": True, "files": ["fr_trace_rank_0.pkl"]}
    assert isinstance(got[1], ValueError)  # answered, but not with an object
    assert isinstance(got[2], ConnectionRefusedError)  # nothing listens: no control thread


def test_no_ranks_no_requests() -> None:
    assert request_all({}, {"cmd": "dump"}, 1.0) == {}


def _at(name: str) -> str:
    return "@" + name[1:]


def test_a_listener_of_another_process_at_a_ranks_name_is_not_the_rank() -> None:
    """Someone binds the name of a pid that is not theirs; the agent must never take its answer."""
    squatter = _serve(b'{"ok": true, "step": 999}\n', _at(socket_name(_FAKE_PID)))
    try:
        with pytest.raises(ConnectionRefusedError, match="held by another process"):
            request(_FAKE_PID, {"cmd": "ping"}, 2.0)
    finally:
        squatter.kill()
        squatter.wait()


def test_a_rank_whose_name_was_taken_is_found_under_its_other_name() -> None:
    """The real rank listens under ``<name>-<suffix>``; squatters at its name and at other suffixes are skipped."""
    rank = _serve(b'{"ok": true, "step": 7}\n', "-b0b0")
    squatters = [_serve(b'{"step": "x"}\n', _at(socket_name(rank.pid))),
                 _serve(b'{"step": "x"}\n', _at(socket_name(rank.pid)) + "-aaaa")]
    try:
        assert request_all({0: rank.pid}, {"cmd": "ping"}, 2.0) == {0: {"ok": True, "step": 7}}
    finally:
        for p in (rank, *squatters):
            p.kill()
            p.wait()


@pytest.mark.parametrize("raw", [b'{"step": "x"}', b'{"step": 1.5}', b'{"step": true}', b'{"steps_done": "3"}',
                                 b'{"ok": "yes"}', b'{"files": "a"}', b'{"files": [1]}', b'{"phase": 3}',
                                 b"[1]", b"not json", b"\xff\xfe", b'{"a": "' + b"x" * (1 << 20) + b'"}'])
def test_a_malformed_reply_is_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_reply(raw)


def test_a_well_formed_reply_is_kept() -> None:
    reply = {"ok": True, "files": ["stacks_rank_0.txt"], "step": 12, "steps_done": 11, "phase": "comm_wait"}
    assert parse_reply(json.dumps(reply).encode()) == reply
    assert parse_reply(b'{"ok": false, "error": "no folder", "step": 0}') == {"ok": False, "error": "no folder",
                                                                             "step": 0}


def test_a_malformed_answer_to_an_evidence_request_is_evidence_of_nothing(tmp_path: Path) -> None:
    """A non-numeric step once killed the agent's failure handling (``int("x")``); now it is no answer at all:
    neither a reply nor a frozen rank."""
    from trainguard.launch.evidence import GatheredEvidence, _ask_for_dumps

    liar = _serve(b'{"ok": true, "step": "x", "files": ["../../etc/passwd"]}\n')
    try:
        ev = GatheredEvidence(directory=tmp_path)
        _ask_for_dumps(ev, {1: liar.pid}, 2.0)
    finally:
        liar.kill()
        liar.wait()
    assert ev.replies == {} and ev.unanswered == [] and ev.no_channel == []
