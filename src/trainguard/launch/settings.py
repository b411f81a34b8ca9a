"""Field metadata of the launch configs: each field's section, allowed range and command-line flag, in one place.

`SupervisorConfig` and `WatchdogConfig` declare their fields with `setting`; the configs check their ranges
from it, and ``trainguard run`` / ``demo`` build their flags from it (`add_flags`, `flag_values`), so a
default, a help line and a limit are written once (torchtitan derives its flags from its config the same
way). The flags keep torchrun's spellings where torchrun has the option.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import MISSING, Field, dataclass, field
from typing import Any

from trainguard.core.numeric import in_range

SECTIONS = {
    "run": "run and output",
    "torchrun": "torchrun options (same spellings and meanings)",
    "nodes": "nodes and rendezvous (trainguard's own)",
    "recovery": "restarts and recovery",
    "detection": "failure detection",
    "workers": "workers, logs and console",
    "health": "node health and draining",
}
"""Section key -> its title in ``trainguard run --help``, in the order the help shows them."""

_KEY = "trainguard"


@dataclass(frozen=True)
class Flag:
    """How one field is set on the command line."""

    names: tuple[str, ...]
    """The spellings (``-m``, ``--module``); the last is the canonical one, named in error messages."""
    help: str
    """One line; the default is appended from the field (``default_note`` overrides)."""
    metavar: str | None = None
    torchrun: bool = False
    """torchrun's option: also spelled with underscores, and its default read from ``PET_<NAME>`` as torchrun."""
    negate: bool = False
    """A ``--no-...`` switch: given, it sets the (default true) field to False."""
    default_note: str | None = None
    """Shown as ``(default ...)`` instead of the field's default; "" shows none."""
    shared: bool = False
    """Also a ``trainguard demo`` option (`add_flags` with ``shared=True``)."""

    @property
    def long(self) -> str:
        return self.names[-1]


@dataclass(frozen=True)
class Setting:
    """A field's metadata."""

    section: str
    flag: Flag | None = None
    bounds: tuple[float, float] | None = None
    """Inclusive range of a number field (whole numbers if the field is an ``int``)."""


def setting(default: Any = MISSING, *, section: str, flag: Flag | None = None,
            bounds: tuple[float, float] | None = None, factory: Any = MISSING) -> Any:
    """A dataclass field with its `Setting` (``section`` a key of `SECTIONS`)."""
    if section not in SECTIONS:
        raise ValueError(f"unknown section {section!r}")
    meta = {_KEY: Setting(section, flag, bounds)}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def setting_of(f: Field[Any]) -> Setting | None:
    value = f.metadata.get(_KEY)
    return value if isinstance(value, Setting) else None


def _settings(cls: type) -> Iterator[tuple[Field[Any], Setting]]:
    for f in dataclasses.fields(cls):
        s = setting_of(f)
        if s is not None:
            yield f, s


def check_bounds(cfg: Any) -> None:
    """`ValueError` naming the first field of ``cfg`` outside its `Setting.bounds` (NaN is outside)."""
    for f, s in _settings(type(cfg)):
        if s.bounds is None:
            continue
        lo, hi = s.bounds
        value = getattr(cfg, f.name)
        integer = f.type in (int, "int")
        if not in_range(value, lo, hi, integer=integer):
            kind = "a whole number" if integer else "a number"
            raise ValueError(f"{f.name} must be {kind} from {lo:g} to {hi:g}, got {value!r}")


def _default(f: Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


def _spellings(flag: Flag) -> list[str]:
    out = list(flag.names)
    if flag.torchrun:
        under = flag.long.replace("-", "_").replace("__", "--", 1)
        if under != flag.long:
            out.append(under)
    return out


def _env_name(flag: Flag) -> str:
    return "PET_" + flag.long.lstrip("-").replace("-", "_").upper()


def _help(f: Field[Any], flag: Flag) -> str:
    note = flag.default_note
    if note is None:
        default = _default(f)
        note = "" if isinstance(default, bool) or default is None else (
            f"{default:g}" if isinstance(default, float) else str(default))
    return f"{flag.help} (default {note})" if note else flag.help


def _dest(f: Field[Any], flag: Flag) -> str:
    return "no_" + f.name if flag.negate else f.name


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, section: str | None = None, *,
              shared: bool = False) -> None:
    """Add the flags of ``cls``'s fields in ``section`` (None: every section; ``shared``: only those
    ``trainguard demo`` has too). A flag's ``dest`` is its field's name (``no_<name>`` for a ``--no-`` switch)."""
    for f, s in _settings(cls):
        if s.flag is None or (section is not None and s.section != section) or (shared and not s.flag.shared):
            continue
        flag = s.flag
        default = _default(f)
        kw: dict[str, Any] = {"dest": _dest(f, flag), "help": _help(f, flag)}
        if isinstance(default, bool):
            kw["action"] = "store_true"
            kw["default"] = False
            if flag.torchrun:
                kw["default"] = os.environ.get(_env_name(flag), "0").lower() in ("1", "true", "yes")
        else:
            kw["default"] = os.environ.get(_env_name(flag), default) if flag.torchrun else default
            if isinstance(default, int | float):
                kw["type"] = type(default)
            # As argparse names it from the flag (not from the field's name).
            kw["metavar"] = flag.metavar or flag.long.lstrip("-").replace("-", "_").upper()
        parser.add_argument(*_spellings(flag), **kw)


def flag_values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of ``cls`` that ``args`` holds a flag of, as the config takes them."""
    out: dict[str, Any] = {}
    for f, s in _settings(cls):
        if s.flag is None or not hasattr(args, _dest(f, s.flag)):
            continue
        value = getattr(args, _dest(f, s.flag))
        out[f.name] = (not value) if s.flag.negate else value
    return out


def field_flags(*classes: type) -> dict[str, str]:
    """Field name -> the canonical flag that sets it, for the fields with a flag."""
    return {f.name: s.flag.long for cls in classes for f, s in _settings(cls) if s.flag is not None}


def sections(cls: type) -> dict[str, list[str]]:
    """Section key -> the names of ``cls``'s fields in it."""
    out: dict[str, list[str]] = {key: [] for key in SECTIONS}
    for f, s in _settings(cls):
        out[s.section].append(f.name)
    return out
