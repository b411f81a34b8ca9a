"""How this node meets the others (`Rendezvous`), decided from torchrun's rendezvous options, as torchrun does."""

from __future__ import annotations

import argparse
import logging
import re
from dataclasses import dataclass
from typing import Any

from trainguard.errors import UsageError

log = logging.getLogger(__name__)

DEFAULT_C10D_PORT = 29400
DEFAULT_MASTER_PORT = 29500


# --rdzv-conf keys torch's c10d and static rendezvous read, and the kind of value each takes.
_RDZV_CONF_KEYS = {
    "join_timeout": "int", "last_call_timeout": "int", "close_timeout": "int", "read_timeout": "int",
    "timeout": "int", "keep_alive_interval": "int", "keep_alive_max_attempt": "int", "is_host": "bool",
    "store_type": "tcp", "protocol": "text",
}
_HOST = re.compile(r"[A-Za-z0-9_.-]{1,253}")
_IPV6 = re.compile(r"[0-9A-Fa-f:.%A-Za-z]{2,64}")


def parse_endpoint(text: str, flag: str, default_port: int) -> tuple[str, int]:
    """``host[:port]`` or ``[ipv6][:port]``; `UsageError` for anything else."""
    value = text.strip()
    bad = UsageError(f"{flag} must be HOST[:PORT] (IPv6 in brackets: [ADDR]:PORT), got {text!r}")
    if value.startswith("["):
        addr, sep, rest = value[1:].partition("]")
        if not sep or not _IPV6.fullmatch(addr) or ":" not in addr or (rest and not rest.startswith(":")):
            raise bad
        host, port_text = addr, rest[1:] if rest else None
    else:
        host, sep, port_text_ = value.partition(":")
        if ":" in port_text_ or not _HOST.fullmatch(host):
            raise bad
        port_text = port_text_ if sep else None
    if port_text is None:
        return host, default_port
    if not port_text.isdigit() or not (1 <= int(port_text) <= 65535):
        raise UsageError(f"{flag}: the port must be a number from 1 to 65535, got {text!r}")
    return host, int(port_text)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_rdzv_conf(text: str) -> dict[str, str]:
    """torchrun's ``--rdzv-conf KEY=VALUE,...`` restricted to the keys torch's rendezvous reads."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not key or not value:
            raise UsageError(f"--rdzv-conf must be KEY=VALUE,..., got {part!r}")
        kind = _RDZV_CONF_KEYS.get(key)
        if kind is None:
            raise UsageError(f"--rdzv-conf: unknown key {key!r} (known: {', '.join(sorted(_RDZV_CONF_KEYS))})")
        if kind == "int" and not (value.isdigit() and 1 <= int(value) <= 86_400):
            raise UsageError(f"--rdzv-conf: {key} must be a whole number of seconds from 1 to 86400, got {value!r}")
        if kind == "bool" and value.lower() not in ("1", "0", "true", "false", "yes", "no", "y", "n", "on", "off"):
            raise UsageError(f"--rdzv-conf: {key} must be true or false, got {value!r}")
        if kind == "tcp" and value.lower() != "tcp":
            raise UsageError(f"--rdzv-conf: store_type must be tcp (the endpoint is host:port), got {value!r}")
        out[key] = value
    return out


def _int_arg(value: Any, flag: str, lo: int, hi: int) -> int:
    text = str(value).strip()
    if not re.fullmatch(r"-?[0-9]{1,9}", text) or not (lo <= int(text) <= hi):
        raise UsageError(f"{flag} must be a whole number from {lo} to {hi}, got {value!r}")
    return int(text)


@dataclass(frozen=True)
class Rendezvous:
    """How this node meets the others, decided from torchrun's options."""

    backend: str
    """``c10d``, ``etcd-v2`` or ``static``."""
    endpoint: str
    """``host:port``; empty: a free port on 127.0.0.1 is picked when the run starts."""
    node_rank: int
    """This node's rank (static only)."""
    conf: dict[str, str]
    """``--rdzv-conf`` as given (checked)."""


def decide_rendezvous(args: argparse.Namespace, nnodes: tuple[int, int]) -> Rendezvous:
    """torchrun's rules: ``--standalone`` is c10d on a local port; an explicit ``--rdzv-backend`` wins;
    otherwise an endpoint means c10d (trainguard's documented default), and ``--master-*`` or
    ``--node-rank`` without one mean static, as torchrun's default backend does."""
    conf = parse_rdzv_conf(getattr(args, "rdzv_conf", "") or "")
    master_addr, master_port = getattr(args, "master_addr", None), getattr(args, "master_port", None)
    node_rank_text = getattr(args, "node_rank", None)
    endpoint_text = (getattr(args, "rdzv_endpoint", "") or "").strip()
    if getattr(args, "standalone", False):
        if nnodes[1] > 1:
            raise UsageError("--standalone runs one node: drop --nnodes or use --rdzv-endpoint instead")
        return Rendezvous("c10d", "", 0, conf)
    static_options = (master_addr, master_port, node_rank_text)
    backend = _backend_name(getattr(args, "rdzv_backend", None), endpoint_text, static_options)
    if backend == "etcd-v2":
        return _etcd_rendezvous(endpoint_text, conf)
    node_rank = _int_arg(node_rank_text, "--node-rank", 0, 4095) if node_rank_text is not None else 0
    if master_port is not None:
        _int_arg(master_port, "--master-port", 1, 65535)
    if master_addr is not None:
        parse_endpoint(master_addr, "--master-addr", 0)
    if backend == "static":
        return _static_rendezvous(nnodes, node_rank, endpoint_text, (master_addr, master_port), conf)
    return _c10d_rendezvous(nnodes, endpoint_text, static_options, conf)


def _static_rendezvous(nnodes: tuple[int, int], node_rank: int, endpoint_text: str,
                       master: tuple[str | None, str | None], conf: dict[str, str]) -> Rendezvous:
    """A fixed node count; the endpoint is ``--rdzv-endpoint``, else ``--master-addr``:``--master-port``."""
    if nnodes[0] != nnodes[1]:
        raise UsageError("--rdzv-backend static needs a fixed node count (--nnodes N); use c10d for MIN:MAX")
    if node_rank >= nnodes[1]:
        raise UsageError(f"--node-rank must be below --nnodes ({nnodes[1]}), got {node_rank}")
    master_addr, master_port = master
    if endpoint_text:
        host, port = parse_endpoint(endpoint_text, "--rdzv-endpoint", DEFAULT_MASTER_PORT)
    else:
        host, _ = parse_endpoint(master_addr or "127.0.0.1", "--master-addr", 0)
        port = int(master_port) if master_port is not None else DEFAULT_MASTER_PORT
    return Rendezvous("static", _join(host, port), node_rank, conf)


def _c10d_rendezvous(nnodes: tuple[int, int], endpoint_text: str, static_options: tuple[Any, ...],
                     conf: dict[str, str]) -> Rendezvous:
    """c10d at ``--rdzv-endpoint``; without one (single node only) a free local port is picked later."""
    for flag, given in zip(("--master-addr", "--master-port", "--node-rank"), static_options, strict=True):
        if given is not None:  # torchrun ignores these with c10d too, and says so
            log.warning("%s is only used by the static rendezvous; ignored with c10d", flag)
    if not endpoint_text:
        if nnodes[1] > 1:
            raise UsageError("--rdzv-endpoint is required with more than one node "
                             "(or --master-addr/--master-port with --rdzv-backend static)")
        return Rendezvous("c10d", "", 0, conf)
    host, port = parse_endpoint(endpoint_text, "--rdzv-endpoint", DEFAULT_C10D_PORT)
    return Rendezvous("c10d", _join(host, port), 0, conf)


def _backend_name(given: str | None, endpoint_text: str, static_options: tuple[Any, ...]) -> str:
    """The backend asked for, or torchrun's choice: static when only ``--master-*``/``--node-rank`` say where."""
    if given is None:
        return "static" if not endpoint_text and any(o is not None for o in static_options) else "c10d"
    backend = given.strip().lower()
    if backend not in ("c10d", "static", "etcd-v2"):
        raise UsageError(f"--rdzv-backend {backend!r} is not supported: use c10d, etcd-v2 or static")
    return backend


def _etcd_rendezvous(endpoint_text: str, conf: dict[str, str]) -> Rendezvous:
    """torch's etcd-v2 backend: the rendezvous state lives in an etcd server (``--enable-v2``), not in an agent."""
    from trainguard.launch import etcd

    if not endpoint_text:
        raise UsageError("--rdzv-backend etcd-v2 needs --rdzv-endpoint HOST[:PORT] of the etcd server")
    if "store_type" in conf or "is_host" in conf:
        raise UsageError("--rdzv-conf: store_type and is_host are c10d settings; etcd-v2 does not read them")
    etcd.check_conf(conf)
    etcd.require_client()
    host, port = parse_endpoint(endpoint_text, "--rdzv-endpoint", etcd.DEFAULT_PORT)
    return Rendezvous("etcd-v2", _join(host, port), 0, conf)
