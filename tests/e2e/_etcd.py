"""A real etcd server for rendezvous tests: Debian's etcd (scripts/setup installs it) with the v2 API that torch's
``etcd-v2`` backend speaks, on free loopback ports, its data in a temporary folder."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e._run_helpers import free_port


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[str]:
    """``127.0.0.1:<port>`` of a fresh etcd server, stopped (and its data removed with tmp_path) afterwards."""
    binary = shutil.which("etcd")
    assert binary, "etcd is not installed: run scripts/setup (it installs Debian's etcd-server)"
    client, peer = free_port(), free_port()
    log = (tmp_path / "etcd.log").open("wb")
    proc = subprocess.Popen([
        binary, "--enable-v2", "--name", "tg", "--data-dir", str(tmp_path / "etcd-data"),
        "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"tg=http://127.0.0.1:{peer}", "--log-level", "warn",
    ], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "etcd.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{client}/v2/keys/", timeout=1) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "etcd did not start within 30 s"
            time.sleep(0.2)
        yield f"127.0.0.1:{client}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
