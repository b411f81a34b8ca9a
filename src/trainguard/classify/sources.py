"""Reading classification inputs: plain or gzipped logs, torchelastic JSON error files, directories.

Every problem a user can cause (missing, unreadable, binary or too large file) is an `InputError`
with a one-line message.
"""

from __future__ import annotations

import fcntl
import gzip
import io
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from trainguard.classify.scan import Accumulator, Readable, Scanner
from trainguard.classify.structured import as_structured, is_table_header, markdown_records
from trainguard.errors import InputError

log = logging.getLogger(__name__)

SNIFF_BYTES = 8192
JSON_MAX_BYTES = 16 << 20
DEFAULT_MAX_BYTES = 16 << 30
"""Files larger than this are refused unless the caller raises the limit (0 = no limit)."""
_GZIP_MAGIC = b"\x1f\x8b"


def _human(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def open_regular(path: Path) -> BinaryIO:
    """Open ``path`` for reading, refusing anything but a regular file.

    The open itself must not block: a FIFO opened for reading waits for a writer forever, and the file
    may have been swapped for one since it was last looked at, so the type is checked on the open
    descriptor (opened non-blocking), not on the name."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except PermissionError:
        raise InputError(f"{path}: cannot read the file (permission denied)") from None
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise InputError(f"{path}: is a directory")
        if not stat.S_ISREG(mode):
            raise InputError(f"{path}: not a regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _sniff(path: Path) -> bytes:
    with open_regular(path) as f:
        try:
            return f.read(SNIFF_BYTES)
        except OSError as exc:
            raise InputError(f"{path}: cannot read the file ({exc.strerror or exc})") from None


def _looks_binary(head: bytes) -> bool:
    if not head:
        return False
    if b"\x00" in head:
        return True
    text_bytes = sum(1 for b in head if b >= 0x20 or b in (9, 10, 12, 13, 27))
    return text_bytes / len(head) < 0.9


def check_file(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """Raise `InputError` unless ``path`` is a readable text (or gzipped) log; returns its head."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory")
    if not path.is_file():
        raise InputError(f"{path}: not a regular file")
    size = path.stat().st_size
    if max_bytes and size > max_bytes:
        raise InputError(
            f"{path}: file is {_human(size)}, over the {_human(max_bytes)} limit "
            "(raise it with --max-bytes, 0 = no limit)")
    head = _sniff(path)
    if head.startswith(_GZIP_MAGIC):
        try:
            with open_regular(path) as f, gzip.GzipFile(fileobj=f, mode="rb") as g:
                head = g.read(SNIFF_BYTES)
        except (OSError, EOFError) as exc:
            raise InputError(f"{path}: corrupt gzip file ({exc})") from None
    if _looks_binary(head):
        raise InputError(f"{path}: binary file, not a text log (classify reads text or .gz logs)")
    return head


def _structured(path: Path, head: bytes) -> str | None:
    """The text to scan of a JSON document (a torchelastic error.json, a telemetry export), a CSV table or text with
    markdown tables (pasted diagnostics), or None for a log (read as lines). Decided by the content, so a document
    named ``.log`` or ``.txt`` is read as data."""
    first = head.lstrip()[:1]
    sniffed = head.decode("utf-8", "replace")
    table = (path.suffix in (".csv", ".tsv") or is_table_header(sniffed.split("\n", 1)[0])
             or ("|" in sniffed and markdown_records(sniffed) is not None))
    if path.stat().st_size > JSON_MAX_BYTES or not (first in (b"{", b"[") or table):
        return None
    try:
        with open_regular(path) as f:
            data = f.read(JSON_MAX_BYTES + 1)
        return as_structured(data.decode("utf-8"))
    except (UnicodeDecodeError, OSError):
        return None


def scan_file(scanner: Scanner, path: Path, acc: Accumulator, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Scan one file (raises `InputError` if it is not a readable text log)."""
    head = check_file(path, max_bytes)
    label = str(path)
    acc.files += 1
    text = _structured(path, head)
    if text is not None:
        scanner.scan_stream(io.BytesIO(text.encode()), label, acc)
        return
    try:
        with open_regular(path) as f:
            if f.read(2) == _GZIP_MAGIC:
                f.seek(0)
                with gzip.GzipFile(fileobj=f, mode="rb") as g:
                    scanner.scan_stream(g, label, acc)
            else:
                f.seek(0)
                scanner.scan_stream(f, label, acc)
    except (OSError, EOFError) as exc:
        raise InputError(f"{path}: read failed ({exc})") from None


class _Prefixed:
    """A stream that yields ``head`` and then the rest of ``rest``."""

    def __init__(self, head: bytes, rest: Readable) -> None:
        self._head, self._rest = head, rest

    def read(self, size: int = -1, /) -> bytes:
        if self._head:
            out, self._head = self._head, b""
            return out
        return self._rest.read(size)


def scan_stream_checked(scanner: Scanner, stream: Readable, label: str, acc: Accumulator) -> None:
    """Scan a stream that cannot be sniffed in advance (standard input): refuse it if it looks binary."""
    head = stream.read(SNIFF_BYTES)
    if head.startswith(_GZIP_MAGIC):
        raise InputError(f"{label}: gzip data on standard input; pass the file name, or use zcat")
    if _looks_binary(head):
        raise InputError(f"{label}: binary data, not a text log")
    acc.files += 1
    scanner.scan_stream(_Prefixed(head, stream), label, acc)


def iter_dir(root: Path) -> Iterator[Path]:
    """Regular files under ``root``, sorted, hidden files left out."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith("."):
                yield Path(dirpath) / name


def scan_dir(scanner: Scanner, root: Path, acc: Accumulator, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Scan every text file under ``root``; files that cannot be read are listed in ``acc.skipped``,
    and so are links to files outside ``root`` (a link the user did not name is not followed out)."""
    top = root.resolve()
    for path in iter_dir(root):
        if path.is_symlink():
            try:
                path.resolve(strict=True).relative_to(top)
            except (OSError, RuntimeError, ValueError):
                acc.skipped.append(f"{path}: symbolic link to outside the directory, not followed")
                continue
        try:
            scan_file(scanner, path, acc, max_bytes)
        except InputError as exc:
            log.info("skipped %s", exc)
            acc.skipped.append(str(exc))
    if acc.files == 0:
        raise InputError(f"{root}: no readable text logs in the directory")
