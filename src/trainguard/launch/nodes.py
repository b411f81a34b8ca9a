"""Node liveness across agents: each agent's beat in the shared run directory, the peers' watch over it,
and the evidence kept when a node is lost (the node-level faults an agent fires: `trainguard.chaos.node_faults`).

An agent writes ``nodes/<node>.beat`` once a second from a thread of its own, so a killed (SIGKILL) or
stopped (SIGSTOP) agent stops beating whatever its workers do. Peers judge a beat by when *they* saw it
change, on their own monotonic clock: the hosts' clocks never need to agree.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from trainguard.core.events import Diagnosis, FailureDetected, NodeExcluded
from trainguard.core.protocol import RunLayout, rank_of, read_heartbeat
from trainguard.core.safefs import create_exclusive, make_dirs, write_private
from trainguard.launch.evidence import log_tail

log = logging.getLogger(__name__)

BEAT_INTERVAL_SECONDS = 1.0
"""How often an agent rewrites its beat."""
"""Node faults fired by the agent of the named node once its ranks reach the step."""
LOG_TAIL_LINES = 200
WATCHED_PEERS = 2
"""Peers each agent watches between failures (`ring_successors`); after a failure it checks them all."""
PEER_POLL_SECONDS = 0.5
"""How often the monitor loop reads the watched peers' beats."""


def beat_path(run_dir: Path, node: str) -> Path:
    return RunLayout(run_dir).node_beat(node)


def lost_marker(run_dir: Path, node: str) -> Path:
    return RunLayout(run_dir).lost_marker(node)


@dataclass(frozen=True)
class AgentBeat:
    """One agent's beat as its file says it."""

    seq: int
    """Incremented at every write: a peer that sees it change knows the agent ran."""
    pid: int
    state: str
    """``running`` while it supervises, then how it ended (``completed``, ``failed``, ``excluded``, ...)."""
    attempt: int
    wall: float
    """The writer's wall clock, for people reading the evidence (never compared across hosts)."""

    def encode(self) -> bytes:
        text = f"seq={self.seq} pid={self.pid} state={self.state} attempt={self.attempt} wall={self.wall:.3f}\n"
        return text.encode()

    @classmethod
    def decode(cls, data: bytes) -> AgentBeat | None:
        try:
            parts = dict(p.split("=", 1) for p in data.decode("ascii").split())
            return cls(seq=int(parts["seq"]), pid=int(parts["pid"]), state=parts["state"],
                       attempt=int(parts["attempt"]), wall=float(parts["wall"]))
        except (UnicodeDecodeError, KeyError, ValueError):
            return None


def read_beat(run_dir: Path, node: str) -> AgentBeat | None:
    try:
        return AgentBeat.decode(beat_path(run_dir, node).read_bytes()[:512])
    except OSError:
        return None


class BeatWriter:
    """The agent's beat thread. `stop` writes the final state, so peers never mistake an end for a loss."""

    def __init__(self, run_dir: Path, node: str, interval_seconds: float = BEAT_INTERVAL_SECONDS) -> None:
        self._path = beat_path(run_dir, node)
        self._interval = interval_seconds
        self._seq = 0
        self._attempt = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainguard-agent-beat", daemon=True)

    def start(self) -> None:
        self._write("running")
        self._thread.start()

    def set_attempt(self, attempt: int) -> None:
        self._attempt = attempt

    def stop(self, final_state: str) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self._interval)
        self._write(final_state)

    def _write(self, state: str) -> None:
        self._seq += 1
        beat = AgentBeat(seq=self._seq, pid=os.getpid(), state=state, attempt=self._attempt, wall=time.time())
        try:
            write_private(self._path, beat.encode())
        except OSError as exc:  # a full or read-only disk must not stop supervision; peers may call us lost
            log.warning("cannot write the agent beat %s: %s", self._path, exc)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._write("running")


@dataclass(frozen=True)
class LostNode:
    """A peer whose agent stopped beating."""

    node: str
    silent_seconds: float
    """How long its beat has not changed, on this agent's monotonic clock."""
    last: AgentBeat | None
    """Its last beat."""


class PeerWatch:
    """Which peers still beat. `observe` must be called regularly (the agent's monitor loop does, twice a
    second) so that the time a beat last changed is known before a failure asks."""

    def __init__(self, run_dir: Path, node: str, lost_after_seconds: float) -> None:
        self.run_dir = run_dir
        self.node = node
        self.lost_after_seconds = lost_after_seconds
        self._seen: dict[str, tuple[int | None, float]] = {}
        """peer -> (last seq seen, this agent's monotonic time it was first seen)."""
        self._changed: dict[str, float] = {}
        """peer -> a moment after which its beat is known to have changed: the read *before* the one that saw the
        change (a first sighting is no change). Not the read that saw it: a peer read rarely (outside this
        agent's ring, or not since an earlier failure) may have changed long ago and died since."""
        self._read: dict[str, float] = {}
        """peer -> when its beat was last read."""

    def _update(self, peer: str, now: float) -> AgentBeat | None:
        beat = read_beat(self.run_dir, peer)
        seq = beat.seq if beat is not None else None
        if peer not in self._seen or self._seen[peer][0] != seq:
            if peer in self._seen:
                self._changed[peer] = self._read[peer]
            self._seen[peer] = (seq, now)
        self._read[peer] = now
        return beat

    def observe(self, peers: Iterable[str], now: float) -> list[LostNode]:
        """The peers that are lost now: beat unchanged for ``lost_after_seconds`` while saying ``running``.

        A peer with no beat file at all (an agent of an older trainguard) is never called lost."""
        lost = []
        for peer in sorted(set(peers) - {self.node}):
            beat = self._update(peer, now)
            silent = now - self._seen[peer][1]
            if beat is not None and beat.state == "running" and silent > self.lost_after_seconds:
                lost.append(LostNode(peer, silent, beat))
        return lost

    def changed_since(self, peer: str, mono: float) -> bool:
        """Whether ``peer``'s beat is known to have changed after ``mono`` (a missing beat counts as alive: unknown).
        It takes two reads after ``mono``, the second seeing a new beat."""
        seq, _ = self._seen.get(peer, (None, 0.0))
        return seq is None or self._changed.get(peer, float("-inf")) >= mono

    def settle(self, peers: Iterable[str], since_mono: float, poll_seconds: float = 0.2) -> list[LostNode]:
        """After a failure at ``since_mono``: wait until every peer beat again (none lost: []) or some peer
        is lost. Bounded by ``lost_after_seconds`` + one beat interval past ``since_mono``, or past the first
        sighting of a silent peer's current beat when that came later: a beat first read after the failure (the
        agent was busy gathering evidence, or never read that peer) has its silence counted from that read, and a
        bound from the failure alone would end the wait before a dead peer could be called lost."""
        others = sorted(set(peers) - {self.node})
        slack = self.lost_after_seconds + BEAT_INTERVAL_SECONDS + poll_seconds
        while True:
            now = time.monotonic()
            lost = self.observe(others, now)
            silent = [p for p in others if not self.changed_since(p, since_mono)]
            deadline = max([since_mono] + [self._seen[p][1] for p in silent if p in self._seen]) + slack
            if lost or not silent or now > deadline:
                return lost
            time.sleep(poll_seconds)


class AttemptPeers:
    """The other nodes of the current attempt, as this agent watches them (`PeerWatch` over their beats)."""

    def __init__(self, layout: RunLayout, run_dir: Path, node: str, lost_after_seconds: float) -> None:
        self.layout = layout
        self.node = node
        self.watch = PeerWatch(run_dir, node, lost_after_seconds)
        self._polled_mono = 0.0
        self._cache: tuple[int, list[str]] | None = None

    def of(self, attempt: int, world_size: int) -> list[str]:
        """The other nodes of ``attempt`` (from the heartbeat folders: cached once every rank has one)."""
        cached = self._cache
        if cached is not None and cached[0] == attempt:
            return cached[1]
        members = attempt_nodes(self.layout, attempt)
        peers = [n for n in members if n != self.node]
        if world_size and sum(len(r) for r in members.values()) >= world_size:
            self._cache = (attempt, peers)
        return peers

    def observe(self, attempt: int, world_size: int, now: float) -> list[LostNode]:
        """The watched peers (`ring_successors`) that are lost now."""
        return self.watch.observe(ring_successors(self.of(attempt, world_size), self.node), now)

    def poll(self, attempt: int, world_size: int, now: float) -> list[LostNode]:
        """`observe`, at most twice a second (the monitor loop calls it more often)."""
        if now - self._polled_mono < PEER_POLL_SECONDS:
            return []
        self._polled_mono = now
        return self.observe(attempt, world_size, now)

    def settle(self, attempt: int, world_size: int, since_mono: float) -> list[LostNode]:
        """`PeerWatch.settle` over every other node of ``attempt``."""
        return self.watch.settle(self.of(attempt, world_size), since_mono)


def ring_successors(nodes: Iterable[str], me: str, count: int = WATCHED_PEERS) -> list[str]:
    """The ``count`` nodes after ``me`` in node-id order (wrapping): the peers an agent watches while all is
    well, so the cluster reads O(N) beat files per poll rather than O(N^2). Every node is watched by
    ``count`` others."""
    ring = sorted(set(nodes) | {me})
    at = ring.index(me)
    return [ring[(at + i) % len(ring)] for i in range(1, min(count, len(ring) - 1) + 1)]


def attempt_nodes(layout: RunLayout, attempt: int) -> dict[str, list[int]]:
    """Node -> its ranks in ``attempt`` (from the workers' heartbeat folders in the shared run directory)."""
    out: dict[str, list[int]] = {}
    for rank, node in sorted(layout.rank_nodes(attempt).items()):
        out.setdefault(node, []).append(rank)
    return out


def keep_evidence(layout: RunLayout, node: str, attempt: int) -> list[str]:
    """Copy what the shared run directory still holds of a lost node into
    ``diagnostics/attempt-<k>/node-<node>/``: its agent's last beat, its ranks' last heartbeats (decoded)
    and their log tails. Returns the files' paths relative to the run directory."""
    dest = layout.diagnostics_dir(attempt) / f"node-{node}"
    make_dirs(dest)
    files: list[Path] = []
    beat = read_beat(layout.root, node)
    if beat is not None:
        write_private(dest / "agent.beat", beat.encode())
        files.append(dest / "agent.beat")
    lines = []
    for path in sorted(layout.heartbeat_dir(node, attempt).glob("rank-*")):
        rank = rank_of(path.name, "rank-")
        hb = read_heartbeat(path)
        if rank is None:
            continue
        lines.append(f"rank {rank}: " + ("unreadable" if hb is None else
                     f"step={hb.step} steps_done={hb.steps_done} phase={hb.phase} source={hb.source} "
                     f"collectives_done={hb.collectives_done}"))
        text = "\n".join(filter(None, (log_tail(layout.rank_log(attempt, rank), LOG_TAIL_LINES),
                                       log_tail(layout.rank_stdout(attempt, rank), LOG_TAIL_LINES))))
        tail = dest / f"log_tail_rank_{rank}.txt"
        write_private(tail, (text + "\n").encode())
        files.append(tail)
    if lines:
        write_private(dest / "heartbeats.txt", ("\n".join(lines) + "\n").encode())
        files.append(dest / "heartbeats.txt")
    return [str(p.relative_to(layout.root)) for p in files]


def lost_records(layout: RunLayout, host: str, attempt: int, lost: list[LostNode], wall: float, step: int | None,
                 timeout_seconds: float) -> tuple[FailureDetected, Diagnosis, *tuple[NodeExcluded, ...]]:
    """What the agent that claimed a node loss records: ``FailureDetected`` (kind ``node-lost``, the lost nodes
    and their ranks), a ``Diagnosis`` and a ``NodeExcluded`` per lost node (from the next attempt). Keeps the
    lost nodes' evidence on the way (the caller marks them lost: `mark_lost`)."""
    members = attempt_nodes(layout, attempt)
    names = tuple(sorted(n.node for n in lost))
    ranks = tuple(sorted(r for n in names for r in members.get(n, [])))
    files = tuple(f for n in names for f in keep_evidence(layout, n, attempt))
    detail = "; ".join(f"node {n.node}: its agent stopped beating {n.silent_seconds:.1f}s ago (last beat: pid "
                       f"{n.last.pid if n.last else '?'}, attempt {n.last.attempt if n.last else '?'})" for n in lost)
    failure = FailureDetected(time=wall, host=host, attempt=attempt, kind="node-lost", ranks=ranks, hosts=names,
                              step=step, evidence=files, detail=detail,
                              detection_latency_seconds=max(n.silent_seconds for n in lost))
    diagnosis = Diagnosis(time=time.time(), host=host, attempt=attempt, category="Unknown", group="Unknown",
                          verdict="node-lost", culprit_ranks=ranks, culprit_hosts=names, confidence=0.9,
                          explanation=detail, evidence=files)
    excluded = tuple(NodeExcluded(time=time.time(), host=host, node=name, attempt=attempt + 1,
                                  reason=f"lost: no agent beat for {timeout_seconds:g}s") for name in names)
    return (failure, diagnosis, *excluded)


def mark_lost(run_dir: Path, node: str, reason: str) -> bool:
    """Record ``node`` as lost (True when this call wrote the marker)."""
    try:
        return create_exclusive(lost_marker(run_dir, node), f"{reason}\n".encode())
    except OSError as exc:
        log.warning("cannot write the lost-node marker of %s: %s", node, exc)
        return False


def lost_reasons(run_dir: Path, node: str) -> list[str]:
    """Why this node must leave: the others recorded it as lost (it was stopped or cut off, and came back)."""
    path = lost_marker(run_dir, node)
    if not path.exists():
        return []
    with contextlib.suppress(OSError):
        return [f"node lost: {path.read_text().strip()}"]
    return ["node lost"]


def wait_unless_lost(wait: Callable[[], object], observe: Callable[[], list[LostNode]],
                     poll_seconds: float = 0.5) -> list[LostNode]:
    """Run ``wait`` (torch's exit barrier) on a thread until it returns, or until ``observe`` finds a peer node lost:
    a killed agent never arrives at the barrier. Returns the lost nodes (empty: ``wait`` returned)."""
    done = threading.Event()

    def run() -> None:
        try:
            wait()
        finally:
            done.set()

    threading.Thread(target=run, name="trainguard-exit-barrier", daemon=True).start()
    while not done.wait(poll_seconds):
        lost = observe()
        if lost:
            return lost
    return []
