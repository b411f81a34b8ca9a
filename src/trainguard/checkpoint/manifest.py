"""Checkpoint manifests: what a committed checkpoint contains, how it is verified and committed.

A checkpoint directory ``step-<N>/`` exists for the loader only once ``manifest.json`` is in it; the
manifest is written into the staging directory last and the directory is then renamed into place, so a
crash at any moment leaves either a complete checkpoint or an invisible staging directory.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

from trainguard.checkpoint.checksum import fd_checksum
from trainguard.checkpoint.errors import CheckpointError
from trainguard.checkpoint.safefs import FILE_MODE, check_name, open_checkpoint_dir, open_regular, read_capped

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
FORMAT = "trainguard-checkpoint"
FORMAT_VERSION = 1
STEP_DIR = re.compile(r"^step-(0|[1-9][0-9]{0,17})$", re.ASCII)
"""``step-<N>``: ASCII digits, no leading zero (so ``step_dir(N)`` names it back), at most 18 digits."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint."""

    size: int
    """Bytes."""
    checksum: str
    """Hex digest of the whole file with the manifest's ``checksum_algorithm``."""


@dataclass(frozen=True)
class Manifest:
    """The committed description of one checkpoint (``manifest.json``)."""

    step: int
    """The training step saved; equals the ``N`` of its ``step-<N>`` directory."""
    world_size: int
    """Ranks that wrote it."""
    files: dict[str, FileEntry]
    """File name (relative to the checkpoint directory) -> size and checksum."""
    structure: dict[str, dict[str, Any]]
    """Flattened state key -> {"kind": "tensor", "shape": [...], "dtype": "float32"} or {"kind": "object"}."""
    checksum_algorithm: str = "crc32"
    """``xxh3_64`` or ``crc32`` (see `trainguard.checkpoint.checksum`)."""
    time: float = 0.0
    """Unix seconds when the manifest was written."""
    trainguard_version: str = ""
    """trainguard version of the writer."""
    torch_version: str = ""
    """torch version of the writer."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Reserved (``{}``)."""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "step": self.step,
            "world_size": self.world_size,
            "time": self.time,
            "trainguard_version": self.trainguard_version,
            "torch_version": self.torch_version,
            "checksum": self.checksum_algorithm,
            "files": {n: {"size": f.size, "checksum": f.checksum} for n, f in sorted(self.files.items())},
            "structure": self.structure,
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        """Validate against the schema (types, bounds, names); `CheckpointError` naming what is wrong."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CheckpointError("not a trainguard checkpoint manifest")
        version = data.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
            raise CheckpointError(f"unsupported manifest format_version {_show(version)}")
        unknown = sorted(set(data) - _REQUIRED - _OPTIONAL)
        if unknown:
            raise CheckpointError(f"malformed manifest: unknown field {_show(unknown[0])}")
        missing = sorted(_REQUIRED - set(data))
        if missing:
            raise CheckpointError(f"malformed manifest: field {missing[0]!r} is missing")
        step = _int_field(data, "step", 0, MAX_STEP)
        world = _int_field(data, "world_size", 1, MAX_WORLD_SIZE)
        algorithm = _str_field(data, "checksum", MAX_ALGORITHM_CHARS)
        if not _ALGORITHM.match(algorithm):
            raise CheckpointError(f"malformed manifest: checksum algorithm {_show(algorithm)} is not a name")
        when = data.get("time", 0.0)
        if not _is_number(when) or not math.isfinite(when) or not 0 <= when <= MAX_TIME:
            raise CheckpointError(f"malformed manifest: time {_show(when)} is not Unix seconds")
        versions = {k: _str_field(data, k, MAX_VERSION_CHARS) if k in data else "" for k in _VERSIONS}
        extra = data.get("extra", {})
        if not isinstance(extra, dict) or len(extra) > MAX_EXTRA_KEYS:
            raise CheckpointError(f"malformed manifest: extra must be an object of at most {MAX_EXTRA_KEYS} keys")
        return cls(
            step=step,
            world_size=world,
            files=_files(data["files"], algorithm),
            structure=_structure(data["structure"]),
            checksum_algorithm=algorithm,
            time=float(when),
            trainguard_version=versions["trainguard_version"],
            torch_version=versions["torch_version"],
            extra=dict(extra),
        )


# Schema bounds: far above any real checkpoint, low enough that a damaged manifest cannot make the
# loader allocate, read or loop without end.
MAX_MANIFEST_BYTES = 64 << 20
"""A manifest larger than this is refused unread (a 16k-rank, 100k-tensor job writes a few MB)."""
MAX_FILES = 1 << 20
MAX_FILE_BYTES = 1 << 44
"""16 TiB: a shard claiming more is damage, not data."""
MAX_STRUCTURE_ENTRIES = 1 << 22
MAX_KEY_CHARS = 4096
MAX_DIMS = 64
MAX_DIM = 1 << 48
MAX_STEP = (1 << 63) - 1
MAX_WORLD_SIZE = 1 << 24
MAX_TIME = 1e11
MAX_VERSION_CHARS = 256
MAX_ALGORITHM_CHARS = 32
MAX_DIGEST_CHARS = 128
MAX_EXTRA_KEYS = 256
MAX_INT_DIGITS = 20
"""Integer literals longer than this are refused while parsing (2**63 has 19 digits)."""

_REQUIRED = frozenset({"format", "format_version", "step", "world_size", "checksum", "files", "structure"})
_VERSIONS = ("trainguard_version", "torch_version")
_OPTIONAL = frozenset({"time", "extra", *_VERSIONS})
_ALGORITHM = re.compile(r"[a-z0-9_]+", re.ASCII)
_HEX = re.compile(r"[0-9a-f]+", re.ASCII)
_DIGEST_CHARS = {"xxh3_64": 16, "crc32": 8}
_DTYPE = re.compile(r"[A-Za-z0-9_]{1,64}", re.ASCII)


def _show(value: Any) -> str:
    """A short repr for messages: a damaged field may hold megabytes."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int_field(data: dict[str, Any], key: str, low: int, high: int) -> int:
    value = data[key]
    if not _is_int(value) or not low <= value <= high:
        raise CheckpointError(f"malformed manifest: {key} {_show(value)} is not an integer in [{low}, {high}]")
    return int(value)


def _str_field(data: dict[str, Any], key: str, limit: int) -> str:
    value = data[key]
    if not isinstance(value, str) or len(value) > limit:
        raise CheckpointError(f"malformed manifest: {key} must be a string of at most {limit} characters")
    return value


def _files(raw: Any, algorithm: str) -> dict[str, FileEntry]:
    if not isinstance(raw, dict) or not raw:
        raise CheckpointError("manifest lists no files")
    if len(raw) > MAX_FILES:
        raise CheckpointError(f"malformed manifest: more than {MAX_FILES} files")
    digest_chars = _DIGEST_CHARS.get(algorithm)
    files = {}
    for name, entry in raw.items():
        check_name(name)
        if not isinstance(entry, dict) or set(entry) != {"size", "checksum"}:
            raise CheckpointError(f"malformed manifest: entry of {_show(name)} must be {{size, checksum}}")
        size, digest = entry["size"], entry["checksum"]
        if not _is_int(size) or not 0 <= size <= MAX_FILE_BYTES:
            raise CheckpointError(f"malformed manifest: size {_show(size)} of {_show(name)} is not a byte count")
        if (
            not isinstance(digest, str)
            or not 0 < len(digest) <= MAX_DIGEST_CHARS
            or not _HEX.fullmatch(digest)
            or (digest_chars is not None and len(digest) != digest_chars)
        ):
            raise CheckpointError(
                f"malformed manifest: checksum {_show(digest)} of {_show(name)} is not a {algorithm} digest"
            )
        files[name] = FileEntry(size=size, checksum=digest)
    return files


def _structure(raw: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(raw, dict) or len(raw) > MAX_STRUCTURE_ENTRIES:
        raise CheckpointError(f"malformed manifest: structure must be an object of <= {MAX_STRUCTURE_ENTRIES} keys")
    out: dict[str, dict[str, Any]] = {}
    for key, entry in raw.items():
        if len(key) > MAX_KEY_CHARS:
            raise CheckpointError(f"malformed manifest: structure key longer than {MAX_KEY_CHARS} characters")
        if entry == {"kind": "object"}:
            out[key] = {"kind": "object"}
            continue
        if not isinstance(entry, dict) or set(entry) != {"kind", "shape", "dtype"} or entry["kind"] != "tensor":
            raise CheckpointError(f"malformed manifest: structure entry of {_show(key)} is not a tensor or object")
        shape, dtype = entry["shape"], entry["dtype"]
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_DIMS
            or not all(_is_int(d) and 0 <= d <= MAX_DIM for d in shape)
        ):
            raise CheckpointError(f"malformed manifest: shape of {_show(key)} is not a list of sizes")
        if not isinstance(dtype, str) or not _DTYPE.fullmatch(dtype):
            raise CheckpointError(f"malformed manifest: dtype of {_show(key)} is not a dtype name")
        out[key] = {"kind": "tensor", "shape": list(shape), "dtype": dtype}
    return out


def _parse_int(text: str) -> int:
    # Python refuses to convert integers over 4300 digits with a ValueError of its own; bound far lower.
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer literal of {len(text)} digits")
    return int(text)


def _parse_constant(text: str) -> float:
    raise ValueError(f"{text} is not valid in a manifest")


def parse_manifest_bytes(raw: bytes, label: str) -> Any:
    """JSON from untrusted bytes: bounded integers, no NaN/Infinity, deep nesting refused, one-line errors."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckpointError(f"{label}: manifest is not valid JSON (truncated or corrupt)") from None
    if _nesting_depth(text) > MAX_DEPTH:
        raise CheckpointError(f"{label}: manifest nests deeper than {MAX_DEPTH} levels (corrupt)")
    try:
        return json.loads(text, parse_int=_parse_int, parse_constant=_parse_constant)
    except json.JSONDecodeError:
        raise CheckpointError(f"{label}: manifest is not valid JSON (truncated or corrupt)") from None
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{label}: manifest is not valid JSON ({_show(str(exc))})") from None


MAX_DEPTH = 16
"""A manifest nests 4 levels (structure → key → entry → shape); anything far deeper is damage."""
# A string runs to its closing quote or, if unterminated, to the end: every match succeeds, so the scan
# is linear (a pattern that could fail would be retried from every later quote: quadratic).
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _nesting_depth(text: str) -> int:
    """Deepest bracket nesting outside strings, found without recursion (json.loads would recurse)."""
    # Strings may hold brackets: drop them, then everything that is not a bracket.
    skeleton = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = deepest = 0
    for ch in skeleton:
        if ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_DEPTH:
                    break
        elif ch in "]}":
            depth -= 1
    return deepest


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (creates, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(directory: Path, manifest: Manifest) -> None:
    """Write ``manifest.json`` into ``directory`` durably (tmp file, fsync, rename, fsync dir)."""
    tmp = directory / (MANIFEST_NAME + ".tmp")
    data = (json.dumps(manifest.to_json(), indent=1, sort_keys=True) + "\n").encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # exactly 0640 whatever the umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / MANIFEST_NAME)
    fsync_dir(directory)


def read_manifest(directory: Path) -> Manifest:
    """The manifest of a committed checkpoint; `CheckpointError` when missing, unsafe or malformed.

    ``directory`` must be a real directory and the manifest a regular file in it (no symlink is
    followed, a FIFO or device is refused unopened), read up to `MAX_MANIFEST_BYTES`.
    """
    path = directory / MANIFEST_NAME
    with open_checkpoint_dir(directory) as dir_fd:
        try:
            with open_regular(dir_fd, MANIFEST_NAME, f"{path}:") as (fd, size):
                if size > MAX_MANIFEST_BYTES:
                    raise CheckpointError(f"{path}: manifest of {size} bytes is larger than {MAX_MANIFEST_BYTES}")
                raw = read_capped(fd, MAX_MANIFEST_BYTES, f"{path}: manifest")
        except CheckpointError as exc:
            if str(exc).endswith("is missing"):
                raise CheckpointError(f"{path}: no manifest (checkpoint never committed)") from None
            raise
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot read manifest: {exc.strerror}") from None
    manifest = Manifest.from_json(parse_manifest_bytes(raw, str(path)))
    match = STEP_DIR.match(directory.name)
    if match and int(match.group(1)) != manifest.step:
        raise CheckpointError(f"{path}: manifest says step {manifest.step}, directory says otherwise")
    return manifest


def verify_files(directory: Path, manifest: Manifest, names: Iterable[str], *, checksums: bool = True) -> None:
    """Check that the named files are regular files in ``directory`` (not through a symlink) with the
    manifest's size (and checksum); raise `CheckpointError` on the first bad one."""
    with open_checkpoint_dir(directory) as dir_fd:
        for name in names:
            entry = manifest.files[name]
            with open_regular(dir_fd, name, f"file {name}") as (fd, size):
                if size != entry.size:
                    raise CheckpointError(f"file {name} has {size} bytes, manifest says {entry.size}")
                if not checksums:
                    continue
                try:
                    read, digest = fd_checksum(fd, manifest.checksum_algorithm, entry.size)
                except OSError as exc:
                    raise CheckpointError(f"file {name} cannot be read: {exc.strerror}") from None
                except ValueError as exc:  # algorithm not installed
                    raise CheckpointError(str(exc)) from None
                if read != entry.size:
                    raise CheckpointError(f"file {name} changed size while read ({read} bytes)")
                if digest != entry.checksum:
                    raise CheckpointError(f"file {name} checksum {digest} != manifest {entry.checksum} (corrupt)")


def structure_mismatch(saved: Mapping[str, Mapping[str, Any]], wanted: Mapping[str, Mapping[str, Any]]) -> str:
    """Empty when ``wanted`` (the state to load into) and ``saved`` have the same keys, kinds, shapes, dtypes."""
    missing = sorted(set(wanted) - set(saved))
    if missing:
        return f"checkpoint lacks {len(missing)} entries of the state, e.g. {missing[0]!r}"
    extra = sorted(set(saved) - set(wanted))
    if extra:
        return (
            f"state lacks {len(extra)} entries of the checkpoint, e.g. {extra[0]!r} "
            "(is the optimizer state initialised?)"
        )
    for key, want in wanted.items():
        have = saved[key]
        if have.get("kind") != want.get("kind"):
            return f"{key!r} is a {have.get('kind')} in the checkpoint, a {want.get('kind')} in the state"
        if want.get("kind") == "tensor" and (
            list(have.get("shape", [])) != list(want["shape"]) or have.get("dtype") != want["dtype"]
        ):
            return (
                f"{key!r} is {have.get('dtype')}{list(have.get('shape', []))} in the checkpoint, "
                f"{want['dtype']}{list(want['shape'])} in the state"
            )
    return ""


def committed_steps(directory: Path) -> list[int]:
    """Steps of the ``step-<N>`` entries that look committed, newest first (not verified).

    A real directory counts when it holds a ``manifest.json`` entry; a ``step-<N>`` symlink counts too,
    so that restore rejects it visibly (and moves the link aside) instead of silently skipping it.
    """
    steps = []
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []
    for entry in entries:
        match = STEP_DIR.match(entry.name)
        if not match:
            continue
        if entry.is_symlink() or (
            entry.is_dir(follow_symlinks=False) and os.path.lexists(os.path.join(entry.path, MANIFEST_NAME))
        ):
            steps.append(int(match.group(1)))
    return sorted(steps, reverse=True)


def step_dir(directory: Path, step: int) -> Path:
    return directory / f"step-{step}"


def commit(staging: Path, final: Path) -> None:
    """Atomically publish ``staging`` (manifest already inside) as ``final``; fsync the parent.

    An existing ``final`` (a checkpoint of the same step from an abandoned timeline) is first moved
    aside, then removed once the new one is in place.
    """
    parent = final.parent
    aside = None
    if os.path.lexists(final):
        aside = parent / f".replaced-{final.name}-{os.getpid()}"
        os.rename(final, aside)
    os.rename(staging, final)
    fsync_dir(parent)
    if aside is not None:
        if aside.is_symlink():  # only the link goes, never what it points to
            aside.unlink()
        else:
            shutil.rmtree(aside, ignore_errors=True)


DCP_METADATA = ".metadata"
"""DCP's global metadata file: the one file a checkpoint cannot be loaded without."""


def require_loadable(manifest: Manifest) -> None:
    """`CheckpointError` unless the manifest covers DCP's ``.metadata``.

    DCP opens ``.metadata`` to learn which files hold the data; unverified, it could name anything.
    """
    if DCP_METADATA not in manifest.files:
        raise CheckpointError(f"manifest does not list {DCP_METADATA}")


def latest_step(directory: str | PathLike[str], *, checksums: bool = False) -> int | None:
    """Newest committed checkpoint whose manifest parses and whose files exist with the right sizes."""
    for step in committed_steps(Path(directory)):
        path = step_dir(Path(directory), step)
        try:
            manifest = read_manifest(path)
            require_loadable(manifest)
            verify_files(path, manifest, manifest.files, checksums=checksums)
        except (CheckpointError, OSError) as exc:
            log.info("checkpoint %s skipped: %s", path, exc)
            continue
        return step
    return None
