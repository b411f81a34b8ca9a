"""Prometheus metrics of a supervised run (``trainguard run --metrics-port``), read from the run's own events.

A collector follows ``events/*.jsonl`` as they grow, so the supervisor needs no calls of its own: the
numbers are the ones ``trainguard report`` would give at that moment. Names and meanings: docs/dashboard.md.

The endpoint lives inside the supervising agent, so no client may cost it more than a bounded share:
`ScrapeServer` answers with a fixed number of threads and reads requests without blocking any of them
(prometheus_client's own server started a thread per connection, and every idle connection kept one).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import importlib.util
import logging
import math
import queue
import selectors
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainguard.accounting.goodput import BUCKETS, compute_goodput
from trainguard.core.eventlog import EventFollower
from trainguard.core.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaveFinished,
    CheckpointSaveStarted,
    Diagnosis,
    Event,
    FailureDetected,
    NodeExcluded,
    PlannedInterruption,
    RunEnded,
    RunStarted,
    StepCompleted,
    StepSpan,
)
from trainguard.core.rundir import LoadedEvent
from trainguard.errors import InputError, UsageError

log = logging.getLogger(__name__)

RATE_WINDOW_SECONDS = 60.0
"""Steps per second are counted over this much of the latest wall time."""
ETTR_EVERY_SECONDS = 5.0
"""The goodput accounting behind ETTR and badput is redone at most this often (it reads every record)."""
MAX_SUSPECT_HOSTS = 1000
"""Distinct hosts given their own label in ``trainguard_suspected_total``; later ones are counted as ``other``."""
_CATCH_UP_READS = 64
"""Chunks (4 MiB each) read per event file per scrape when catching up with a long run."""
SCRAPE_THREADS = 4
"""Threads that answer complete requests: a scrape is one short request, and the collector serves one at a time."""
MAX_PENDING = 128
"""Connections that may wait for their request at once; a new one beyond this closes the oldest waiting one
(each holds a file descriptor of the agent)."""
REQUEST_SECONDS = 10.0
"""Time a connection has, from its accept, to send its whole request head; then it is closed. An idle or
trickling client (slowloris) costs one descriptor for this long, never a thread."""
SEND_SECONDS = 10.0
"""Timeout of each send of a response (a client that stops reading does not keep a thread longer)."""
MAX_REQUEST_BYTES = 8192
"""A request head longer than this is refused (431)."""


class RunMetrics:
    """The state behind the metrics, updated from the records appended to a run's event files since last time."""

    def __init__(self, run_dir: str | Path, *, node: str = "", clock: Callable[[], float] = time.time,
                 ettr_every: float = ETTR_EVERY_SECONDS) -> None:
        self.run_dir = Path(run_dir)
        self.node = node
        self.clock = clock
        self.ettr_every = ettr_every
        self._followers: dict[str, EventFollower] = {}
        self._records: list[LoadedEvent] = []
        self._lines: dict[str, int] = defaultdict(int)
        self.run_id = ""
        self.attempt = 0
        self.attempt_start: dict[int, float] = {}
        self.step = 0
        self._done: deque[tuple[float, int, int]] = deque()  # (time, steps, attempt) of first completions
        self._seen_steps: set[tuple[int, int]] = set()
        self.failures: dict[int, FailureDetected] = {}
        self.planned: set[int] = set()
        self.diagnoses: dict[int, Diagnosis] = {}
        self.settled: set[int] = set()
        self.interruptions: dict[tuple[str, str], int] = defaultdict(int)
        self.failures_by_kind: dict[str, int] = defaultdict(int)
        self.save_started: dict[tuple[int, int, str], float] = {}
        self.saves: dict[tuple[int, int, str], dict[str, Any]] = {}
        """By (attempt, step, tier): a step storage saved can also be copied to the memory tier."""
        self.suspects: dict[tuple[str, str], int] = defaultdict(int)
        self._suspect_keys: set[tuple[str, int | None, str]] = set()
        self._goodput: dict[str, Any] | None = None
        self._goodput_at = -math.inf
        self._goodput_count = -1
        self._goodput_cost = 0.0

    # --- reading ------------------------------------------------------------------------------------

    def poll(self) -> int:
        """Read what was appended since the last call; returns how many records were new."""
        events = self.run_dir / "events"
        try:
            names = sorted(p.name for p in events.iterdir() if p.suffix == ".jsonl")
        except OSError:
            return 0
        new = 0
        for name in names:
            follower = self._followers.setdefault(name, EventFollower(events / name))
            writer = name[: -len(".jsonl")]
            for _ in range(_CATCH_UP_READS):
                batch = follower.new_records()
                if not batch:
                    break
                for record in batch:
                    self._lines[writer] += 1
                    self._records.append(LoadedEvent(writer, self._lines[writer], record))
                    self._apply(record)
                new += len(batch)
        return new

    def _apply(self, e: Event) -> None:
        # isinstance chains (not a table) so each handler sees its record's own type.
        if isinstance(e, RunStarted):
            self.run_id = e.run_id
            self.attempt_start.setdefault(0, e.time)
        elif isinstance(e, AttemptStarted):
            self._attempt_started(e)
        elif isinstance(e, (StepCompleted, StepSpan)):
            self._steps_done(e)
        elif isinstance(e, FailureDetected):
            self._failed(e)
        elif isinstance(e, PlannedInterruption):
            self.planned.add(e.attempt)
        elif isinstance(e, AttemptEnded):
            if e.reason in ("failure", "planned"):
                self._settle(e.attempt)
        elif isinstance(e, RunEnded):
            self._settle_before(None)
        else:
            self._apply_finding(e)

    def _apply_finding(self, e: Event) -> None:
        """The records besides an attempt's course: diagnoses, checkpoint saves, suspect nodes."""
        if isinstance(e, Diagnosis):
            self._diagnosed(e)
        elif isinstance(e, CheckpointSaveStarted):
            self.save_started.setdefault((e.attempt, e.step, e.tier), e.time)
        elif isinstance(e, CheckpointSaveFinished):
            self._save_finished(e)
        elif isinstance(e, NodeExcluded):
            self._suspect(e.node, e.attempt, "excluded")
        elif e.TYPE == "straggler_detected":
            node = getattr(e, "node", "")
            if isinstance(node, str) and node:
                self._suspect(node, getattr(e, "attempt", None), "straggler")

    def _failed(self, e: FailureDetected) -> None:
        if e.attempt not in self.failures:  # the first failure ends the attempt
            self.failures[e.attempt] = e
            self.failures_by_kind[e.kind] += 1

    def _attempt_started(self, e: AttemptStarted) -> None:
        self.attempt_start[e.attempt] = e.time
        if e.attempt >= self.attempt:
            self.attempt, self.step = e.attempt, e.resume_step or 0
        self._settle_before(e.attempt)

    def _settle_before(self, attempt: int | None) -> None:
        """Settle every interrupted attempt before ``attempt`` (all of them for None)."""
        for a in list(self.failures) + list(self.planned):
            if attempt is None or a < attempt:
                self._settle(a)

    def _steps_done(self, e: StepCompleted | StepSpan) -> None:
        first, last = (e.step, e.step) if isinstance(e, StepCompleted) else (e.first_step, e.last_step)
        if (e.attempt, last) not in self._seen_steps:
            self._seen_steps.add((e.attempt, last))
            self._done.append((e.time, last - first + 1, e.attempt))
        if e.attempt == self.attempt:
            self.step = max(self.step, last)
        elif e.attempt > self.attempt:
            self.attempt, self.step = e.attempt, last

    def _diagnosed(self, e: Diagnosis) -> None:
        best = self.diagnoses.get(e.attempt)
        if best is None or e.confidence > best.confidence:
            self.diagnoses[e.attempt] = e
        for host in e.culprit_hosts:
            self._suspect(host, e.attempt, "culprit")

    def _save_finished(self, e: CheckpointSaveFinished) -> None:
        s = self.saves.setdefault((e.attempt, e.step, e.tier), {"time": e.time, "ok": True, "blocking": 0.0,
                                                        "total": 0.0, "step": e.step})
        s["time"] = max(s["time"], e.time)
        s["ok"] = s["ok"] and e.ok
        s["blocking"] = max(s["blocking"], e.blocking_seconds)
        s["total"] = max(s["total"], e.total_seconds)

    def _settle(self, attempt: int) -> None:
        """Count an interruption once its attempt is over, with the diagnosis it ended with."""
        if attempt in self.settled or (attempt not in self.failures and attempt not in self.planned):
            return
        self.settled.add(attempt)
        if attempt in self.failures:
            d = self.diagnoses.get(attempt)
            key = (d.category, d.group) if d else ("Unknown", "Unknown")
        else:
            key = ("Planned", "Planned")
        self.interruptions[key] += 1

    def _suspect(self, host: str, attempt: int | None, reason: str) -> None:
        if (host, attempt, reason) in self._suspect_keys:
            return
        self._suspect_keys.add((host, attempt, reason))
        known = {h for h, _ in self.suspects}
        label = host if host in known or len(known) < MAX_SUSPECT_HOSTS else "other"
        self.suspects[(label, reason)] += 1

    def _save_metrics(self, now: float, tier: str, counter: str, last_name: str, what: str) -> Iterator[Any]:
        """The saves of one tier (storage ``""`` or ``memory``): counts by outcome and the newest successful one.
        The tiers stay apart: a memory copy every few steps must not make storage look fresh."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # optional dependency, as above

        saves = CounterMetricFamily(counter, f"{what.capitalize()} saves finished, by outcome.", labels=["outcome"])
        done = sorted(((k, s) for k, s in self.saves.items() if k[2] == tier), key=lambda kv: kv[1]["time"])
        saves.add_metric(["ok"], sum(1 for _, s in done if s["ok"]))
        saves.add_metric(["failed"], sum(1 for _, s in done if not s["ok"]))
        yield saves
        ok = [(k, s) for k, s in done if s["ok"]]
        if not ok:
            return
        key, last = ok[-1]
        done_word = "durable" if not tier else "checksummed and replicated"
        yield GaugeMetricFamily(f"{last_name}_step", f"Step of the newest successful {what}.", value=last["step"])
        yield GaugeMetricFamily(f"{last_name}_age_seconds", f"Time since the newest successful {what} was "
                                f"{done_word}.", value=max(now - last["time"], 0.0))
        yield GaugeMetricFamily(f"{last_name}_save_seconds", f"Time training stopped for the newest successful "
                                f"{what} (blocking part of the save).", value=last["blocking"])
        commit = last["total"] or last["time"] - self.save_started.get(key, last["time"])
        yield GaugeMetricFamily(f"{last_name}_commit_seconds", f"From the start of the newest successful {what} "
                                f"until it was {done_word}.", value=commit)

    # --- derived figures ----------------------------------------------------------------------------

    def steps_per_second(self, now: float) -> float:
        while self._done and self._done[0][0] <= now - RATE_WINDOW_SECONDS:
            self._done.popleft()
        started = self.attempt_start.get(self.attempt)
        window = RATE_WINDOW_SECONDS if started is None else min(RATE_WINDOW_SECONDS, max(now - started, 1e-3))
        # Only the current attempt: steps an interrupted attempt ran before the restart are not progress now.
        return sum(n for t, n, a in self._done if t <= now and a == self.attempt) / window

    def goodput(self, now: float) -> dict[str, Any] | None:
        """ETTR so far, productive, wall and badput seconds. Redone when records came in, at most every
        `ettr_every` seconds and never more than a tenth of the time (it reads every record of the run)."""
        due = self._goodput is None or now - self._goodput_at >= max(self.ettr_every, 10 * self._goodput_cost)
        if len(self._records) != self._goodput_count and due:
            started = time.monotonic()
            try:
                r = compute_goodput(list(self._records))
            except InputError:  # no usable record yet
                return self._goodput
            self._goodput_cost = time.monotonic() - started
            self._goodput_at, self._goodput_count = now, len(self._records)
            self._goodput = {"ettr": r.ettr, "productive": r.productive_seconds, "wall": r.wall_seconds,
                             "badput": dict(r.badput_seconds)}
        return self._goodput

    def families(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        now = self.clock()
        yield InfoMetricFamily("trainguard_run", "The supervised run.",
                               value={"run_id": self.run_id or self.run_dir.name, "node": self.node})
        yield GaugeMetricFamily("trainguard_step", "Highest training step completed in the current attempt "
                                "(the restored step right after a restart).", value=self.step)
        yield GaugeMetricFamily("trainguard_steps_per_second", "Training steps the current attempt completed per "
                                f"second over the last {RATE_WINDOW_SECONDS:g} s (or since it started).",
                                value=self.steps_per_second(now))
        yield GaugeMetricFamily("trainguard_attempt", "Current attempt (0 = first launch, +1 per restart).",
                                value=self.attempt)
        yield CounterMetricFamily("trainguard_restarts", "Restarts of the workers (attempts after the first).",
                                  value=len([a for a in self.attempt_start if a > 0]))
        gp = self.goodput(now)
        if gp is not None:
            yield GaugeMetricFamily("trainguard_ettr_ratio", "Effective training time ratio so far: productive "
                                    "training time / wall time (as trainguard report).", value=gp["ettr"])
            yield GaugeMetricFamily("trainguard_productive_seconds", "Productive training time so far.",
                                    value=gp["productive"])
            yield GaugeMetricFamily("trainguard_wall_seconds", "Wall time of the run so far.", value=gp["wall"])
            badput = GaugeMetricFamily("trainguard_badput_seconds", "Lost time so far by bucket (docs/goodput.md).",
                                       labels=["bucket"])
            for bucket in BUCKETS:
                badput.add_metric([bucket], gp["badput"].get(bucket, 0.0))
            yield badput
        kinds = CounterMetricFamily("trainguard_failures_detected", "Failures detected, by kind, at detection "
                                    "(one per attempt).", labels=["kind"])
        for kind, n in sorted(self.failures_by_kind.items()):
            kinds.add_metric([kind], n)
        yield kinds
        inter = CounterMetricFamily("trainguard_interruptions", "Interruptions by root-cause category and group "
                                    "(Llama 3 Table 5; Planned for planned stops), counted when their attempt ends.",
                                    labels=["category", "group"])
        for (category, group), n in sorted(self.interruptions.items()):
            inter.add_metric([category, group], n)
        yield inter
        yield from self._save_metrics(now, "", "trainguard_checkpoint_saves", "trainguard_last_checkpoint",
                                      "checkpoint")
        yield from self._save_metrics(now, "memory", "trainguard_memory_checkpoint_saves",
                                      "trainguard_last_memory_checkpoint", "memory-tier copy")
        suspects = CounterMetricFamily("trainguard_suspected", "Times a host was blamed: culprit of a diagnosis, "
                                       "named straggler, or excluded (once per attempt and reason).",
                                       labels=["host", "reason"])
        for (host, reason), n in sorted(self.suspects.items()):
            suspects.add_metric([host, reason], n)
        yield suspects


class RunCollector:
    """A prometheus_client collector over `RunMetrics`: every scrape reads the new events first."""

    def __init__(self, metrics: RunMetrics) -> None:
        self.metrics = metrics
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Any]:
        with self._lock:  # scrapes may come concurrently; the state is not thread-safe
            try:
                self.metrics.poll()
            except Exception:  # a scrape must never take the supervisor down
                log.warning("metrics: reading the run's events failed", exc_info=True)
            yield from list(self.metrics.families())


def parse_listen(text: str) -> tuple[str, int]:
    """``PORT`` (on 127.0.0.1) or ``ADDR:PORT`` / ``[V6]:PORT``; argparse type of ``--metrics-port``."""
    value = str(text).strip()
    addr, sep, port = value.rpartition(":")
    if not sep:
        addr, port = "127.0.0.1", value
    addr = addr.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"--metrics-port must be PORT or ADDR:PORT (port 0-65535), not {text!r}")
    return addr, int(port)


class _Waiting:
    """A connection whose request head is still arriving."""

    __slots__ = ("data", "deadline")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.data = bytearray()


class ScrapeServer:
    """``/metrics`` of a registry over HTTP/1.0, with a bounded cost whatever clients do.

    One selector thread accepts connections and reads their request heads without blocking; only a complete
    head goes to one of `SCRAPE_THREADS` threads, which answers and closes the connection. A connection that
    has not sent its head within `REQUEST_SECONDS` of its accept is closed, and at most `MAX_PENDING` wait at
    once (the oldest is closed first). So idle sockets cost a descriptor for a while and never a thread, and
    a scrape is answered while hundreds of them are open.
    """

    def __init__(self, addr: str, port: int, registry: Any) -> None:
        self.registry = registry
        family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM,
                                                       flags=socket.AI_PASSIVE)[0]
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(sockaddr)
            listener.listen(128)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self.server_address: tuple[Any, ...] = listener.getsockname()
        self._wake_r, self._wake_w = socket.socketpair()
        self._work: queue.Queue[tuple[socket.socket, bytes] | None] = queue.Queue(maxsize=4 * SCRAPE_THREADS)
        self._threads = [threading.Thread(target=self._loop, name="trainguard-metrics", daemon=True)]
        self._threads += [threading.Thread(target=self._answer_loop, name=f"trainguard-metrics-{i}", daemon=True)
                          for i in range(SCRAPE_THREADS)]
        for t in self._threads:
            t.start()

    # --- the selector thread: accept, read request heads, hand complete ones over ----------------------

    def _loop(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, "accept")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        waiting: dict[socket.socket, _Waiting] = {}  # insertion order = accept order: the oldest first

        def drop(conn: socket.socket) -> None:
            sel.unregister(conn)
            del waiting[conn]
            conn.close()

        try:
            while True:
                now = time.monotonic()
                timeout = max(0.0, min(w.deadline for w in waiting.values()) - now) if waiting else None
                for key, _ in sel.select(timeout):
                    if key.data == "wake":
                        return
                    if key.data == "accept":
                        self._accept(sel, waiting, drop)
                        continue
                    conn = key.fileobj
                    assert isinstance(conn, socket.socket)
                    self._read(conn, waiting[conn], sel, waiting, drop)
                now = time.monotonic()
                for conn in [c for c, w in waiting.items() if w.deadline <= now]:
                    drop(conn)  # idle or trickling past its time
        except Exception:  # the endpoint must never take the agent down; it stops answering instead
            log.warning("metrics: the server loop stopped", exc_info=True)
        finally:
            for conn in list(waiting):
                drop(conn)
            sel.close()

    def _accept(self, sel: selectors.BaseSelector, waiting: dict[socket.socket, _Waiting],
                drop: Callable[[socket.socket], None]) -> None:
        for _ in range(MAX_PENDING):  # everything queued in the backlog, in one go
            try:
                conn, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of descriptors (EMFILE): free the oldest, try again later
                log.debug("metrics: accept: %s", exc)
                if waiting:
                    drop(next(iter(waiting)))
                else:
                    time.sleep(0.05)  # nothing of ours to free: do not spin on a listener that stays readable
                return
            conn.setblocking(False)
            if len(waiting) >= MAX_PENDING:
                drop(next(iter(waiting)))
            waiting[conn] = _Waiting(time.monotonic() + REQUEST_SECONDS)
            sel.register(conn, selectors.EVENT_READ, "conn")

    def _read(self, conn: socket.socket, w: _Waiting, sel: selectors.BaseSelector,
              waiting: dict[socket.socket, _Waiting], drop: Callable[[socket.socket], None]) -> None:
        try:
            chunk = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            drop(conn)
            return
        w.data += chunk
        if b"\r\n\r\n" not in w.data and b"\n\n" not in w.data and len(w.data) <= MAX_REQUEST_BYTES:
            return
        sel.unregister(conn)
        del waiting[conn]
        try:
            self._work.put_nowait((conn, bytes(w.data)))
        except queue.Full:  # every answering thread busy and a queue behind them: say so rather than wait
            _send(conn, _response(503, "Service Unavailable", b"busy\n"))

    # --- the answering threads -------------------------------------------------------------------------

    def _answer_loop(self) -> None:
        while (item := self._work.get()) is not None:
            conn, head = item
            try:
                _send(conn, self.respond(head))
            except Exception:  # one bad scrape must not end the thread
                log.warning("metrics: a scrape failed", exc_info=True)
                with contextlib.suppress(OSError):
                    conn.close()

    def respond(self, head: bytes) -> bytes:
        """The whole HTTP response to one request head (GET or HEAD of any path, as prometheus_client)."""
        from prometheus_client.exposition import choose_encoder

        if len(head) > MAX_REQUEST_BYTES:
            return _response(431, "Request Header Fields Too Large", b"request head too long\n")
        lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
        request = lines[0].split()
        if len(request) != 3 or not request[2].startswith("HTTP/"):
            return _response(400, "Bad Request", b"bad request\n")
        method = request[0]
        if method not in ("GET", "HEAD"):
            return _response(405, "Method Not Allowed", b"only GET\n", [("Allow", "GET, HEAD")])
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        body = encoder(self.registry)
        extra = [("Content-Type", content_type)]
        if "gzip" in headers.get("accept-encoding", ""):
            body = gzip.compress(body)
            extra.append(("Content-Encoding", "gzip"))
        return _response(200, "OK", body, extra, head_only=method == "HEAD")

    def close(self) -> None:
        """Stop answering; connections still waiting are closed."""
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._threads[0].join(timeout=5)
        for _ in self._threads[1:]:
            with contextlib.suppress(queue.Full):
                self._work.put(None, timeout=1)
        for t in self._threads[1:]:
            t.join(timeout=SEND_SECONDS)
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()


def _response(code: int, reason: str, body: bytes, headers: list[tuple[str, str]] | None = None, *,
              head_only: bool = False) -> bytes:
    fields = [("Content-Type", "text/plain; charset=utf-8")] if headers is None or not any(
        k == "Content-Type" for k, _ in headers) else []
    fields += [*(headers or []), ("Content-Length", str(len(body))), ("Connection", "close")]
    start = f"HTTP/1.0 {code} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields) + "\r\n"
    return start.encode("latin-1") + (b"" if head_only else body)


def _send(conn: socket.socket, data: bytes) -> None:
    """Send and close; a client that stops reading is given up after `SEND_SECONDS` per send."""
    try:
        conn.setblocking(True)
        conn.settimeout(SEND_SECONDS)
        conn.sendall(data)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        conn.close()


class MetricsServer:
    """The ``/metrics`` endpoint (a `ScrapeServer`, bounded threads) for one run directory."""

    def __init__(self, addr: str, port: int) -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=False)
        try:
            self._server = ScrapeServer(addr, port, self.registry)
        except OSError as exc:
            raise UsageError(f"--metrics-port: cannot listen on {addr}:{port}: {exc.strerror or exc}") from None
        self.address = self._server.server_address[:2]
        self.collector: RunCollector | None = None

    def follow(self, run_dir: str | Path, node: str = "") -> RunMetrics:
        """Start serving the metrics of ``run_dir`` (before this, ``/metrics`` is empty)."""
        metrics = RunMetrics(run_dir, node=node)
        self.collector = RunCollector(metrics)
        self.registry.register(self.collector)
        return metrics

    def close(self) -> None:
        self._server.close()


def start(listen: tuple[str, int] | None) -> MetricsServer | None:
    """The server for ``--metrics-port`` (None when not asked for); binds now, so a taken port fails early."""
    if listen is None:
        return None
    if importlib.util.find_spec("prometheus_client") is None:
        raise UsageError("--metrics-port needs the web extra (missing: prometheus_client): "
                         "pip install 'trainguard[web]'")
    return MetricsServer(*listen)
