"""The optional network topology file of link localization: host -> leaf switch, HCA port -> switch port.

JSON or TOML (by the file's suffix; both parsed by the standard library). Format: docs/classify.md,
"Topology file". A bad file is an `InputError` naming the file and the entry.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import InputError

MAX_TOPOLOGY_BYTES = 64 << 20


@dataclass(frozen=True)
class Topology:
    """Where hosts and their HCA ports plug into the network."""

    leaf: Mapping[str, str] = field(default_factory=dict)
    """Host -> the leaf (top-of-rack) switch its HCAs plug into."""
    cables: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(host, HCA or ``HCA:port``) -> the switch port at the cable's other end (``leaf-3/17``)."""
    addresses: Mapping[str, str] = field(default_factory=dict)
    """IP address or GID (lower case) -> host."""

    def leaf_of(self, host: str | None) -> str | None:
        return self.leaf.get(host) if host else None

    def cable_of(self, host: str | None, port: str | None) -> str | None:
        """The switch port of ``host``'s ``port`` (``mlx5_3:1``; an entry for ``mlx5_3`` covers all its ports)."""
        if not host or not port:
            return None
        return self.cables.get((host, port)) or self.cables.get((host, port.split(":", 1)[0]))


def _fail(path: Path, what: str) -> InputError:
    return InputError(f"{path}: bad topology file: {what} (see docs/classify.md, Topology file)")


def _text_field(path: Path, where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 256:
        raise _fail(path, f"{where} must be a non-empty string")
    return value.strip()


def load_topology(path: str | Path) -> Topology:
    """Read a topology file; raises `InputError` (one line) when it is missing, unreadable or malformed."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_TOPOLOGY_BYTES:
            raise _fail(p, f"larger than {MAX_TOPOLOGY_BYTES >> 20} MiB")
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"{p}: cannot read topology file: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
        doc: Any = tomllib.loads(text) if p.suffix.lower() == ".toml" else json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise _fail(p, str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    return parse_topology(doc, p)


def parse_topology(doc: Any, path: Path = Path("<topology>")) -> Topology:
    """A `Topology` from a decoded document ``{"hosts": {HOST: {"leaf", "addresses", "hcas"}}}``."""
    if not isinstance(doc, dict) or not isinstance(doc.get("hosts"), dict):
        raise _fail(path, 'expected a top-level "hosts" table of host -> {leaf, addresses, hcas}')
    unknown = set(doc) - {"hosts", "version"}
    if unknown:
        raise _fail(path, f"unknown top-level key {sorted(unknown)[0]!r}")
    leaf: dict[str, str] = {}
    cables: dict[tuple[str, str], str] = {}
    addresses: dict[str, str] = {}
    for host, entry in doc["hosts"].items():
        where = f"hosts.{host}"
        if not isinstance(entry, dict):
            raise _fail(path, f"{where} must be a table")
        extra = set(entry) - {"leaf", "addresses", "hcas"}
        if extra:
            raise _fail(path, f"{where}: unknown key {sorted(extra)[0]!r}")
        if "leaf" in entry:
            leaf[host] = _text_field(path, f"{where}.leaf", entry["leaf"])
        addrs = entry.get("addresses", [])
        if not isinstance(addrs, list):
            raise _fail(path, f"{where}.addresses must be a list of strings")
        for i, a in enumerate(addrs):
            addr = _text_field(path, f"{where}.addresses[{i}]", a).lower()
            if addresses.setdefault(addr, host) != host:
                raise _fail(path, f"address {addr} given for both {addresses[addr]} and {host}")
        hcas = entry.get("hcas", {})
        if not isinstance(hcas, dict):
            raise _fail(path, f"{where}.hcas must be a table of HCA port -> switch port")
        for port, sw in hcas.items():
            cables[(host, port)] = _text_field(path, f"{where}.hcas.{port}", sw)
    return Topology(leaf=leaf, cables=cables, addresses=addresses)
