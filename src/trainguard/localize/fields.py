"""Type checks of a flight-recorder entry's fields, so damaged or hostile dumps are refused up front.

The matcher compares, hashes, formats and prints entry fields; a string where an int belongs, a list
nested 100,000 deep or an int of 5,000 digits would otherwise surface as a TypeError, a RecursionError
or an over-long conversion deep inside the analysis. Every check has a fixed depth, so it is safe on
anything the restricted unpickler can build (cycles included).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from trainguard.localize.reader import MAX_FIELD_INT, DumpError, describe

log = logging.getLogger(__name__)

MAX_TEXT = 4096
"""Longest accepted op name, state, dtype, group name or frame text."""
MAX_TENSORS = 4096
"""Most tensors one entry may list in its sizes or dtypes (coalesced ops list many)."""
MAX_DIMS = 64
MAX_FRAMES_PER_ENTRY = 1024

# field -> may be None; ints are int64 as torch writes them
_INT_FIELDS = ("collective_seq_id", "p2p_seq_id", "seq_id", "op_id", "record_id", "timeout_ms",
               "time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns")
_TEXT_FIELDS = ("profiling_name", "state")
_BOOL_FIELDS = ("retired", "is_p2p")
_SIZE_FIELDS = ("input_sizes", "output_sizes")
_DTYPE_FIELDS = ("input_dtypes", "output_dtypes")


def _int_ok(v: Any) -> bool:
    return v.__class__ is int and -MAX_FIELD_INT < v < MAX_FIELD_INT


def _text_ok(v: Any) -> bool:
    return v.__class__ is str and len(v) <= MAX_TEXT


def _sizes_ok(v: Any) -> bool:
    if v.__class__ not in (list, tuple) or len(v) > MAX_TENSORS:
        return False
    for t in v:
        if t.__class__ not in (list, tuple) or len(t) > MAX_DIMS:
            return False
        for d in t:
            if not _int_ok(d):
                return False
    return True


def _dtypes_ok(v: Any) -> bool:
    return v.__class__ in (list, tuple) and len(v) <= MAX_TENSORS and all(_text_ok(d) for d in v)


def _frames_ok(v: Any, seen: set[int]) -> bool:
    if v.__class__ not in (list, tuple) or len(v) > MAX_FRAMES_PER_ENTRY:
        return False
    for f in v:
        if id(f) in seen:  # torch's pickle shares frame dicts between entries: check each once
            continue
        if f.__class__ is not dict:
            return False
        name, file, line = f.get("name"), f.get("filename"), f.get("line")
        if not ((name is None or _text_ok(name)) and (file is None or _text_ok(file))
                and (line is None or _int_ok(line))):
            return False
        seen.add(id(f))
    return True


def _bool_ok(v: Any) -> bool:
    return v.__class__ is bool


def _pg_id_ok(v: Any) -> bool:
    return _int_ok(v) or _text_ok(v)


def _process_group_ok(v: Any) -> bool:
    return v.__class__ in (list, tuple) and 0 < len(v) <= 8 and all(_text_ok(x) for x in v)


_PROCESS_GROUP = (("process_group",), _process_group_ok, "a (name, description) pair of strings")
_FRAMES = "a list of {name, filename, line}"
# (fields, check, what they must be), in the order an entry is checked: its first bad field is named.
_ENTRY_CHECKS: tuple[tuple[tuple[str, ...], Callable[[Any], bool], str], ...] = (
    (_INT_FIELDS, _int_ok, "an integer"),
    (_TEXT_FIELDS, _text_ok, "a string"),
    (_BOOL_FIELDS, _bool_ok, "true or false"),
    (_SIZE_FIELDS, _sizes_ok, "a list of lists of integers"),
    (_DTYPE_FIELDS, _dtypes_ok, "a list of strings"),
    (("pg_id",), _pg_id_ok, "an integer or a string"),
    _PROCESS_GROUP,
)


def _require(e: dict[str, Any], index: int, fields: tuple[str, ...], ok: Callable[[Any], bool],
             expected: str) -> None:
    """Raise `DumpError` for the first of ``fields`` present in ``e`` that ``ok`` refuses."""
    for k in fields:
        v = e.get(k)
        if v is not None and not ok(v):
            raise _bad(index, k, v, expected)


def check_entry(e: dict[str, Any], index: int, seen_frames: set[int]) -> None:
    """Raise `DumpError` naming entry ``index``'s first field of the wrong type (absent fields are fine).

    ``seen_frames``: ids of frame dicts already checked in this dump (the objects stay alive meanwhile).
    """
    for fields, ok, expected in _ENTRY_CHECKS:
        _require(e, index, fields, ok, expected)
    _require(e, index, ("frames",), lambda v: _frames_ok(v, seen_frames), _FRAMES)


# Fields an entry of a clone (a rank whose relative trace equals a checked template's) is not compared
# on, but that its evidence record reads from its own entry (op_id is guarded where it is read).
_CLONE_INT_FIELDS = ("record_id", "time_created_ns", "time_discovered_started_ns")


def check_clone_entry(e: dict[str, Any], index: int, like: dict[str, Any], seen_frames: set[int]) -> None:
    """`check_entry` for an entry equal to the checked template entry ``like`` in every compared field
    (pg_id, sequence number, op name, sizes, dtypes, state, retired): only the other fields are checked;
    frames equal to the template's need no check either. Raises `DumpError` like `check_entry`."""
    _require(e, index, _CLONE_INT_FIELDS, _int_ok, "an integer")
    _require(e, index, *_PROCESS_GROUP)
    template_frames = like.get("frames")
    # a list compares its length first: a hostile one differs at once, without deep recursion
    _require(e, index, ("frames",),
             lambda v: v is template_frames or v == template_frames or _frames_ok(v, seen_frames), _FRAMES)


def _bad(index: int, key: str, value: Any, expected: str) -> DumpError:
    return DumpError(f"malformed dump: entry {index}: '{key}' must be {expected}, not {describe(value)}")
