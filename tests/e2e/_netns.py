"""Hosts made on this machine: each host a network namespace with its own address on a bridge, so that agents
of one job reach each other over real links that can be cut, slowed or lost (tests/e2e, benchmarks/scale.py).

Needs root (CAP_NET_ADMIN), iproute2 and tc, and a cgroup-v1 CPU controller for starved hosts. The bridge lives in a
namespace of its own ("the switch"), so nothing is added to this machine's own network, and every name carries
the creating process's pid, so concurrent tests never meet and a crashed run's leftovers are swept next time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

SUBNET_PREFIX = "10.201"
"""Addresses are ``10.201.X.Y/16``: private, and unlikely to meet anything this machine routes to."""

_PREFIX = "tgh"
_CPU_CGROUP = Path("/sys/fs/cgroup/cpu")
_LEFTOVER = re.compile(rf"^{_PREFIX}(\d+)-")


@dataclass(frozen=True)
class Host:
    """One made host."""

    index: int
    """Its position, 0 first."""
    name: str
    """``host<index>``: the node id its agent is given."""
    netns: str
    """Its network namespace (``ip netns`` name)."""
    address: str
    """Its address on the bridge."""
    switch_port: str
    """The switch-side end of its link, an interface in the switch namespace (cut it to partition the host)."""


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def sweep_leftovers() -> None:
    """Delete namespaces (and the processes in them) that a process no longer alive made."""
    for ns in _namespaces():
        match = _LEFTOVER.match(ns)
        if match and not _alive(int(match.group(1))):
            _delete(ns)


def _pids(ns: str) -> list[int]:
    with contextlib.suppress(subprocess.CalledProcessError):
        return [int(p) for p in _ip("netns", "pids", ns).split()]
    return []


def _delete(ns: str) -> None:
    for pid in _pids(ns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.CalledProcessError):
        _ip("netns", "del", ns)
    group = _CPU_CGROUP / ns
    if group.is_dir():
        for member in (group / "cgroup.procs").read_text().split():  # processes left there go back to the root group
            with contextlib.suppress(OSError):
                (_CPU_CGROUP / "cgroup.procs").write_text(member)
        with contextlib.suppress(OSError):
            group.rmdir()


def address_of(index: int) -> str:
    """Host ``index``'s address (10 upwards; 200 hosts per third octet)."""
    return f"{SUBNET_PREFIX}.{index // 200}.{index % 200 + 10}"


class HostNet:
    """``count`` hosts on one bridge; a context manager that removes them (and whatever runs in them) on exit."""

    def __init__(self, count: int, *, extra: Sequence[str] = ()) -> None:
        self.tag = f"{_PREFIX}{os.getpid()}-{time.monotonic_ns() % 100_000}"
        self.switch = f"{self.tag}-sw"
        names = [f"host{i}" for i in range(count)] + list(extra)
        self.hosts = [Host(i, name, f"{self.tag}-{name}", address_of(i), f"p{i}") for i, name in enumerate(names)]

    def __enter__(self) -> HostNet:
        sweep_leftovers()
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for host in self.hosts:
                _ip("netns", "add", host.netns)
                _ip("-n", self.switch, "link", "add", host.switch_port, "type", "veth", "peer", "name", "eth0",
                    "netns", host.netns)
                _ip("-n", self.switch, "link", "set", host.switch_port, "master", "br0", "up")
                _ip("-n", host.netns, "addr", "add", f"{host.address}/16", "dev", "eth0")
                _ip("-n", host.netns, "link", "set", "eth0", "up")
                _ip("-n", host.netns, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        for host in self.hosts:
            _delete(host.netns)
        _delete(self.switch)

    def __getitem__(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def command(self, host: Host, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace (same filesystem and process table as this machine)."""
        return ["ip", "netns", "exec", host.netns, *argv]

    def pids(self, host: Host) -> list[int]:
        """Every process in the host (agent, workers, spares)."""
        return _pids(host.netns)

    def kill(self, host: Host) -> list[int]:
        """The host dies: SIGKILL to every process in it at once."""
        pids = self.pids(host)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def set_link(self, host: Host, *, up: bool) -> None:
        """Cut (or restore) the host's only link: a network partition of that one host."""
        _ip("-n", self.switch, "link", "set", host.switch_port, "up" if up else "down")

    def throttle_link(self, host: Host, *, rate_kbit: int) -> None:
        """Limit what the host sends to ``rate_kbit`` (a token bucket on its own end of the link). The kernel here
        lacks netem, so a slow link is a narrow one, not a delayed one."""
        subprocess.run(["ip", "netns", "exec", host.netns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
                        "rate", f"{rate_kbit}kbit", "burst", "16kbit", "latency", "2s"],
                       check=True, capture_output=True)

    def starve_cpu(self, host: Host, *, percent: int) -> None:
        """Give every process of the host (and what they start later) ``percent`` of one core: a host too busy to
        answer in time (a cgroup-v1 CPU quota, removed with the hosts)."""
        group = self._cpu_group(host)
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_quota_us").write_text(str(int(1000 * percent)))
        for pid in self.pids(host):
            with contextlib.suppress(OSError):
                (group / "cgroup.procs").write_text(str(pid))

    def _cpu_group(self, host: Host) -> Path:
        return _CPU_CGROUP / host.netns

    def link_counters(self, host: Host) -> dict[str, int]:
        """Bytes and packets through the host's link so far, as the switch sees them (``rx``: sent by the host)."""
        stats = json.loads(_ip("-n", self.switch, "-s", "-j", "link", "show", host.switch_port))[0]["stats64"]
        return {"rx_bytes": stats["rx"]["bytes"], "tx_bytes": stats["tx"]["bytes"],
                "rx_packets": stats["rx"]["packets"], "tx_packets": stats["tx"]["packets"]}


@contextlib.contextmanager
def hosts(count: int, *, extra: Sequence[str] = ()) -> Iterator[HostNet]:
    with HostNet(count, extra=extra) as net:
        yield net


def log_path(folder: Path, host: Host) -> Path:
    return folder / f"{host.name}.log"
