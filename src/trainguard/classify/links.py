"""Link-level evidence: NCCL NET/IB and socket errors, NVLink XIDs and NVSwitch SXids, as failing pairs.

The scanner hands this module the candidate lines that hold a link trigger word (`LINK_KEYWORDS`); each
becomes a count on one pair (local host and HCA port or GPU link, remote peer). `trainguard.classify.linkverdict`
then names the element all failing pairs share. Formats: docs/classify.md, "Link localization".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainguard.classify.context import normalize_pci

LINK_KEYWORDS = ("Got completion from peer", "remote GID", "remoteGid", "Got async event", "NET/Socket",
                 "remote peer", "Call to recv", "Call to send", "Connect to ", "OOB ", "Bootstrap : Using",
                 "SXid", "Xid", "transport/tcp/pair")
"""Literals that make a line a candidate for the link pass (they join the scanner's pre-filter)."""
MAX_PAIRS = 4096
"""Distinct pairs kept per source (a 64-host job with 8 rails has a few thousand at most); more are counted."""
EXAMPLES_PER_PAIR = 2

# NCCL's line prefix: "host:pid:tid [cudaDev]", possibly after a launcher's "[rank3]:" or "[default0]:".
_NCCL_PREFIX = re.compile(r"(?:^|[\s\]:])(?P<host>[A-Za-z0-9][\w.-]*):\d+:\d+ \[\d+\]")
_SYSLOG_HOST = re.compile(r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\S+) "
                          r"(?P<host>[A-Za-z0-9][\w.-]*) ")
_PEER = r"(?P<peer>[0-9A-Fa-f:.]*[0-9A-Fa-f]|[A-Za-z0-9][\w.-]*)<\d+>"
# "with error 12, opcode 0" (before NCCL 2.19), "with status=12 opcode=0"; a status name around the number too
_COMPLETION = re.compile(r"Got completion from peer " + _PEER
                         + r" with (?:error |status=)(?:[A-Z_]+\()?(?P<status>\d+)")
_HCA = re.compile(r"\b(?:hca|on dev|dev) (?P<hca>[A-Za-z][\w-]*?_?\d+)(?::(?P<port>\d+))?\b")
_GID = re.compile(r"\b(?:remote ?GIDs?|remoteGids?) (?P<gid>[0-9A-Fa-f:.]{3,})")
_ASYNC = re.compile(r"(?:(?P<hca>[A-Za-z][\w-]*?_?\d+):(?P<port>\d+) )?Got async event : (?P<what>[^,;]+)")
_ASYNC_BENIGN = ("port active", "GID table change", "LID change", "client reregister", "SM change",
                 "port active event", "pkey change")
_SOCKET_PEER = re.compile(r"(?:remote peer|Call to (?:recv|send) (?:from|to)|Connect to|peer) " + _PEER)
_ADDRESS = re.compile(r"(?:OOB|Bootstrap : Using|NET/Socket : Using \[\d+\]) ?(?P<ifname>[\w.-]+):"
                      r"(?P<ip>[0-9A-Fa-f:.]*[0-9A-Fa-f])<\d+>")
_XID_LINK = re.compile(r"\bXid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)\): "
                       r"(?P<code>\d+)\b(?P<rest>.*)")
_SXID = re.compile(r"\bSXid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)\): "
                   r"(?P<code>\d+), (?P<sev>Non-fatal|Fatal)?[^,]*?,?\s*[Ll]ink (?P<link>\d+)")
_LINK_NO = re.compile(r"\b[Ll]ink (?P<link>\d+)\b")
NVLINK_XIDS = frozenset({74, *range(144, 151)})
"""XIDs the driver reports for an NVLink (74; 144-150 on newer drivers)."""
_GLOO_PEER = re.compile(r"\[(?P<peer>[0-9A-Fa-f:.]*[0-9A-Fa-f])\]:\d+")
"""gloo's ``transport/tcp/pair.cc`` lines name the peer ``[10.0.0.2]:23456``."""
_V4_IN_GID = re.compile(r"::ffff:(?P<ip>\d+\.\d+\.\d+\.\d+)$")


def gid_address(gid: str | None) -> str | None:
    """The IPv4 address a RoCE GID embeds (``::ffff:10.0.0.2``), else the GID itself."""
    if not gid:
        return None
    m = _V4_IN_GID.search(gid)
    return m.group("ip") if m else gid.lower()


@dataclass(frozen=True)
class PairKey:
    """One local end and one remote end of a link that reported errors."""

    kind: str
    """``net`` (InfiniBand/RoCE or socket transport) or ``nvlink`` (NVLink XID, NVSwitch SXid)."""
    host: str | None
    """Local host (resolved from the file's NCCL prefix when the line has none)."""
    port: str | None
    """``net``: the local HCA port (``mlx5_3:1``; ``mlx5_3`` when the line gives no port number).
    ``nvlink``: the PCI address of the GPU or NVSwitch."""
    link: int | None
    """NVLink link number (``nvlink`` only)."""
    peer: str | None
    """Remote address as printed (IP or host name, without its ``<port>``), or the remote GID's address."""
    file: str
    """The file the local end was reported in (its host may only be known once the file is read)."""


@dataclass
class PairStat:
    """What the lines about one pair said."""

    lines: int = 0
    fatal: int = 0
    """Lines that report a failure (a completion error, a QP error, a closed socket, a fatal NVLink error)."""
    transient: int = 0
    """Lines that report a retry or a non-fatal error."""
    local_port_events: int = 0
    """Errors the local port reported about itself (an IB async event): evidence against the local end."""
    statuses: set[int] = field(default_factory=set)
    examples: list[tuple[str, int, str]] = field(default_factory=list)
    """(file, line, text) of the first lines."""


@dataclass
class LinkCollector:
    """Every link line of one source, folded into pairs; bounded however long the input."""

    pairs: dict[PairKey, PairStat] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    """Address (IP, GID address) -> host, from NCCL's ``Using ... OOB ib0:10.0.0.1<0>`` lines."""
    file_hosts: dict[str, str] = field(default_factory=dict)
    """File -> the host its NCCL prefix names (a rank's log is one host's)."""
    dropped: int = 0
    """Lines about pairs beyond `MAX_PAIRS`."""

    def feed(self, text: str, file: str, lineno: int) -> None:
        """Fold one candidate line (no newline) into the pairs; lines that say nothing about a link are ignored."""
        host = self._line_host(text, file)
        if "Xid" in text:
            self._xid(text, file, lineno, host)
            return
        am = _ADDRESS.search(text)
        if am is not None:
            if host is not None:
                self.addresses.setdefault(am.group("ip").lower(), host)
            return
        self._net(text, file, lineno, host)

    def _line_host(self, text: str, file: str) -> str | None:
        """The line's host: its NCCL prefix's (remembered as the file's host), else its syslog host."""
        m = _NCCL_PREFIX.search(text)
        if m is not None:
            self.file_hosts.setdefault(file, m.group("host"))
            return m.group("host")
        sm = _SYSLOG_HOST.match(text)
        return sm.group("host") if sm else None

    def _net(self, text: str, file: str, lineno: int, host: str | None) -> None:
        """A network transport line: IB completion, port event, QP set-up, gloo or socket error."""
        retry = "retrying" in text  # NCCL retries a connect; "retry counter exceeded" is a failure
        cm = _COMPLETION.search(text)
        if cm is not None:
            port = self._hca(text)
            gm = _GID.search(text)
            peer = cm.group("peer") if cm.group("peer") else gid_address(gm.group("gid") if gm else None)
            self._add(PairKey("net", host, port, None, _strip(peer), file), file, lineno, text,
                      fatal=not retry, status=int(cm.group("status")))
            return
        if "Got async event" in text:
            am2 = _ASYNC.search(text)
            if am2 is None or am2.group("what").strip().startswith(_ASYNC_BENIGN):
                return
            port = _port(am2.group("hca"), am2.group("port")) if am2.group("hca") else self._hca(text)
            self._add(PairKey("net", host, port, None, None, file), file, lineno, text, fatal=True, local=True)
            return
        if "remote GID" in text or "remoteGid" in text:  # a QP that could not be brought up
            gm = _GID.search(text)
            self._add(PairKey("net", host, self._hca(text), None, gid_address(gm.group("gid") if gm else None),
                              file), file, lineno, text, fatal=not retry)
            return
        if "transport/tcp/pair" in text:  # gloo: "Connection closed by peer [10.0.0.2]:23456", "Read error ..."
            gp = _GLOO_PEER.search(text)
            if gp is not None:
                self._add(PairKey("net", host, None, None, _strip(gp.group("peer")), file), file, lineno, text,
                          fatal=not retry)
            return
        sm2 = _SOCKET_PEER.search(text)
        if sm2 is not None and ("NET/" in text or "NCCL" in text or "socket" in text.lower()):
            self._add(PairKey("net", host, None, None, _strip(sm2.group("peer")), file), file, lineno, text,
                      fatal=not retry)

    @staticmethod
    def _hca(text: str) -> str | None:
        hm = _HCA.search(text)
        return _port(hm.group("hca"), hm.group("port")) if hm else None

    def _xid(self, text: str, file: str, lineno: int, host: str | None) -> None:
        sx = _SXID.search(text)
        if sx is not None:
            self._add(PairKey("nvlink", host, normalize_pci(sx.group("pci")), int(sx.group("link")), None, file),
                      file, lineno, text, fatal=sx.group("sev") == "Fatal")
            return
        xm = _XID_LINK.search(text)
        if xm is None or int(xm.group("code")) not in NVLINK_XIDS:
            return
        lm = _LINK_NO.search(xm.group("rest"))
        self._add(PairKey("nvlink", host, normalize_pci(xm.group("pci")), int(lm.group("link")) if lm else None,
                          None, file), file, lineno, text, fatal=True)

    def _add(self, key: PairKey, file: str, lineno: int, text: str, *, fatal: bool, status: int | None = None,
             local: bool = False) -> None:
        if key.peer is not None and _is_loopback(key.peer):
            return  # ranks of one host talking over loopback: no network link to blame
        stat = self.pairs.get(key)
        if stat is None:
            if len(self.pairs) >= MAX_PAIRS:
                self.dropped += 1
                return
            stat = self.pairs[key] = PairStat()
        stat.lines += 1
        if fatal:
            stat.fatal += 1
        else:
            stat.transient += 1
        if local:
            stat.local_port_events += 1
        if status is not None:
            stat.statuses.add(status)
        if len(stat.examples) < EXAMPLES_PER_PAIR:
            stat.examples.append((file, lineno, text.strip()[:500]))


def _port(hca: str, port: str | None) -> str:
    return f"{hca}:{port}" if port else hca


def _strip(peer: str | None) -> str | None:
    return peer.lower() if peer and peer[0].isdigit() else peer


def _is_loopback(peer: str) -> bool:
    return peer.startswith("127.") or peer in ("::1", "localhost") or peer.startswith("::ffff:127.")
