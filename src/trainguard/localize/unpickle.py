"""Unpickling flight-recorder dumps safely: plain data only, within a memory budget fixed by the file's size.

Nothing here imports torch; a pickle may only build plain containers and scalars, so a hostile file
cannot run code, and its size bounds the memory decoding it may take.
"""

from __future__ import annotations

import io
import logging
import mmap
import os
import pickle
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

try:
    import resource
except ImportError:  # not a POSIX system: pickles are then walked opcode by opcode instead
    resource = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

MAX_OBJECT_BYTES = 1024**3
"""Upper bound, estimated from the bytes before decoding, of the memory one dump may build."""


class DumpError(Exception):
    """One file could not be read as a dump; the message says why (reported as a per-file warning)."""


class _RestrictedUnpickler(pickle.Unpickler):
    """Builds only dicts, lists, tuples, strings, bytes, numbers, booleans and None."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused: the pickle references {module}.{name} (not plain data)")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused: the pickle uses persistent ids (not plain data)")


# Opcodes with a fixed-size argument, matched in runs by one regular expression (C speed): the
# Python loop below only steps over variable-length ones. LONG_BINPUT ('r') is in a run only when its
# memo index is below 2**20: the C unpickler sizes its memo array to twice the largest index it is
# given, so 9 bytes asking for index 10**8 would allocate 1.6 GB.
def _short_payloads() -> bytes:
    """Regex alternatives for opcodes whose payload length is short and spelled in the opcode's argument:
    ints of up to 16 bytes (LONG1) and strings of up to 32 (every time stamp and most names), so the
    run does not stop at each of them."""
    alts = [rb"\x8a(?:" + b"|".join(re.escape(bytes([k])) + rb"[\x00-\xff]{%d}" % k for k in range(17)) + b")"]
    for op in (b"\x8c", b"C", b"U"):  # one length byte
        alts.append(op + b"(?:" + b"|".join(re.escape(bytes([k])) + rb"[\x00-\xff]{%d}" % k
                                            for k in range(33)) + b")")
    for op in (b"X", b"B", b"T"):  # four length bytes
        alts.append(op + b"(?:" + b"|".join(re.escape(bytes([k])) + rb"\x00\x00\x00[\x00-\xff]{%d}" % k
                                            for k in range(33)) + b")")
    return b"|".join(alts)


_FIXED_RUN = re.compile(
    rb"(?:[Khq\x80\x82][\x00-\xff]|[()0-2NRbd}ael\]ostu\x81\x85-\x89\x8f-\x94\x97\x98Q]"
    rb"|[M\x83][\x00-\xff]{2}|[Jj\x84][\x00-\xff]{4}"
    rb"|r[\x00-\xff]{2}[\x00-\x0f]\x00|[G\x95][\x00-\xff]{8}|" + _short_payloads() + rb")++",
    re.DOTALL,  # possessive: no backtracking state is kept per opcode
)
_LEN1 = frozenset(b"UC\x8c\x8a")  # one length byte, then the payload
_LEN4 = frozenset(b"TXB\x8b")  # four length bytes
_LEN8 = frozenset(b"\x8d\x8e\x96")  # eight length bytes
_TEXT1 = frozenset(b"ILFSVPgp")  # an argument line ending in a newline
_SIZED = _LEN1 | _LEN4 | _LEN8 | {0x72}  # 0x72: LONG_BINPUT, a 4-byte memo index
_TEXT2 = frozenset(b"ci")  # two lines (module, name): refused later by find_class, but scanned here
_MEMO_SLACK = 1 << 20
# Bytes that make the unpickler build a container, with what one costs at most (a set is 216 bytes
# empty; a mark can end in a frozenset). Every other byte builds at most ~32 bytes (a reference, an
# int, a short string): see _estimate_bytes.
_HEAVY = b"(\x8f\x91"
_LIGHT = b"}]\x85\x86\x87"


def _scan_pickle(data: bytes) -> None:
    """Walk the opcodes without building anything; refuse memo indexes a pickle of this size cannot need.

    A genuine pickle numbers memo slots densely, so an index beyond the number of bytes is damage or an
    attack. Raises `DumpError`; the C unpickler reports every other problem itself.
    """
    n = len(data)
    limit = max(n, _MEMO_SLACK)
    run = _FIXED_RUN.match
    pos = 0
    while pos < n:
        m = run(data, pos)
        if m is not None:
            pos = m.end()
            if pos >= n:
                break
        op = data[pos]
        if op == 0x2E:  # STOP: the unpickler ignores what follows
            return
        if op in _SIZED:
            pos = _sized_opcode_end(data, pos, limit)
            if pos < 0:
                break
        elif op in _TEXT1 or op in _TEXT2:  # protocol-0 opcodes, rare: stepped over in a helper
            end = _text_opcode_end(data, pos, limit)
            if end < 0:
                break
            pos = end + 1
        else:
            raise DumpError(f"damaged pickle: unknown opcode 0x{op:02x} at byte {pos}")
    raise DumpError("damaged or truncated pickle (no STOP opcode)")


def _sized_opcode_end(data: bytes, pos: int, limit: int) -> int:
    """Where the opcode at ``pos`` with a length (or a 4-byte memo index) after it ends (-1: truncated); a
    LONG_BINPUT's memo index must be below ``limit``."""
    op = data[pos]
    if op in _LEN1:
        return -1 if pos + 1 >= len(data) else pos + 2 + data[pos + 1]
    if op in _LEN4:
        size = int.from_bytes(data[pos + 1:pos + 5], "little", signed=op == 0x8B)
        if size < 0:
            raise DumpError(f"damaged pickle: negative length at byte {pos}")
        return pos + 5 + size
    if op in _LEN8:
        return pos + 9 + int.from_bytes(data[pos + 1:pos + 9], "little")
    # LONG_BINPUT with an index of 2**20 or more
    idx = int.from_bytes(data[pos + 1:pos + 5], "little")
    if idx >= limit:
        raise DumpError(f"refused: pickle memo index {idx} at byte {pos} is impossible in a file of "
                        f"{len(data)} bytes (it would allocate gigabytes)")
    return pos + 5


def _text_opcode_end(data: bytes, pos: int, limit: int) -> int:
    """Where the argument line(s) of the text opcode at ``pos`` end (-1: truncated); a PUT's decimal
    memo index must be below ``limit``."""
    op = data[pos]
    end = data.find(b"\n", pos + 1)
    if op in _TEXT2 and end >= 0:
        end = data.find(b"\n", end + 1)
    if op == 0x70 and end >= 0:  # PUT <decimal index>
        arg = data[pos + 1:end]
        if len(arg) > 18 or not arg.isdigit() or int(arg) >= limit:
            raise DumpError(f"refused: pickle memo index {arg[:20]!r} at byte {pos} is impossible "
                            f"in a file of {len(data)} bytes")
    return end


def _estimate_bytes(data: bytes, heavy: bytes, light: bytes) -> int:
    """Upper bound of the memory decoding ``data`` can build, counted in two passes over the bytes."""
    n = len(data)
    n_heavy = n - len(data.translate(None, heavy))
    n_light = n - len(data.translate(None, light))
    return 32 * n + 240 * n_heavy + 80 * n_light


def _worst_case_bytes(n: int, heavy: bytes, light: bytes) -> int:
    """`_estimate_bytes` if every byte were of the costliest kind: needs no pass over the data."""
    return n * (32 + (240 if heavy else 80 if light else 0))


def check_budget(data: bytes, heavy: bytes, light: bytes) -> None:
    """Raise `DumpError` when decoding ``data`` could build more than `MAX_OBJECT_BYTES`; ``heavy`` and
    ``light`` are the bytes that open a costly or a cheap container in its format."""
    if _worst_case_bytes(len(data), heavy, light) <= MAX_OBJECT_BYTES:
        return  # under ~4 MB (every real 2,000-entry dump): even the worst case fits, nothing to count
    est = _estimate_bytes(data, heavy, light)
    if est > MAX_OBJECT_BYTES:
        raise DumpError(f"refused: decoding could build up to {est // 1024**2} MB of objects "
                        f"(limit {MAX_OBJECT_BYTES // 1024**2} MB); no real dump needs that")


# --- the memory cap while a pickle is decoded -----------------------------------------------------------
#
# Besides the objects its bytes spell out (bounded by `_check_budget`), the C unpickler allocates from
# the input in one place: a PUT / LONG_BINPUT index sizes its memo array (twice the index, zero-filled),
# so 9 bytes can ask for gigabytes. Finding those opcodes needs a walk over every opcode, which costs as
# much as unpickling itself. Instead, where the kernel enforces it, the process's data segment
# (RLIMIT_DATA: heap and private writable mappings) is capped while one pickle is decoded, at what the
# file's size can justify: a memo (or anything else) beyond it fails to allocate at once, before a byte
# of it is touched, and the exact walk then runs only to say why.

_CAP_SLACK = 64 * 1024**2
"""Headroom of the cap beyond what the file can build: the interpreter's own allocations meanwhile."""
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_cap_lock = threading.Lock()  # the limit is per process: one capped decode at a time
_cap_state: list[bool] = []  # [whether RLIMIT_DATA is enforced here], decided on first use


def _data_in_use() -> int | None:
    """The data segment's size as RLIMIT_DATA counts it (from /proc/self/statm), or None."""
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        return int(os.read(fd, 256).split()[5]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(fd)


def _cap_enforced() -> bool:
    """Whether capping RLIMIT_DATA stops an allocation here (Linux >= 4.7 also counts mmap); probed once
    by mapping 256 MB (never touched) under a 16 MB cap."""
    if not _cap_state:
        ok = False
        if resource is not None and sys.platform.startswith("linux"):
            with _cap_lock, _capped(16 * 1024**2) as capped:
                if capped:
                    try:  # private and writable, like the heap (a shared mapping is not counted)
                        mmap.mmap(-1, 256 * 1024**2, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS).close()
                    except (OSError, MemoryError):
                        ok = True
        _cap_state.append(ok)
    return _cap_state[0]


@contextmanager
def _capped(headroom: int) -> Iterator[bool]:
    """While the block runs, the data segment may grow by ``headroom`` bytes at most (never above a
    limit already set); yields False, capping nothing, where the limit cannot be set."""
    used = _data_in_use()
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    except (AttributeError, OSError, ValueError):
        used = None
    if used is None:
        yield False
        return
    limit = used + headroom
    inf = resource.RLIM_INFINITY
    if soft != inf and soft <= limit:
        yield True  # a lower limit is already in place: it bounds this decode too
        return
    if hard != inf:
        limit = min(limit, hard)
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (OSError, ValueError):
        yield False
        return
    try:
        yield True
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


def _load(data: bytes) -> Any:
    try:
        # BufferedReader has peek(): the C unpickler then reads ahead in large chunks instead of
        # calling read() per opcode, which makes it as fast as pickle.loads.
        return _RestrictedUnpickler(io.BufferedReader(io.BytesIO(data))).load()
    except MemoryError:
        raise
    except pickle.UnpicklingError as exc:
        raise DumpError(str(exc)[:300]) from None
    except Exception as exc:  # nothing but plain data can be built: any error means damage
        raise DumpError(f"damaged or truncated pickle ({exc.__class__.__name__}: {str(exc)[:200]})") from None


def safe_unpickle(data: bytes) -> Any:
    """Unpickle plain data only, within `MAX_OBJECT_BYTES`. Raises `DumpError` for anything else."""
    check_budget(data, _HEAVY, _LIGHT)
    if not _cap_enforced():
        _scan_pickle(data)  # no cap here: find the memo indexes by walking every opcode
        try:
            return _load(data)
        except MemoryError:
            raise DumpError("refused: not enough memory to decode this pickle") from None
    headroom = min(_worst_case_bytes(len(data), _HEAVY, _LIGHT), MAX_OBJECT_BYTES) + _CAP_SLACK
    try:
        with _cap_lock, _capped(headroom) as capped:
            if not capped:  # e.g. /proc unreadable: fall back to the walk
                _scan_pickle(data)
            return _load(data)
    except MemoryError:
        pass
    _scan_pickle(data)  # the usual cause is an impossible memo index: name it
    raise DumpError(f"refused: decoding this pickle of {len(data)} bytes needed more than "
                    f"{headroom // 1024**2} MB, more than a file of its size can build")
