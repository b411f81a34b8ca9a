"""Checkpoint manifests: what a committed checkpoint contains, how it is verified and committed.

A checkpoint directory ``step-<N>/`` exists for the loader only once ``manifest.json`` is in it; the
manifest is written into the staging directory last and the directory is then renamed into place, so a
crash at any moment leaves either a complete checkpoint or an invisible staging directory.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

from trainguard.checkpoint.checksum import file_checksum
from trainguard.checkpoint.errors import CheckpointError

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
FORMAT = "trainguard-checkpoint"
FORMAT_VERSION = 1
STEP_DIR = re.compile(r"^step-(\d+)$")


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
    world_size: int
    files: dict[str, FileEntry]
    """File name (relative to the checkpoint directory) -> size and checksum."""
    structure: dict[str, dict[str, Any]]
    """Flattened state key -> {"kind": "tensor", "shape": [...], "dtype": "float32"} or {"kind": "object"}."""
    checksum_algorithm: str = "crc32"
    """``xxh3_64`` or ``crc32`` (see `trainguard.checkpoint.checksum`)."""
    time: float = 0.0
    """Unix seconds when the manifest was written."""
    trainguard_version: str = ""
    torch_version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

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
        """Parse and validate; raises `CheckpointError` naming what is wrong."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CheckpointError("not a trainguard checkpoint manifest")
        version = data.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise CheckpointError(f"unsupported manifest format_version {version!r}")
        try:
            files = {
                str(name): FileEntry(size=int(e["size"]), checksum=str(e["checksum"]))
                for name, e in dict(data["files"]).items()
            }
            step, world = int(data["step"]), int(data["world_size"])
            structure = dict(data["structure"])
            algorithm = str(data["checksum"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"malformed manifest ({exc.__class__.__name__}: {exc})") from None
        if not files or step < 0 or world < 1:
            raise CheckpointError("manifest lists no files or has an invalid step/world size")
        return cls(
            step=step,
            world_size=world,
            files=files,
            structure=structure,
            checksum_algorithm=algorithm,
            time=float(data.get("time", 0.0)),
            trainguard_version=str(data.get("trainguard_version", "")),
            torch_version=str(data.get("torch_version", "")),
            extra=dict(data.get("extra") or {}),
        )


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
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, directory / MANIFEST_NAME)
    fsync_dir(directory)


def read_manifest(directory: Path) -> Manifest:
    """The manifest of a committed checkpoint; `CheckpointError` when missing or malformed."""
    path = directory / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no manifest (checkpoint never committed)") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read manifest: {exc.strerror}") from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{path}: manifest is not valid JSON (truncated or corrupt)") from None
    manifest = Manifest.from_json(data)
    match = STEP_DIR.match(directory.name)
    if match and int(match.group(1)) != manifest.step:
        raise CheckpointError(f"{path}: manifest says step {manifest.step}, directory says otherwise")
    return manifest


def verify_files(directory: Path, manifest: Manifest, names: Iterable[str], *, checksums: bool = True) -> None:
    """Check that the named files exist with the manifest's size (and checksum); raise on the first bad one."""
    for name in names:
        entry = manifest.files[name]
        path = directory / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"file {name} is missing") from None
        if size != entry.size:
            raise CheckpointError(f"file {name} has {size} bytes, manifest says {entry.size}")
        if checksums:
            try:
                _, digest = file_checksum(path, manifest.checksum_algorithm)
            except OSError as exc:
                raise CheckpointError(f"file {name} cannot be read: {exc.strerror}") from None
            except ValueError as exc:  # algorithm not installed
                raise CheckpointError(str(exc)) from None
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
    """Steps of the ``step-<N>`` directories that hold a manifest file, newest first (not verified)."""
    steps = []
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for entry in entries:
        match = STEP_DIR.match(entry.name)
        if match and entry.is_dir() and os.path.exists(os.path.join(entry.path, MANIFEST_NAME)):
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
    if final.exists():
        aside = parent / f".replaced-{final.name}-{os.getpid()}"
        os.rename(final, aside)
    os.rename(staging, final)
    fsync_dir(parent)
    if aside is not None:
        import shutil

        shutil.rmtree(aside, ignore_errors=True)


def latest_step(directory: str | PathLike[str], *, checksums: bool = False) -> int | None:
    """Newest committed checkpoint whose manifest parses and whose files exist with the right sizes."""
    for step in committed_steps(Path(directory)):
        path = step_dir(Path(directory), step)
        try:
            manifest = read_manifest(path)
            verify_files(path, manifest, manifest.files, checksums=checksums)
        except CheckpointError as exc:
            log.info("checkpoint %s skipped: %s", path, exc)
            continue
        return step
    return None
