"""The metrics endpoint lives inside the agent: idle, trickling or abundant connections cost it neither threads
nor an answer to the real scraper.

prometheus_client's server started one thread per connection and an idle connection kept it: 120 idle
sockets took an agent from 11 to 131 threads.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from trainguard.samples import SAMPLE_RUN
from trainguard.web import metrics
from trainguard.web.metrics import MetricsServer


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    s = MetricsServer("127.0.0.1", 0)
    s.follow(SAMPLE_RUN, "n0")
    try:
        yield s
    finally:
        s.close()


def scrape(server: MetricsServer, timeout: float = 5.0) -> str:
    host, port = server.address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as resp:
        assert resp.status == 200
        return resp.read().decode()


def idle_sockets(server: MetricsServer, n: int) -> list[socket.socket]:
    return [socket.create_connection(server.address, timeout=5) for _ in range(n)]


def closed_by_server(sock: socket.socket, wait: float) -> bool:
    sock.settimeout(wait)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_idle_connections_pin_no_thread_and_a_scrape_still_answers(server: MetricsServer) -> None:
    scrape(server)  # every thread the server will ever use exists now
    before = threading.active_count()
    socks = idle_sockets(server, 50)
    try:
        time.sleep(1.0)  # long enough for a thread-per-connection server to have started all 50
        assert threading.active_count() <= before + 1, (before, threading.active_count())
        started = time.monotonic()
        text = scrape(server)
        assert time.monotonic() - started < 3.0
        assert "trainguard_step 600.0" in text
        assert threading.active_count() <= before + 1
    finally:
        for s in socks:
            s.close()


def test_a_silent_or_trickling_client_is_closed_after_the_request_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "REQUEST_SECONDS", 0.5)
    server = MetricsServer("127.0.0.1", 0)
    try:
        silent = socket.create_connection(server.address, timeout=5)
        trickle = socket.create_connection(server.address, timeout=5)
        trickle.sendall(b"GET /metrics HTTP/1.1\r\n")
        for _ in range(3):  # a byte now and then resets no timer: the time counts from the accept
            time.sleep(0.2)
            trickle.sendall(b"X")
        assert closed_by_server(silent, 2.0)
        assert closed_by_server(trickle, 2.0)
    finally:
        server.close()


def test_more_connections_than_may_wait_close_the_oldest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "MAX_PENDING", 16)
    server = MetricsServer("127.0.0.1", 0)
    server.follow(SAMPLE_RUN, "n0")
    socks = idle_sockets(server, 40)
    try:
        time.sleep(0.5)
        assert "trainguard_run_info" in scrape(server)
        closed = sum(closed_by_server(s, 0.2) for s in socks)
        assert closed >= 40 - 16, closed  # each waiting one holds a descriptor of the agent: at most 16 do
    finally:
        for s in socks:
            s.close()
        server.close()


def test_http_details(server: MetricsServer) -> None:
    host, port = server.address
    req = urllib.request.Request(f"http://{host}:{port}/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.headers["Content-Encoding"] == "gzip"
        assert b"trainguard_step" in gzip.decompress(resp.read())
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(b"HEAD /metrics HTTP/1.0\r\n\r\n")
        answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"\r\n\r\n")  # headers only
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(b"POST /metrics HTTP/1.0\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.0 405")
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(b"garbage\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.0 400")
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\n" + b"X-Long: " + b"a" * 10_000 + b"\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.0 431")
