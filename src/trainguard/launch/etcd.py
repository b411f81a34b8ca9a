"""The etcd-v2 rendezvous option: torch's ``etcd-v2`` backend keeps the rendezvous state in an etcd server, so
no agent hosts it and losing any node (the first one included) leaves the rendezvous intact."""

from __future__ import annotations

import importlib.util
import logging

from trainguard.errors import UsageError

log = logging.getLogger(__name__)

DEFAULT_PORT = 2379
"""etcd's client port, the port of an ``--rdzv-endpoint`` that names none."""


def require_client() -> None:
    """Refuse the backend with one line when python-etcd (the client torch's etcd backends import) is missing.

    torch falls back to a stub module then, which fails only at the first rendezvous with an ImportError."""
    if importlib.util.find_spec("etcd") is None:
        raise UsageError("--rdzv-backend etcd-v2 needs the python-etcd package (pip install python-etcd) "
                         "and an etcd server started with --enable-v2")


def check_conf(conf: dict[str, str]) -> None:
    """The etcd client speaks http or https to the endpoint; nothing else."""
    protocol = conf.get("protocol")
    if protocol is not None and protocol.lower() not in ("http", "https"):
        raise UsageError(f"--rdzv-conf: protocol must be http or https, got {protocol!r}")
