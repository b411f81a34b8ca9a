"""Type checks of a flight-recorder entry's fields, so damaged or hostile dumps are refused up front.

The matcher compares, hashes, formats and prints entry fields; a string where an int belongs, a list
nested 100,000 deep or an int of 5,000 digits would otherwise surface as a TypeError, a RecursionError
or an over-long conversion deep inside the analysis. Every check has a fixed depth, so it is safe on
anything the restricted unpickler can build (cycles included).
"""

from __future__ import annotations

import logging
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


def check_entry(e: dict[str, Any], index: int, seen_frames: set[int]) -> None:
    """Raise `DumpError` naming entry ``index``'s first field of the wrong type (absent fields are fine).

    ``seen_frames``: ids of frame dicts already checked in this dump (the objects stay alive meanwhile).
    """
    get = e.get
    for k in _INT_FIELDS:
        v = get(k)
        if v is not None and not _int_ok(v):
            raise _bad(index, k, v, "an integer")
    for k in _TEXT_FIELDS:
        v = get(k)
        if v is not None and not _text_ok(v):
            raise _bad(index, k, v, "a string")
    for k in _BOOL_FIELDS:
        v = get(k)
        if v is not None and v.__class__ is not bool:
            raise _bad(index, k, v, "true or false")
    for k in _SIZE_FIELDS:
        v = get(k)
        if v is not None and not _sizes_ok(v):
            raise _bad(index, k, v, "a list of lists of integers")
    for k in _DTYPE_FIELDS:
        v = get(k)
        if v is not None and not _dtypes_ok(v):
            raise _bad(index, k, v, "a list of strings")
    v = get("pg_id")
    if v is not None and not (_int_ok(v) or _text_ok(v)):
        raise _bad(index, "pg_id", v, "an integer or a string")
    v = get("process_group")
    if v is not None and not (v.__class__ in (list, tuple) and 0 < len(v) <= 8 and all(_text_ok(x) for x in v)):
        raise _bad(index, "process_group", v, "a (name, description) pair of strings")
    v = get("frames")
    if v is not None and not _frames_ok(v, seen_frames):
        raise _bad(index, "frames", v, "a list of {name, filename, line}")


# Fields an entry of a clone (a rank whose relative trace equals a checked template's) is not compared
# on, but that its evidence record reads from its own entry (op_id is guarded where it is read).
_CLONE_INT_FIELDS = ("record_id", "time_created_ns", "time_discovered_started_ns")


def check_clone_entry(e: dict[str, Any], index: int, like: dict[str, Any], seen_frames: set[int]) -> None:
    """`check_entry` for an entry equal to the checked template entry ``like`` in every compared field
    (pg_id, sequence number, op name, sizes, dtypes, state, retired): only the other fields are checked;
    frames equal to the template's need no check either. Raises `DumpError` like `check_entry`."""
    get = e.get
    for k in _CLONE_INT_FIELDS:
        v = get(k)
        if v is not None and not _int_ok(v):
            raise _bad(index, k, v, "an integer")
    v = get("process_group")
    if v is not None and not (v.__class__ in (list, tuple) and 0 < len(v) <= 8 and all(_text_ok(x) for x in v)):
        raise _bad(index, "process_group", v, "a (name, description) pair of strings")
    v = get("frames")
    if v is not None:
        t = like.get("frames")
        # a list compares its length first: a hostile one differs at once, without deep recursion
        if v is not t and v != t and not _frames_ok(v, seen_frames):
            raise _bad(index, "frames", v, "a list of {name, filename, line}")


def _bad(index: int, key: str, value: Any, expected: str) -> DumpError:
    return DumpError(f"malformed dump: entry {index}: '{key}' must be {expected}, not {describe(value)}")
