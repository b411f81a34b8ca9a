"""Reading flight-recorder dumps safely: a restricted unpickler, the JSON form, and format versions.

A dump is one rank's ``_dump_fr_trace`` pickle (or ``_dump_fr_trace_json`` JSON). Nothing here imports
torch; a pickle may only build plain containers and scalars, so a hostile file cannot run code.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import mmap
import os
import pickle
import re
import stat
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import resource
except ImportError:  # not a POSIX system: pickles are then walked opcode by opcode instead
    resource = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

# <prefix><rank>[.pkl|.pickle|.json]: torch names automatic dumps <TORCH_FR_DUMP_TEMP_FILE><rank>.
_RANK_FILE = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)(?P<ext>\.(?:pkl|pickle|json))?$")
_SKIP_PREFIXES = ("stacks_rank_", "log_tail_rank_", "rank-", "error")

MAX_RANK = 2**20 - 1
"""Highest rank accepted anywhere (file names, rank maps, group members, world sizes up to MAX_RANK + 1).
Ranks are expected ranks: memory grows with them, so a number an input merely claims is capped."""
MAX_DUMP_BYTES = 64 * 1024**2
"""Refuse single files above this size: torch's 2,000-entry dump is ~0.3 MB, 100,000 entries ~16 MB."""
MAX_ENTRIES = 100_000
"""Entries analysed per dump (the recorder keeps 2,000 by default); older ones beyond it are dropped."""
MAX_OBJECT_BYTES = 1024**3
"""Upper bound, estimated from the bytes before decoding, of the memory one dump may build."""
MAX_FIELD_INT = 2**63
"""Integers in a dump (sequence numbers, times, sizes) are int64 in torch; anything beyond is damage."""

NEWEST_KNOWN = (2, 10)
"""Newest dump format this reader knows (torch 2.13 writes '2.10')."""
OLDEST_KNOWN = (2, 0)


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
        if op in _LEN1:
            if pos + 1 >= n:
                break
            pos += 2 + data[pos + 1]
        elif op in _LEN4:
            size = int.from_bytes(data[pos + 1:pos + 5], "little", signed=op == 0x8B)
            if size < 0:
                raise DumpError(f"damaged pickle: negative length at byte {pos}")
            pos += 5 + size
        elif op in _LEN8:
            pos += 9 + int.from_bytes(data[pos + 1:pos + 9], "little")
        elif op == 0x72:  # LONG_BINPUT with an index of 2**20 or more
            idx = int.from_bytes(data[pos + 1:pos + 5], "little")
            if idx >= limit:
                raise DumpError(f"refused: pickle memo index {idx} at byte {pos} is impossible in a file of "
                                f"{n} bytes (it would allocate gigabytes)")
            pos += 5
        elif op in _TEXT1 or op in _TEXT2:
            end = data.find(b"\n", pos + 1)
            if op in _TEXT2 and end >= 0:
                end = data.find(b"\n", end + 1)
            if end < 0:
                break
            if op == 0x70:  # PUT <decimal index>
                arg = data[pos + 1:end]
                if len(arg) > 18 or not arg.isdigit() or int(arg) >= limit:
                    raise DumpError(f"refused: pickle memo index {arg[:20]!r} at byte {pos} is impossible "
                                    f"in a file of {n} bytes")
            pos = end + 1
        else:
            raise DumpError(f"damaged pickle: unknown opcode 0x{op:02x} at byte {pos}")
    raise DumpError("damaged or truncated pickle (no STOP opcode)")


def _estimate_bytes(data: bytes, heavy: bytes, light: bytes) -> int:
    """Upper bound of the memory decoding ``data`` can build, counted in two passes over the bytes."""
    n = len(data)
    n_heavy = n - len(data.translate(None, heavy))
    n_light = n - len(data.translate(None, light))
    return 32 * n + 240 * n_heavy + 80 * n_light


def _worst_case_bytes(n: int, heavy: bytes, light: bytes) -> int:
    """`_estimate_bytes` if every byte were of the costliest kind: needs no pass over the data."""
    return n * (32 + (240 if heavy else 80 if light else 0))


def _check_budget(data: bytes, heavy: bytes, light: bytes) -> None:
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
    _check_budget(data, _HEAVY, _LIGHT)
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


def parse_version(raw: Any) -> tuple[int, int] | None:
    """'2.10' -> (2, 10); None when absent or not of the form major.minor."""
    if not isinstance(raw, str):
        return None
    m = re.fullmatch(r"(\d+)\.(\d+)", raw.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass(frozen=True)
class FormatInfo:
    """How to read one dump, decided from its ``version`` field and the keys actually present."""

    version: str
    """The dump's own ``version`` string ('' when absent)."""
    seq_key: str
    """``collective_seq_id`` (format 2.x) or ``seq_id`` (1.x dumps, one counter for everything)."""
    has_p2p_flag: bool
    """``is_p2p`` present; otherwise point-to-point is inferred from the op name (send/recv)."""
    has_dtypes: bool
    """``input_dtypes``/``output_dtypes`` present (format >= 2.3); dtypes are compared only then."""
    json_form: bool
    """Read from the JSON form: times are 0 instead of None, pg_status values are strings, no frames."""
    notes: tuple[str, ...] = ()
    """Warnings about this file's format (newer than known, guessed fields)."""


@dataclass
class Dump:
    """One rank's dump, with the top-level fields normalised across format versions."""

    rank: int
    path: Path
    fmt: FormatInfo
    entries: list[Any]
    """Raw entries (dicts in any real dump; anything else is skipped when matching)."""
    pg_config: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    """Group name -> {name, desc, ranks (raw)} (a `GroupConfigs`, normalised on lookup)."""
    pg_status: dict[str, dict[str, int]] = field(default_factory=dict)
    comm_lib_version: str = ""


def rank_from_name(name: str) -> int | None:
    """The rank encoded as the file name's trailing number (before a .pkl/.pickle/.json suffix)."""
    if name.startswith(".") or name.startswith(_SKIP_PREFIXES):
        return None
    m = _RANK_FILE.match(name)
    return int(m.group("rank")) if m else None


def check_rank(rank: int, what: str) -> None:
    """Refuse a rank above `MAX_RANK`: memory for expected ranks must not follow a number a file claims."""
    if rank > MAX_RANK:
        raise DumpError(f"rank {rank} in {what} is above {MAX_RANK}, the highest rank supported; not a dump of "
                        "this job")


def _as_int(value: Any, default: int = -1) -> int:
    """An int64 from an int or its decimal string (the JSON form); ``default`` for anything else."""
    if isinstance(value, str) and 0 < len(value) <= 20:
        try:
            value = int(value)
        except ValueError:
            return default
    if isinstance(value, int) and -MAX_FIELD_INT < value < MAX_FIELD_INT:
        return int(value)
    return default


def describe(value: Any) -> str:
    """A short, safe description of a value from a file: never the repr of a huge or deeply nested one."""
    if isinstance(value, str):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return str(value) if -MAX_FIELD_INT < value < MAX_FIELD_INT else "an integer out of range"
    return f"a {type(value).__name__}"


def _format_info(top: dict[str, Any], entries: list[Any], json_form: bool) -> FormatInfo:
    raw_version = top.get("version")
    version = raw_version[:32] if isinstance(raw_version, str) else ""
    parsed = parse_version(version)
    notes: list[str] = []
    if parsed is None:
        notes.append(f"no usable format version ({describe(raw_version)}); fields detected by name")
    elif parsed > NEWEST_KNOWN:
        notes.append(
            f"format {version} is newer than the newest known ({NEWEST_KNOWN[0]}.{NEWEST_KNOWN[1]}); "
            "analysed by field names"
        )
    elif parsed < OLDEST_KNOWN:
        notes.append(f"format {version} predates 2.0 (one seq_id counter for collectives and p2p)")
    sample = next((e for e in entries if isinstance(e, dict)), {})
    if "collective_seq_id" in sample:
        seq_key = "collective_seq_id"
    elif "seq_id" in sample:
        seq_key = "seq_id"
    else:
        seq_key = "collective_seq_id"
    return FormatInfo(
        version=version,
        seq_key=seq_key,
        has_p2p_flag="is_p2p" in sample,
        has_dtypes="input_dtypes" in sample,
        json_form=json_form,
        notes=tuple(notes),
    )


def _group_key(key: Any) -> str | None:
    """A process-group key as text: a string, or an int64 (the JSON form and old dumps); else None."""
    if isinstance(key, str):
        return key[:256]
    if isinstance(key, int) and not isinstance(key, bool) and -MAX_FIELD_INT < key < MAX_FIELD_INT:
        return str(key)
    return None


def _normalise_status(raw: Any) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    if not isinstance(raw, dict):
        return out
    for pg_id, st in raw.items():
        key = _group_key(pg_id)
        if key is not None and isinstance(st, dict):
            out[key] = {k: _as_int(v) for k, v in st.items() if isinstance(k, str)}
    return out


def _clean_config(cfg: Any) -> dict[str, Any] | None:
    """One pg_config value with text name and description; the member list stays raw (parsed lazily,
    bounded); None when it is not a dict."""
    if not isinstance(cfg, dict):
        return None
    clean: dict[str, Any] = {}
    for field_name in ("name", "desc"):
        v = cfg.get(field_name)
        if v is not None:
            clean[field_name] = _group_key(v) or ""
    ranks = cfg.get("ranks")
    if isinstance(ranks, (str, list, tuple)):
        clean["ranks"] = ranks
    return clean


class GroupConfigs(Mapping[str, dict[str, Any]]):
    """A dump's ``pg_config`` by group name, each value normalised when it is first looked up.

    NCCL dumps list every group of the job in every rank's dump (thousands at scale), while the matcher
    reads the whole table once per analysis and otherwise looks up a few groups per rank: normalising
    every dump's table up front cost work proportional to ranks x groups.
    """

    __slots__ = ("_clean", "_raw")

    def __init__(self, raw: Any) -> None:
        self._raw: dict[Any, Any] = raw if isinstance(raw, dict) else {}
        self._clean: dict[str, dict[str, Any] | None] = {}

    def _lookup(self, name: str) -> dict[str, Any] | None:
        if name in self._clean:
            return self._clean[name]
        raw = self._raw.get(name)
        if raw is None and name.lstrip("-").isdigit() and len(name) <= 20:
            raw = self._raw.get(int(name))  # the JSON form and old dumps may key groups by number
        out = self._clean[name] = _clean_config(raw)
        return out

    def __getitem__(self, name: str) -> dict[str, Any]:
        out = self._lookup(name) if isinstance(name, str) else None
        if out is None:
            raise KeyError(name)
        return out

    def __iter__(self) -> Iterator[str]:
        for key, cfg in self._raw.items():
            name = _group_key(key)
            if name is not None and isinstance(cfg, dict):
                yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:
        return next(iter(self), None) is not None  # stops at the first valid group


def decode_dump(data: bytes, rank: int, path: Path) -> Dump:
    """Parse the bytes of one dump (pickle or JSON, detected from the content)."""
    stripped = data.lstrip()
    json_form = stripped[:1] == b"{"
    if json_form:
        _check_budget(data, b"", b"[{")
        try:
            top = json.loads(data)
        except (UnicodeDecodeError, RecursionError, ValueError) as exc:  # ValueError: JSON errors, huge ints
            raise DumpError(f"damaged or truncated JSON ({exc.__class__.__name__}: {str(exc)[:200]})") from None
    elif data[:1] == b"\x80":
        top = safe_unpickle(data)
    else:
        raise DumpError("not a flight-recorder dump (neither a pickle nor JSON)")
    if not isinstance(top, dict) or not ("entries" in top or "version" in top or "pg_status" in top):
        raise DumpError("not a flight-recorder dump (no 'version'/'entries' keys)")
    entries = top.get("entries", [])  # the JSON form omits 'entries' when there are none
    if not isinstance(entries, list):
        raise DumpError(f"malformed dump: 'entries' is {describe(entries)}, not a list")
    dropped = len(entries) - MAX_ENTRIES
    if dropped > 0:
        # the ring buffer is oldest first: the newest entries say where each rank is now
        entries = entries[dropped:]
    fmt = _format_info(top, entries, json_form)
    if dropped > 0:
        fmt = FormatInfo(fmt.version, fmt.seq_key, fmt.has_p2p_flag, fmt.has_dtypes, fmt.json_form,
                         (*fmt.notes, f"{dropped + MAX_ENTRIES} entries (the recorder keeps 2,000 by default); "
                                      f"only the newest {MAX_ENTRIES} are analysed"))
    lib = top.get("comm_lib_version", top.get("nccl_version", ""))  # renamed in format 2.9/2.10
    return Dump(
        rank=rank,
        path=path,
        fmt=fmt,
        entries=entries,  # items that are not dicts are skipped by the matcher; fields checked there
        pg_config=GroupConfigs(top.get("pg_config")),
        pg_status=_normalise_status(top.get("pg_status")),
        comm_lib_version=lib[:64] if isinstance(lib, str) else "",
    )


def read_regular_file(path: Path, limit: int, *, tail: bool = False) -> bytes:
    """The bytes of a regular file, never through a symbolic link and never blocking on a FIFO.

    At most ``limit`` bytes: a longer file raises `DumpError`, or with ``tail`` its last ``limit`` bytes
    are returned. Raises `DumpError` with a one-line reason.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DumpError("refused: a symbolic link (evidence files are never followed)") from None
        raise DumpError(f"cannot read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DumpError("refused: not a regular file (a FIFO, socket or device)")
        size = st.st_size
        if size > limit and not tail:
            raise DumpError(f"file of {size} bytes is larger than any dump ({limit} bytes)")
        if size == 0:
            raise DumpError("empty file")
        start = max(size - limit, 0)
        chunks = []
        want = min(size, limit)
        while want > 0:  # a file that grows while being read is cut at its size when opened
            chunk = os.pread(fd, min(want, 1 << 24), start)
            if not chunk:
                break
            chunks.append(chunk)
            start += len(chunk)
            want -= len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise DumpError(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_dump(path: Path, rank: int | None = None) -> Dump:
    """Read one dump file. Raises `DumpError` with a one-line reason on any problem."""
    if rank is None:
        rank = rank_from_name(path.name)
        if rank is None:
            raise DumpError("no rank in the file name (expected a trailing number, e.g. fr_trace_rank_3)")
    check_rank(rank, "the file name")
    return decode_dump(read_regular_file(path, MAX_DUMP_BYTES), rank, path)


def _preference(p: Path) -> tuple[int, int, str]:
    ext = {".pkl": 0, ".pickle": 0, "": 1, ".json": 2}.get(p.suffix if p.suffix in (".pkl", ".pickle", ".json")
                                                          else "", 1)
    name = p.name.lower()
    traced = 0 if ("trace" in name or "fr" in name or "nccl" in name or "dump" in name) else 1
    return (traced, ext, p.name)


def find_dump_files(directory: Path, refused: list[tuple[str, str]] | None = None) -> dict[int, list[Path]]:
    """Rank -> candidate dump files in ``directory``, best first.

    Several files can carry one rank's number (a pickle and its JSON twin, unrelated numbered files);
    the reader tries them in order: names that look like traces first, then pickles (they carry
    frames), then files without suffix, then JSON. Links, FIFOs and other non-regular files are listed
    too (the reader refuses them, so the rank counts as unreadable); directories are not. A name whose
    rank is above `MAX_RANK` is left out and, when ``refused`` is given, appended to it with the reason.
    """
    found: dict[int, list[Path]] = {}
    with os.scandir(directory) as it:
        names = sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
    for name, is_dir in names:
        if is_dir:
            continue
        rank = rank_from_name(name)
        if rank is None:
            continue
        try:
            check_rank(rank, "the file name")
        except DumpError as exc:
            if refused is not None:
                refused.append((name, str(exc)))
            continue
        found.setdefault(rank, []).append(directory / name)
    for paths in found.values():
        paths.sort(key=_preference)
    return found
