"""NCCL releases with known crash or hang defects (``nccl_releases.toml``), and the NCCL version a log line names.

Used by the crossline analysis of kind ``release`` (`trainguard.classify.derive`); see docs/classify.md.
"""

from __future__ import annotations

import logging
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from trainguard.errors import InputError

log = logging.getLogger(__name__)

TABLE = Path(__file__).with_name("nccl_releases.toml")
SYMPTOMS = ("crash", "hang")

Version = tuple[int, int, int]

# "2.27.7" (NCCL's INFO banner, torch's error suffix, a soname, a wheel), "2, 27, 7" (torch.cuda.nccl.version());
# a build suffix ("-1", "+cuda12.9") may follow and is not part of the release
_VERSION = re.compile(r"(\d+)\s*[.,]\s*(\d+)\s*[.,]\s*(\d+)")
_SETTING = re.compile(r"\b(?P<name>NCCL_\w+) set by environment to (?P<value>\S+?)\.?\s*$")


@dataclass(frozen=True)
class KnownBadRelease:
    """One NCCL defect that makes a training job crash or hang, and the releases that have it."""

    id: str
    """Unique name, used in tests and logs."""
    ranges: tuple[tuple[Version, Version], ...]
    """Affected releases as inclusive (first, last) ranges; an exact release is a range of one."""
    symptoms: tuple[str, ...]
    """How the defect shows: ``crash`` (a segfault or abort) and/or ``hang`` (a collective never finishes)."""
    description: str
    """The defect in a sentence."""
    source: str
    """Address of the page the facts come from (release notes or an issue thread)."""
    source_kind: str
    """What the source is and what it says, quoted where possible."""
    confidence: float
    """Confidence of the verdict when a log matches (below the hardware rules; conditional defects lower)."""
    fixed_in: str | None = None
    """First release with the fix, when the source names one."""
    workaround: str | None = None
    """What the source says avoids it without upgrading (an environment variable), if anything."""
    condition: str | None = None
    """When the defect bites, if the source narrows it (a platform, a feature in use); shown in the verdict."""
    requires: tuple[str, ...] = ()
    """Literal strings of which one must appear in the log (the condition made visible); empty = none needed."""
    disabled_by: tuple[tuple[str, str], ...] = ()
    """(NCCL setting, value) pairs that switch the defective feature off: a log showing one is not this defect."""

    def affects(self, version: Version) -> bool:
        """Whether ``version`` is one of the affected releases."""
        return any(lo <= version <= hi for lo, hi in self.ranges)

    def verdict(self, version: str) -> str:
        """The explanation of a match: version, defect, condition, fix, workaround and source."""
        parts = [f"NCCL {version} has a known {' and '.join(self.symptoms)} defect: {self.description}"]
        if self.condition:
            parts.append(f"when: {self.condition}")
        parts.append(f"fixed in NCCL {self.fixed_in}" if self.fixed_in else "no fixed release named by the source")
        if self.workaround:
            parts.append(f"workaround: {self.workaround}")
        parts.append(f"source: {self.source}")
        return "; ".join(parts)


def parse_version(text: str) -> Version | None:
    """``2.27.7``, ``2.27.7-1``, ``2.27.7+cuda12.9`` or ``2, 27, 7`` as (2, 27, 7); None if ``text`` holds none."""
    m = _VERSION.search(text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def show(version: Version) -> str:
    """A version as NCCL writes it (``2.27.7``)."""
    return ".".join(map(str, version))


def nccl_settings(lines: Iterable[str]) -> dict[str, str]:
    """NCCL's ``NCCL_X set by environment to V`` INFO lines as {name: value} (the first value of each name)."""
    out: dict[str, str] = {}
    for text in lines:
        m = _SETTING.search(text)
        if m:
            out.setdefault(m.group("name"), m.group("value"))
    return out


def match(version: Version, symptoms: Iterable[str], context: Iterable[str] = (),
          table: tuple[KnownBadRelease, ...] | None = None) -> KnownBadRelease | None:
    """The entry (most confident first, then table order) for ``version`` among those whose symptom the log shows,
    whose ``requires`` appear in ``context`` (the log's condition lines) and which no NCCL setting there disables."""
    seen = set(symptoms)
    texts = list(context)
    settings = nccl_settings(texts)
    candidates = [e for e in (known_bad_releases() if table is None else table)
                  if e.affects(version) and seen.intersection(e.symptoms)
                  and (not e.requires or any(r in t for r in e.requires for t in texts))
                  and not any(settings.get(name) == value for name, value in e.disabled_by)]
    return max(candidates, key=lambda e: e.confidence, default=None)  # max keeps the first of equals


def _version(where: str, text: Any) -> Version:
    v = parse_version(text) if isinstance(text, str) else None
    if v is None or not re.fullmatch(r"\s*\d+\.\d+\.\d+\s*", str(text)):
        raise InputError(f"{where}: version must be written like 2.27.7, got {text!r}")
    return v


def _ranges(where: str, values: Any) -> tuple[tuple[Version, Version], ...]:
    if not isinstance(values, list) or not values:
        raise InputError(f"{where}: versions must be a non-empty list")
    out = []
    for v in values:
        lo, _, hi = str(v).partition("..")
        first, last = _version(where, lo), _version(where, hi or lo)
        if first > last:
            raise InputError(f"{where}: range {v!r} runs backwards")
        out.append((first, last))
    return tuple(out)


def _strings(where: str, d: Mapping[str, Any], key: str) -> tuple[str, ...]:
    v = d.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise InputError(f"{where}: {key} must be a list of non-empty strings")
    return tuple(v)


def _entry(where: str, d: Mapping[str, Any]) -> KnownBadRelease:
    eid = d.get("id")
    if not isinstance(eid, str) or not eid:
        raise InputError(f"{where}: every [[release]] needs an id")
    where = f"{where}: release {eid!r}"
    for key in ("description", "source", "source_kind"):
        if not isinstance(d.get(key), str) or not d[key]:
            raise InputError(f"{where}: {key} must be a non-empty string")
    if not str(d["source"]).startswith("https://"):
        raise InputError(f"{where}: source must be an https:// address")
    symptoms = _strings(where, d, "symptoms")
    if not symptoms or any(s not in SYMPTOMS for s in symptoms):
        raise InputError(f"{where}: symptoms must be some of {', '.join(SYMPTOMS)}")
    conf = d.get("confidence")
    if not isinstance(conf, (int, float)) or isinstance(conf, bool) or not 0.0 < conf < 1.0:
        raise InputError(f"{where}: confidence must be a number between 0 and 1")
    disabled = d.get("disabled_by", {})
    if not isinstance(disabled, dict) or not all(isinstance(v, str) for v in disabled.values()):
        raise InputError(f"{where}: disabled_by must be a table of setting = \"value\"")
    unknown = set(d) - {"id", "versions", "symptoms", "description", "fixed_in", "workaround", "condition",
                        "requires", "disabled_by", "confidence", "source", "source_kind"}
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    fixed = d.get("fixed_in")
    if fixed is not None:
        _version(where, fixed)
    return KnownBadRelease(
        id=eid, ranges=_ranges(where, d.get("versions")), symptoms=symptoms, description=str(d["description"]),
        source=str(d["source"]), source_kind=str(d["source_kind"]), confidence=float(conf),
        fixed_in=fixed, workaround=d.get("workaround"), condition=d.get("condition"),
        requires=_strings(where, d, "requires"), disabled_by=tuple(sorted(disabled.items())))


def load_table(path: Path = TABLE) -> tuple[KnownBadRelease, ...]:
    """Every ``[[release]]`` of the table file, in file order. Raises `InputError` on a bad entry."""
    with path.open("rb") as f:
        data = tomllib.load(f)
    entries = tuple(_entry(str(path), d) for d in data.get("release", []))
    ids = [e.id for e in entries]
    if len(set(ids)) != len(ids):
        raise InputError(f"{path}: release ids must be unique")
    log.debug("%d known-bad NCCL release entries from %s", len(entries), path)
    return entries


@lru_cache(maxsize=1)
def known_bad_releases() -> tuple[KnownBadRelease, ...]:
    """The built-in table, loaded once per process."""
    return load_table()
