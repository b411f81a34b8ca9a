"""Talking to memory holders: start this node's holder when none runs, push, list and fetch replicas.

`ensure_holder` is called by every rank of a node; the first one to find no live holder (under the node's
``holder.lock``) starts it, the others wait for its ``holder.json``. See `trainguard.checkpoint.memory_holder`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import mmap
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.checkpoint.checksum import new_hasher
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.memory_holder import BUSY, STATE_FILE, read_line, request_bytes, unsigned
from trainguard.checkpoint.memory_meta import CopyMeta
from trainguard.launch.lifetime import untagged_environ
from trainguard.launch.store_auth import StoreSigner

log = logging.getLogger(__name__)

START_SECONDS = 20.0
HASH_CHUNK = 4 << 20
"""A fetched replica is checksummed in pieces this large as it arrives (small enough to stay in the cache)."""
_HOLDER_MAIN = "import sys; from trainguard.checkpoint.memory_holder import main; sys.exit(main(sys.argv[1:]))"
"""``-c`` rather than ``-m``: the package imports the holder module, which ``-m`` would then run twice."""


@dataclass(frozen=True)
class Address:
    """Where a node's holder listens."""

    node: str
    host: str
    port: int


class HolderClient:
    """Requests to one holder, each on its own connection (a holder never keeps state per client)."""

    def __init__(self, address: Address, signer: StoreSigner, timeout: float = 60.0) -> None:
        self.address = address
        self.signer = signer
        self.timeout = timeout

    def _connect(self) -> tuple[socket.socket, Any, str]:
        """A connection to the holder and its nonce; a holder at its connection cap says busy: try again
        (with a growing pause) until this client's timeout, so a burst of other peers only delays a request."""
        deadline, pause = time.monotonic() + self.timeout, 0.02
        while True:
            sock = socket.create_connection((self.address.host, self.address.port), timeout=self.timeout)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                rfile = sock.makefile("rb")
                line = read_line(rfile, 256)
            except BaseException:
                sock.close()
                raise
            if line != BUSY:
                return sock, rfile, line.strip().decode()
            sock.close()
            if time.monotonic() + pause > deadline:
                raise CheckpointError(f"holder of node {self.address.node} stayed busy for {self.timeout:.0f} s")
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    @contextlib.contextmanager
    def _call(self, request: dict[str, Any]) -> Any:
        sock, rfile, nonce = self._connect()
        with sock:
            sock.sendall(request_bytes(self.signer, nonce, request))

            def answer() -> dict[str, Any]:
                reply = unsigned(self.signer, f"memtier-resp/{nonce}", read_line(rfile))
                if reply is None:
                    raise CheckpointError(f"holder of node {self.address.node} sent an unsigned reply")
                if not reply.get("ok"):
                    raise CheckpointError(str(reply.get("error", "holder refused")))
                return reply

            yield sock, rfile, answer

    def ping(self) -> int:
        with self._call({"op": "ping"}) as (_, _, answer):
            return int(answer()["pid"])

    def put(self, meta: CopyMeta, data: memoryview) -> None:
        """Store ``data`` (``meta.size`` bytes) as a replica; `CheckpointError` when the holder refuses."""
        with self._call({"op": "put", "meta": meta.to_bytes().decode()}) as (sock, _, answer):
            answer()
            sock.sendall(data[: meta.size])
            answer()

    def replicas(self) -> dict[int, list[int]]:
        """Rank -> steps of the replicas this holder has."""
        with self._call({"op": "list"}) as (_, _, answer):
            return {int(r): [int(s) for s in steps] for r, steps in answer()["replicas"].items()}

    def get(self, rank: int, step: int) -> tuple[CopyMeta, mmap.mmap, str]:
        """A replica's description, bytes and the digest of those bytes by the description's algorithm, taken
        while they arrived (one pass; the caller compares it with the description before using a byte)."""
        with self._call({"op": "get", "rank": rank, "step": step}) as (_, rfile, answer):
            meta = CopyMeta.from_bytes(str(answer()["meta"]).encode())
            try:
                hasher = new_hasher(meta.algorithm)
            except ValueError as exc:
                raise CheckpointError(str(exc)) from None
            data = mmap.mmap(-1, max(meta.size, 1))  # anonymous: no zero-filling pass before the transfer
            got = hashed = 0
            with memoryview(data) as view:
                while got < meta.size:
                    n = rfile.readinto(view[got : min(got + HASH_CHUNK, meta.size)])
                    if not n:
                        raise CheckpointError(f"holder of node {self.address.node} went away mid-transfer")
                    got += n
                    if got - hashed >= HASH_CHUNK or got == meta.size:
                        hasher.update(view[hashed:got])  # still in the cache: the receive was the read
                        hashed = got
            return meta, data, hasher.hexdigest()

    def stop(self) -> None:
        with self._call({"op": "stop"}) as (_, _, answer):
            answer()


LOOPBACK = "127.0.0.1"


def holder_address(configured: str | None, environ: dict[str, str] | None = None) -> tuple[str, str]:
    """(bind, advertise) for this node's holder: ``configured`` when set; loopback when the job has one node
    (every rank on this host) or its nodes meet on loopback; otherwise the local address of the route to the
    job's master, the interface the nodes use to reach each other. Never every interface when avoidable."""
    if configured:
        return configured, configured
    env = os.environ if environ is None else environ
    world, local = env.get("WORLD_SIZE"), env.get("LOCAL_WORLD_SIZE")
    if world is not None and world == local:
        return LOOPBACK, LOOPBACK
    master = env.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master, int(env.get("MASTER_PORT", "1") or 1)))  # no packet: only a route
                local_ip = str(probe.getsockname()[0])
        except (OSError, ValueError):
            local_ip = ""
        if local_ip.startswith("127."):
            return LOOPBACK, LOOPBACK
        if local_ip:
            return local_ip, local_ip
    # No way to tell which interface the other nodes use: all of them (requests are still authenticated).
    log.warning("memory holder listens on all interfaces: set CheckpointConfig.memory_address to restrict it")
    return "0.0.0.0", socket.gethostname()


def running(node_dir: Path, node: str, signer: StoreSigner) -> Address | None:
    """The address of the node's live holder, or None."""
    try:
        fd = os.open(node_dir / STATE_FILE, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            state = json.load(f)
        address = Address(node, str(state["address"]), int(state["port"]))
        if HolderClient(address, signer, timeout=5.0).ping() != int(state["pid"]):
            return None
        return address
    except (OSError, ValueError, KeyError, CheckpointError):
        return None


def ensure_holder(
    node_dir: Path, node: str, signer: StoreSigner, *, bind: str, advertise: str, bound_bytes: int
) -> Address:
    """This node's holder, started (watching this rank's parent: the job's launcher) if none is alive."""
    found = running(node_dir, node, signer)
    if found is not None:
        return found
    fd = os.open(node_dir / "holder.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        found = running(node_dir, node, signer)
        if found is not None:
            return found
        with contextlib.suppress(FileNotFoundError):
            os.unlink(node_dir / STATE_FILE)
        cmd = [sys.executable, "-c", _HOLDER_MAIN, "--node-dir", str(node_dir),
               "--watch-pid", str(os.getppid()), "--bind", bind, "--advertise", advertise,
               "--bound-bytes", str(bound_bytes)]
        # Not the rank's process tag: the agent ends tagged processes that outlive their rank at the end of
        # each attempt, and the holder must outlive a crashed rank (it ends itself with the job's launcher).
        # Its stderr goes to its own log, not to a pipe a caller of the rank may be waiting on.
        env = untagged_environ()
        log_fd = os.open(node_dir / "holder.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log_fd, env=env,
                                    start_new_session=True)
        finally:
            os.close(log_fd)
        assert proc.stdin is not None
        proc.stdin.write(signer.key)
        proc.stdin.close()
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            found = running(node_dir, node, signer)
            if found is not None:
                return found
            if proc.poll() is not None:
                raise CheckpointError(f"memory holder of node {node} exited at start (code {proc.returncode})")
            time.sleep(0.05)
        raise CheckpointError(f"memory holder of node {node} did not start within {START_SECONDS:.0f} s")
    finally:
        os.close(fd)
