"""Slurm's hostlist syntax expanded to node names: ``node[01-04,07],gpu-a1`` -> node01 .. node04, node07, gpu-a1.

Done here rather than with ``scontrol show hostnames`` so the job's allocation is known without a call to
slurmctld (which may be the very thing failing when a drain is decided).
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger(__name__)

MAX_HOSTS = 1_000_000
"""A list naming more hosts than this is refused (a typo such as ``n[1-999999999]`` must not exhaust memory)."""
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets; ValueError on unbalanced brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested brackets in hostlist {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {text!r}")
    parts.append(text[start:])
    return parts


def _numbers(spec: str, whole: str) -> list[str]:
    """``01-04,07`` -> ['01', '02', '03', '04', '07']; a range keeps its lower bound's zero padding."""
    out: list[str] = []
    for item in spec.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise ValueError(f"bad range {item!r} in hostlist {whole!r}")
        lo, hi = m.group(1), m.group(2) if m.group(2) is not None else m.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"descending range {item!r} in hostlist {whole!r}")
        if int(hi) - int(lo) + len(out) >= MAX_HOSTS:
            raise ValueError(f"hostlist {whole!r} names more than {MAX_HOSTS} hosts")
        width = len(lo) if lo.startswith("0") else 0
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def _expand_one(pattern: str, whole: str) -> list[str]:
    """One comma-free (outside brackets) pattern, with any number of bracket groups (``r[1-2]n[01-02]``)."""
    names = [""]
    rest = pattern
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            names = [n + rest for n in names]
            break
        close_at = rest.index("]", open_at)
        prefix, spec, rest = rest[:open_at], rest[open_at + 1:close_at], rest[close_at + 1:]
        numbers = _numbers(spec, whole)
        if len(names) * len(numbers) > MAX_HOSTS:
            raise ValueError(f"hostlist {whole!r} names more than {MAX_HOSTS} hosts")
        names = [n + prefix + x for n in names for x in numbers]
    return names


def expand(hostlist: str) -> list[str]:
    """Every host ``hostlist`` names, in order, duplicates dropped; ValueError for a malformed list."""
    text = hostlist.strip()
    if not text:
        return []
    if any(c.isspace() for c in text):
        raise ValueError(f"whitespace in hostlist {hostlist!r}")
    out: list[str] = []
    seen: set[str] = set()
    for part in _split_top(text):
        if not part:
            raise ValueError(f"empty name in hostlist {hostlist!r}")
        for name in _expand_one(part, hostlist):
            if not name:
                raise ValueError(f"empty name in hostlist {hostlist!r}")
            if name not in seen:
                seen.add(name)
                out.append(name)
    return out
