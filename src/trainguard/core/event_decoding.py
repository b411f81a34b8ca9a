"""Strict decoding of the event language: a record read back from disk is checked field by field against its dataclass
annotations (`trainguard.core.events`), so a bad record is named by type and field."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Union

from trainguard.core.events import RECORD_TYPES, Event

# --- strict decoding ------------------------------------------------------------------------------
#
# A record read back from disk is checked field by field against its dataclass annotations, so a
# string ``step`` or a list ``attempt`` is a bad record named by field (exit 3), not a TypeError deep
# inside the analysis (exit 70). The limits below are documented in docs/events.md.

INT_LIMIT = 2**63 - 1
"""Largest magnitude of an integer field: what a signed 64-bit integer holds (SQLite, numpy, C)."""
ANY_DEPTH_LIMIT = 32
"""Deepest nesting accepted inside free-form fields (``config``, ``params``)."""

_Decoder = typing.Callable[[Any], Any]


class RecordError(ValueError):
    """A record does not match its declared fields; the message names the field."""


def _kind(value: Any) -> str:
    """How a JSON value reads in an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _check_text(value: str) -> str:
    # json accepts lone surrogates (\ud800); they cannot be printed or stored as UTF-8 later.
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise RecordError("text is not valid Unicode (lone surrogate)") from None
    return value


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise RecordError(f"expected an integer, got {_kind(value)}")
    if not -INT_LIMIT <= value <= INT_LIMIT:
        raise RecordError("integer out of range (more than 64 bits)")
    return value


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError(f"expected a number, got {_kind(value)}")
    if isinstance(value, int) and not -INT_LIMIT <= value <= INT_LIMIT:
        raise RecordError("number out of range")
    out = float(value)
    if not math.isfinite(out):
        raise RecordError("number is not finite")
    return out


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise RecordError(f"expected a string, got {_kind(value)}")
    return _check_text(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise RecordError(f"expected true/false, got {_kind(value)}")
    return value


def _any(value: Any) -> Any:
    """Free-form JSON: any shape, but bounded depth, finite numbers, 64-bit integers, valid text."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:  # iterative: a deep value must not exhaust the interpreter's stack here either
        item, depth = stack.pop()
        if depth > ANY_DEPTH_LIMIT:
            raise RecordError(f"nested deeper than {ANY_DEPTH_LIMIT} levels")
        if isinstance(item, dict):
            for k, v in item.items():
                _check_text(k)
                stack.append((v, depth + 1))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, str):
            _check_text(item)
        elif isinstance(item, float):
            _float(item)
        elif isinstance(item, int) and not isinstance(item, bool):
            _int(item)
    return value


def _optional(inner: _Decoder) -> _Decoder:
    def decode(value: Any) -> Any:
        return None if value is None else inner(value)

    return decode


def _tuple_of(inner: _Decoder) -> _Decoder:
    def decode(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, (list, tuple)):
            raise RecordError(f"expected a list, got {_kind(value)}")
        return tuple(inner(v) for v in value)

    return decode


def _dict_of(inner: _Decoder) -> _Decoder:
    def decode(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise RecordError(f"expected an object, got {_kind(value)}")
        out: dict[str, Any] = {}
        for k, v in value.items():
            _check_text(k)
            try:
                out[k] = inner(v)
            except RecordError as exc:
                raise RecordError(f"key {k[:40]!r}: {exc}") from None
        return out

    return decode


_SCALARS: dict[Any, _Decoder] = {int: _int, float: _float, str: _str, bool: _bool, Any: _any}


def _decoder_for(hint: Any) -> _Decoder:
    """The decoder of one annotation; TypeError for an annotation this module does not use."""
    if hint in _SCALARS:
        return _SCALARS[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return _optional(_decoder_for(rest[0]))
    elif origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _tuple_of(_decoder_for(args[0]))
    elif origin is dict and len(args) == 2 and args[0] is str:
        return _dict_of(_decoder_for(args[1]))
    raise TypeError(f"no strict decoder for field type {hint!r}")


@dataclass(frozen=True)
class _FieldSpec:
    """How one field of a record type is read from JSON."""

    name: str
    """The field (and JSON key) name."""
    decode: _Decoder
    """Checks and converts the JSON value; raises `RecordError`."""
    required: bool
    """The field has no default: a record without it is bad."""


def _specs(cls: type[Event]) -> tuple[_FieldSpec, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        _FieldSpec(
            f.name,
            _decoder_for(hints[f.name]),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    )


_FIELD_SPECS: dict[type[Event], tuple[_FieldSpec, ...]] = {cls: _specs(cls) for cls in RECORD_TYPES.values()}


def from_dict(data: dict[str, Any]) -> Event:
    """Build a record from its JSON form, checking every field against its declared type.

    Raises `RecordError` (a ValueError) whose message names the record type and the field: integers
    (not true/false) within 64 bits, finite numbers (integers accepted), strings, true/false, null
    for optional fields, lists for tuples, objects for dicts. Unknown keys are ignored, so a reader
    can read files from a writer of the same schema version that added optional fields.
    """
    type_name = data.get("type")
    cls = RECORD_TYPES.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        if isinstance(type_name, str):
            raise RecordError(f"unknown record type {type_name[:40]!r}")
        raise RecordError("missing record type" if type_name is None
                          else f"record type must be a string, got {_kind(type_name)}")
    kwargs: dict[str, Any] = {}
    for spec in _FIELD_SPECS[cls]:
        if spec.name not in data:
            if spec.required:
                raise RecordError(f"bad {type_name} record: missing field {spec.name!r}")
            continue
        try:
            kwargs[spec.name] = spec.decode(data[spec.name])
        except RecordError as exc:
            raise RecordError(f"bad {type_name} record: field {spec.name!r}: {exc}") from None
    return cls(**kwargs)
