"""Where and when a log line happened: the PCI devices it names, how they nest, and its time stamp.

The classifier uses these to tell cause from consequence: an upstream component's failure (a PCIe switch
port, a power supply, a file server) explains the errors its downstream devices report after it.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Mapping

PciAddress = tuple[int, int, int]
"""(domain, bus, device) of a PCI function; the function number is left out (one physical device)."""

_PCI = re.compile(r"^(?:PCI:)?(?:(?P<dom>[0-9A-Fa-f]{4,8}):)?(?P<bus>[0-9A-Fa-f]{2}):(?P<dev>[0-9A-Fa-f]{2})"
                  r"(?:\.[0-7])?$")


def parse_pci(text: str | None) -> PciAddress | None:
    """``0000:3b:00``, ``00000000:3B:00.0``, ``PCI:0000:3b:00`` or ``3b:00.1`` as (domain, bus, device)."""
    if not text:
        return None
    m = _PCI.match(text.strip())
    if m is None:
        return None
    return int(m.group("dom") or "0", 16) & 0xFFFF, int(m.group("bus"), 16), int(m.group("dev"), 16)


def normalize_pci(text: str | None) -> str | None:
    """The one spelling used in verdicts, ``dddd:bb:dd`` in lower case (nvidia-smi prints an 8-digit domain
    and the function, the driver's XID lines neither); text that is not a PCI address is kept as it is."""
    a = parse_pci(text)
    if a is None:
        return text
    return f"{a[0]:04x}:{a[1]:02x}:{a[2]:02x}"


def is_below(child: str | None, parent: str | None, bridges: Mapping[str, tuple[int, int]],
             *, same_counts: bool = False) -> bool:
    """Whether the device ``child`` sits under the PCI bridge or port ``parent``.

    With the bridge's bus range from the log (``PCI bridge to [bus 17-1c]``) that range decides; without it,
    a device under a bridge always has a larger bus number than the bridge (buses are numbered depth-first),
    in the same PCI domain. ``same_counts``: the parent device itself also counts (its own link)."""
    c, p = parse_pci(child), parse_pci(parent)
    if c is None or p is None or c[0] != p[0]:
        return False
    if c == p:
        return same_counts
    window = bridges.get(f"{p[0]:04x}:{p[1]:02x}:{p[2]:02x}")
    if window is not None:
        return window[0] <= c[1] <= window[1]
    return c[1] > p[1]


# ---- time stamps ---------------------------------------------------------------------------------------
_ISO = re.compile(r"^\s*(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?\s*(Z|[+-]\d\d:?\d\d)?")
_SYSLOG = re.compile(r"^\s*(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(\d{1,2}) (\d\d):(\d\d):(\d\d)"
                     r"(?:\.(\d{1,9}))?\b")
_DMESG = re.compile(r"^\s*\[\s*(\d+)\.(\d+)\]")
_SEL = re.compile(r"\|\s*(\d\d)/(\d\d)/(\d{4})\s*\|\s*(\d\d):(\d\d):(\d\d)\s*\|")  # ipmitool sel elist
_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}

LineTime = tuple[str, float]
"""(clock, seconds): two times compare only on the same clock (``utc``; ``local`` for times without a zone;
``syslog`` for month-day times without a year; ``boot:<file>`` for dmesg's seconds since boot)."""


def _frac(digits: str | None) -> float:
    return float("0." + digits) if digits else 0.0


def line_time(text: str, file: str) -> LineTime | None:
    """The time stamp at the start of a log line (or in an ipmitool SEL row), if it has one."""
    m = _ISO.match(text)
    if m:
        y, mo, d, h, mi, s = (int(g) for g in m.groups()[:6])
        try:
            t = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)) + _frac(m.group(7))
        except (ValueError, OverflowError):
            return None
        tz = m.group(8)
        if tz is None:
            return "local", t
        if tz != "Z":
            sign = -1 if tz[0] == "+" else 1
            digits = tz[1:].replace(":", "")
            t += sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
        return "utc", t
    m = _SYSLOG.match(text)
    if m:
        mon, day, h, mi, s = _MONTHS[m.group(1)], int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5))
        # no year: a leap year keeps Feb 29 valid; Dec -> Jan wrap-around is not handled (rare in one excerpt)
        return "syslog", calendar.timegm((2000, mon, day, h, mi, s, 0, 0, 0)) + _frac(m.group(6))
    m = _DMESG.match(text)
    if m:
        return f"boot:{file}", int(m.group(1)) + _frac(m.group(2))
    m = _SEL.search(text)
    if m:
        mo, d, y, h, mi, s = (int(g) for g in m.groups())
        try:
            return "local", float(calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0)))
        except (ValueError, OverflowError):
            return None
    return None
