"""Reading flight-recorder dumps safely: a restricted unpickler, the JSON form, and format versions.

A dump is one rank's ``_dump_fr_trace`` pickle (or ``_dump_fr_trace_json`` JSON). Nothing here imports
torch; a pickle may only build plain containers and scalars, so a hostile file cannot run code.
"""

from __future__ import annotations

import io
import json
import logging
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# <prefix><rank>[.pkl|.pickle|.json]: torch names automatic dumps <TORCH_FR_DUMP_TEMP_FILE><rank>.
_RANK_FILE = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)(?P<ext>\.(?:pkl|pickle|json))?$")
_SKIP_PREFIXES = ("stacks_rank_", "log_tail_rank_", "rank-", "error")
MAX_DUMP_BYTES = 2 * 1024**3
"""Refuse single files above this size instead of exhausting memory."""

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


def safe_unpickle(data: bytes) -> Any:
    """Unpickle plain data only. Raises `DumpError` for anything else or for a damaged pickle."""
    try:
        # BufferedReader has peek(): the C unpickler then reads ahead in large chunks instead of
        # calling read() per opcode, which makes it as fast as pickle.loads.
        return _RestrictedUnpickler(io.BufferedReader(io.BytesIO(data))).load()
    except pickle.UnpicklingError as exc:
        raise DumpError(str(exc)) from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, MemoryError) as exc:
        raise DumpError(f"damaged or truncated pickle ({exc.__class__.__name__}: {exc})") from None


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
    pg_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    pg_status: dict[str, dict[str, int]] = field(default_factory=dict)
    comm_lib_version: str = ""


def rank_from_name(name: str) -> int | None:
    """The rank encoded as the file name's trailing number (before a .pkl/.pickle/.json suffix)."""
    if name.startswith(".") or name.startswith(_SKIP_PREFIXES):
        return None
    m = _RANK_FILE.match(name)
    return int(m.group("rank")) if m else None


def _as_int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _format_info(top: dict[str, Any], entries: list[Any], json_form: bool) -> FormatInfo:
    raw_version = top.get("version")
    version = raw_version if isinstance(raw_version, str) else ""
    parsed = parse_version(version)
    notes: list[str] = []
    if parsed is None:
        notes.append(f"no usable format version ({raw_version!r}); fields detected by name")
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


def _normalise_status(raw: Any) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    if not isinstance(raw, dict):
        return out
    for pg_id, st in raw.items():
        if isinstance(st, dict):
            out[str(pg_id)] = {str(k): _as_int(v) for k, v in st.items()}
    return out


def decode_dump(data: bytes, rank: int, path: Path) -> Dump:
    """Parse the bytes of one dump (pickle or JSON, detected from the content)."""
    stripped = data.lstrip()
    json_form = stripped[:1] == b"{"
    if json_form:
        try:
            top = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DumpError(f"damaged or truncated JSON ({exc})") from None
    elif data[:1] == b"\x80":
        top = safe_unpickle(data)
    else:
        raise DumpError("not a flight-recorder dump (neither a pickle nor JSON)")
    if not isinstance(top, dict) or not ("entries" in top or "version" in top or "pg_status" in top):
        raise DumpError("not a flight-recorder dump (no 'version'/'entries' keys)")
    entries = top.get("entries", [])  # the JSON form omits 'entries' when there are none
    if not isinstance(entries, list):
        raise DumpError("malformed dump: 'entries' is not a list")
    fmt = _format_info(top, entries, json_form)
    pg_config = top.get("pg_config")
    lib = top.get("comm_lib_version", top.get("nccl_version", ""))  # renamed in format 2.9/2.10
    return Dump(
        rank=rank,
        path=path,
        fmt=fmt,
        entries=entries,  # items that are not dicts are skipped by the matcher
        pg_config=pg_config if isinstance(pg_config, dict) else {},
        pg_status=_normalise_status(top.get("pg_status")),
        comm_lib_version=lib if isinstance(lib, str) else "",
    )


def read_dump(path: Path, rank: int | None = None) -> Dump:
    """Read one dump file. Raises `DumpError` with a one-line reason on any problem."""
    if rank is None:
        rank = rank_from_name(path.name)
        if rank is None:
            raise DumpError("no rank in the file name (expected a trailing number, e.g. fr_trace_rank_3)")
    try:
        size = path.stat().st_size
        if size > MAX_DUMP_BYTES:
            raise DumpError(f"file of {size} bytes is larger than any dump ({MAX_DUMP_BYTES} bytes)")
        if size == 0:
            raise DumpError("empty file")
        data = path.read_bytes()
    except OSError as exc:
        raise DumpError(f"cannot read: {exc.strerror or exc}") from None
    return decode_dump(data, rank, path)


def _preference(p: Path) -> tuple[int, int, str]:
    ext = {".pkl": 0, ".pickle": 0, "": 1, ".json": 2}.get(p.suffix if p.suffix in (".pkl", ".pickle", ".json")
                                                          else "", 1)
    name = p.name.lower()
    traced = 0 if ("trace" in name or "fr" in name or "nccl" in name or "dump" in name) else 1
    return (traced, ext, p.name)


def find_dump_files(directory: Path) -> dict[int, list[Path]]:
    """Rank -> candidate dump files in ``directory``, best first.

    Several files can carry one rank's number (a pickle and its JSON twin, unrelated numbered files);
    the reader tries them in order: names that look like traces first, then pickles (they carry
    frames), then files without suffix, then JSON.
    """
    found: dict[int, list[Path]] = {}
    for p in sorted(directory.iterdir()):
        if not p.is_file():
            continue
        rank = rank_from_name(p.name)
        if rank is not None:
            found.setdefault(rank, []).append(p)
    for paths in found.values():
        paths.sort(key=_preference)
    return found
