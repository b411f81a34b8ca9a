"""A c10d rendezvous on a loopback endpoint whose store listens on loopback only.

torch's c10d backend hosts its TCPStore on every interface of the machine, whatever host the endpoint names,
so ``--standalone`` (and any ``127.0.0.1``/``localhost`` endpoint) exposed the job's store to the network.
Here the hosting agent binds the listening socket to the endpoint's loopback address itself and hands it to
the store (``TCPStore(master_listen_fd=...)``, public API); the handler is torch's own
(``dynamic_rendezvous.create_handler`` over a ``C10dRendezvousBackend``, its state signed:
`trainguard.launch.signed_rendezvous`), so the rendezvous is unchanged.
An agent that finds the port taken joins as a client, as torch's backend does.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_READ_TIMEOUT_SECONDS = 60


def loopback_host(endpoint: str) -> str | None:
    """The endpoint's host when it is a loopback address (``localhost`` counts as 127.0.0.1), else None."""
    host = endpoint.rsplit(":", 1)[0].strip("[]") if ":" in endpoint else endpoint
    if host == "localhost":
        return "127.0.0.1"
    try:
        return host if ipaddress.ip_address(host).is_loopback else None
    except ValueError:
        return None


def _store(host: str, port: int, read_timeout: float, host_it: bool) -> Any:
    import torch.distributed as dist

    timeout = timedelta(seconds=read_timeout)
    if host_it:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(1024)
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            log.debug("rendezvous port %d is taken: joining as a client", port)
        else:
            return dist.TCPStore(host, port, is_master=True, wait_for_workers=False, multi_tenant=True,
                                 timeout=timeout, master_listen_fd=sock.detach())
    return dist.TCPStore(host, port, is_master=False, timeout=timeout)


def loopback_server(timeout: timedelta, host: str = "127.0.0.1") -> Any:
    """A TCPStore hosted by this process on a free port of ``host`` only (torch's own server would listen on
    every interface): the in-process store, and the workers' store of a one-node job."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(1024)
        port = int(sock.getsockname()[1])
    except OSError:
        sock.close()
        raise
    return dist.TCPStore(host, port, is_master=True, wait_for_workers=False, multi_tenant=True, timeout=timeout,
                         master_listen_fd=sock.detach())


def loopback_store(params: Any, host: str) -> Any:
    """The c10d rendezvous store for ``params`` (a loopback endpoint), bound to ``host`` when this agent hosts it."""
    port = int(params.endpoint.rsplit(":", 1)[1])
    is_host = params.get_as_bool("is_host")
    read_timeout = params.get_as_int("read_timeout", DEFAULT_READ_TIMEOUT_SECONDS)
    return _store(host, port, read_timeout, host_it=is_host is not False)
