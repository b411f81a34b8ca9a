"""Whether the c10d rendezvous endpoint names this host, counting every address of every interface.

torch decides whether an agent hosts the c10d rendezvous store by comparing the endpoint with the machine's host
name and the addresses that name resolves to (``_matches_machine_hostname``, which its docstring says "may
return a false negative if this machine has ... IP addresses assigned to secondary NICs"). An endpoint given as
the address of a second interface (an InfiniBand or cluster-network address, a container's own address) then
matches no agent: nobody hosts the store and every agent times out connecting to it. trainguard widens the
check to the addresses of this machine's interfaces, keeping torch's own answer where it already says yes and
its fallback to a client when the port is taken.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
from collections.abc import Callable

import psutil

log = logging.getLogger(__name__)

_installed = False


def interface_addresses() -> set[str]:
    """Every IPv4/IPv6 address on this machine's interfaces (in this network namespace)."""
    out: set[str] = set()
    with contextlib.suppress(OSError):
        for addrs in psutil.net_if_addrs().values():
            for addr in addrs:
                if addr.family in (socket.AF_INET, socket.AF_INET6):
                    out.add(addr.address.split("%", 1)[0])
    return out


def names_this_host(host: str, addresses: set[str] | None = None) -> bool:
    """``host`` (a name or an address) resolves to an address of one of this machine's interfaces."""
    local = interface_addresses() if addresses is None else addresses
    try:
        candidates = {str(ipaddress.ip_address(host))}
    except ValueError:
        try:
            candidates = {str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
        except (OSError, UnicodeError):
            return False
    return any(not ipaddress.ip_address(c).is_loopback and c in local for c in candidates)


def recognise_interface_addresses() -> None:
    """Make torch's c10d backend count this machine's interface addresses when it guesses ``is_host`` (once per
    process; an explicit ``--rdzv-conf is_host=...`` still wins, as in torch)."""
    global _installed
    if _installed:
        return
    try:
        from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as backend
    except ImportError:
        return
    original: Callable[[str], bool] | None = getattr(backend, "_matches_machine_hostname", None)
    if original is None:
        log.debug("this torch decides is_host differently; endpoint matching left to it")
        return

    def matches(host: str) -> bool:
        return bool(original(host)) or names_this_host(host)

    backend._matches_machine_hostname = matches
    _installed = True
