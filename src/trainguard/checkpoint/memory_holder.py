"""The memory tier's holder: one small process per node that owns the node's memory copies and serves replicas.

Started by the first rank of a node that saves to memory (`trainguard.checkpoint.memory_client`), in its
own session so it outlives worker processes; it watches the job's launcher process (the ranks' parent:
the agent, or torchrun) and, when that ends, removes the node's copies and exits, so memory is held no
longer than the job. A new holder starts with no memory: it empties the node directory it takes over.

Over TCP it accepts replicas pushed by other nodes' ranks and returns them on restore. Every request
and response is tagged with the job secret (HMAC-SHA256, bound to a per-connection nonce), so another
user can neither read copies nor plant one; the data itself is verified by its checksum at restore.
A request starts with a fixed-size header (the body's length, tagged) that is verified before a byte of
the body is read: a peer without the secret costs the holder `HEADER_BYTES`. Connections are capped
(`MAX_CONNECTIONS`, beyond it a peer is told ``busy`` and closed) and every read has a timeout.
Run as ``python -m trainguard.checkpoint.memory_holder`` with the secret on stdin.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import logging
import os
import secrets
import select
import shutil
import signal
import socket
import socketserver
import sys
import threading
from pathlib import Path
from typing import Any

from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.memory_meta import MAX_META_BYTES, CopyMeta
from trainguard.checkpoint.memory_store import begin, copies, describe, rank_dir, replica_steps, secure_dir
from trainguard.launch.store_auth import StoreSigner

log = logging.getLogger(__name__)

STATE_FILE = "holder.json"
MAX_LINE = 64 << 20
"""A reply line (read by ranks from their own job's holders)."""
MAX_REQUEST = MAX_META_BYTES + (1 << 20)
"""A request body (read only once its header verified): a put carries a copy's description, up to MAX_META_BYTES."""
HEADER_BYTES = 8 + 1 + 64 + 1
"""``<body length, 8 hex digits> <HMAC-SHA256 of nonce and length, hex>\\n``."""
MAX_CONNECTIONS = 64
"""Connections served at once: each is a thread. Ranks open one per request, so a job needs a few per rank."""
HEADER_SECONDS = 10.0
"""A peer that has not sent a verified header this long after connecting is dropped."""
IO_SECONDS = 60.0
"""Any later read or write that makes no progress this long ends the connection."""
BUSY = b"busy\n"


def read_line(stream: Any, limit: int = MAX_LINE) -> bytes:
    line: bytes = stream.readline(limit + 1)
    if not line.endswith(b"\n"):
        raise ConnectionError("connection closed or line too long")
    return line


def read_exact(stream: Any, size: int) -> bytes:
    """Exactly ``size`` bytes from an unbuffered stream (never more: nothing past them is read)."""
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        n = stream.readinto(view[got:])
        if not n:
            raise ConnectionError("connection closed mid-request")
        got += n
    view.release()
    return bytes(data)


def request_bytes(signer: StoreSigner, nonce: str, message: dict[str, Any]) -> bytes:
    """A request as sent: the tagged header, then the signed body."""
    body = signer.sign(f"memtier-req/{nonce}", {"m": json.dumps(message)})
    if len(body) > MAX_REQUEST:
        raise CheckpointError(f"memory holder request of {len(body)} bytes exceeds {MAX_REQUEST}")
    header = f"{len(body):08x} {signer.tag('memtier-hdr', nonce, str(len(body)))}\n".encode()
    return header + body


def read_request(signer: StoreSigner, nonce: str, rfile: Any) -> dict[str, Any] | None:
    """The request on ``rfile``, or None when its header or body is not this job's; the body is read only
    after the header verified (an unauthenticated peer costs `HEADER_BYTES`)."""
    header = read_exact(rfile, HEADER_BYTES)
    try:
        length_hex, tag = header[:-1].decode("ascii").split(" ")
        length = int(length_hex, 16)
    except ValueError:
        return None
    if not hmac.compare_digest(tag, signer.tag("memtier-hdr", nonce, str(length))) or length > MAX_REQUEST:
        return None
    return unsigned(signer, f"memtier-req/{nonce}", read_exact(rfile, length))


def signed(signer: StoreSigner, context: str, message: dict[str, Any]) -> bytes:
    return signer.sign(context, {"m": json.dumps(message)}) + b"\n"


def unsigned(signer: StoreSigner, context: str, raw: bytes) -> dict[str, Any] | None:
    fields = signer.verify(context, raw, ("m",))
    if fields is None:
        return None
    message = json.loads(fields["m"])
    return message if isinstance(message, dict) else None


class Holder:
    """The holder's state: its node directory, bound, secret and the server."""

    def __init__(self, node: Path, signer: StoreSigner, bound_bytes: int) -> None:
        self.node = node
        self.signer = signer
        self.bound_bytes = bound_bytes
        self.server: socketserver.ThreadingTCPServer | None = None
        self.stopping = threading.Event()

    def wipe(self) -> None:
        """A holder starts with no memory: copies a dead holder left behind are not trusted."""
        for kind in ("own", "replicas"):
            shutil.rmtree(self.node / kind, ignore_errors=True)

    def handle(self, rfile: Any, wfile: Any, sock: socket.socket) -> None:
        nonce = secrets.token_hex(16)
        sock.settimeout(HEADER_SECONDS)
        wfile.write(nonce.encode() + b"\n")
        wfile.flush()
        request = read_request(self.signer, nonce, rfile)
        if request is None:
            return
        sock.settimeout(IO_SECONDS)
        op = request.get("op")
        reply = f"memtier-resp/{nonce}"
        if op == "ping":
            wfile.write(signed(self.signer, reply, {"ok": True, "pid": os.getpid()}))
        elif op == "list":
            held = {str(rank): steps for rank, steps in replica_steps(self.node).items()}
            wfile.write(signed(self.signer, reply, {"ok": True, "replicas": held}))
        elif op == "put":
            self._put(request, rfile, wfile, reply)
        elif op == "get":
            self._get(request, wfile, sock, reply)
        elif op == "stop":
            wfile.write(signed(self.signer, reply, {"ok": True}))
            wfile.flush()
            self.stopping.set()
        wfile.flush()

    def _put(self, request: dict[str, Any], rfile: Any, wfile: Any, reply: str) -> None:
        try:
            meta = CopyMeta.from_bytes(str(request["meta"]).encode())
            directory = rank_dir(self.node, "replicas", meta.rank)
            slot, mapped = begin(self.node, directory, meta.size, self.bound_bytes, f"rank {meta.rank}'s replica")
        except (CheckpointError, OSError, KeyError) as exc:
            wfile.write(signed(self.signer, reply, {"ok": False, "error": str(exc)}))
            return
        try:
            wfile.write(signed(self.signer, reply, {"ok": True}))
            wfile.flush()
            view, got = memoryview(mapped), 0
            while got < meta.size:
                n = rfile.readinto(view[got : meta.size])
                if not n:
                    raise ConnectionError("replica sender went away mid-copy")
                got += n
            view.release()
        finally:
            mapped.close()
        describe(directory, slot, meta)  # only a complete copy is described
        wfile.write(signed(self.signer, reply, {"ok": True}))

    def _get(self, request: dict[str, Any], wfile: Any, sock: socket.socket, reply: str) -> None:
        try:
            directory = rank_dir(self.node, "replicas", int(request["rank"]))
            found = [c for c in copies(directory) if c.meta.step == int(request["step"])]
            if not found:
                raise CheckpointError(f"no replica of rank {request['rank']} step {request['step']}")
            fd = os.open(found[0].data, os.O_RDONLY | os.O_NOFOLLOW)
        except (CheckpointError, OSError, KeyError, ValueError) as exc:
            wfile.write(signed(self.signer, reply, {"ok": False, "error": str(exc)}))
            return
        with os.fdopen(fd, "rb") as data:
            wfile.write(signed(self.signer, reply, {"ok": True, "meta": found[0].meta.to_bytes().decode()}))
            wfile.flush()
            sock.sendfile(data, 0, found[0].meta.size)

    def serve(self, bind: str, advertise: str, watch_pid: int) -> None:
        holder = self

        class Handler(socketserver.StreamRequestHandler):
            rbufsize = 0  # unbuffered: nothing is read from a peer beyond what the protocol asks for

            def handle(self) -> None:
                try:
                    holder.handle(self.rfile, self.wfile, self.request)
                except (OSError, ConnectionError, ValueError) as exc:
                    log.debug("memory holder connection ended: %s", exc)

        with _Server((bind, 0), Handler) as server:
            self.server = server
            port = server.server_address[1]
            state = self.node / f".{STATE_FILE}.tmp"
            state.unlink(missing_ok=True)
            fd = os.open(state, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"pid": os.getpid(), "address": advertise, "port": port}, f)
            os.rename(state, self.node / STATE_FILE)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            _wait_for(watch_pid, self.stopping)
            server.shutdown()


class _Server(socketserver.ThreadingTCPServer):
    """A thread per connection, at most `MAX_CONNECTIONS` of them: a peer beyond is told `BUSY` and closed."""

    allow_reuse_address = True
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type[socketserver.BaseRequestHandler]) -> None:
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.refused += 1
            if self.refused in (1, 100) or self.refused % 10000 == 0:
                log.warning("memory holder busy: %d connection(s) refused beyond %d at once", self.refused,
                            MAX_CONNECTIONS)
            with contextlib.suppress(OSError):
                request.setblocking(False)  # never wait on a peer that does not read
                request.send(BUSY)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def _wait_for(pid: int, stopping: threading.Event) -> None:
    """Return when process ``pid`` has ended (a pidfd: no pid-reuse race) or a stop was asked."""
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return
    try:
        while not stopping.is_set():
            ready, _, _ = select.select([pidfd], [], [], 0.2)
            if ready:
                return
    finally:
        os.close(pidfd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainguard.checkpoint.memory_holder")
    ap.add_argument("--node-dir", required=True)
    ap.add_argument("--watch-pid", type=int, required=True)
    ap.add_argument("--bind", default="127.0.0.1")
    ap.add_argument("--advertise", default="127.0.0.1")
    ap.add_argument("--bound-bytes", type=int, required=True)
    args = ap.parse_args(argv)
    key = sys.stdin.buffer.read(4096).strip()
    node = secure_dir(Path(args.node_dir))
    holder = Holder(node, StoreSigner(key), args.bound_bytes)
    signal.signal(signal.SIGTERM, lambda *_: holder.stopping.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C to the job reaches the launcher, which we watch
    holder.wipe()
    try:
        holder.serve(args.bind, args.advertise, args.watch_pid)
    finally:
        shutil.rmtree(node, ignore_errors=True)  # the job's memory goes with the job
        with contextlib.suppress(OSError):
            node.parent.rmdir()  # the run's directory, once its last node is gone
    return 0


if __name__ == "__main__":
    sys.exit(main())
