"""Reading flight-recorder dumps safely: files, the JSON form, format versions and normalised fields.

A dump is one rank's flight-recorder pickle, or its JSON form (`trainguard.torch_api.c10d` makes both).
Nothing here imports torch; pickles are decoded by `trainguard.localize.unpickle`, which builds plain data
only.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.localize.unpickle import MAX_OBJECT_BYTES, DumpError, check_budget, safe_unpickle

log = logging.getLogger(__name__)

__all__ = ["MAX_DUMP_BYTES", "MAX_ENTRIES", "MAX_FIELD_INT", "MAX_OBJECT_BYTES", "MAX_RANK", "Dump", "DumpError",
           "FormatInfo", "GroupConfigs", "check_rank", "decode_dump", "describe", "find_dump_files", "parse_version",
           "rank_from_name", "read_dump", "read_regular_file", "safe_unpickle"]

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
MAX_FIELD_INT = 2**63
"""Integers in a dump (sequence numbers, times, sizes) are int64 in torch; anything beyond is damage."""

NEWEST_KNOWN = (2, 10)
"""Newest dump format this reader knows (torch 2.13 writes '2.10')."""
OLDEST_KNOWN = (2, 0)


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
        check_budget(data, b"", b"[{")
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
