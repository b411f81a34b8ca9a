"""Worker output in bounded memory: the console tail and the size cap of the rank logs.

Workers write their stdout and stderr straight into their log files (torch redirects them). One thread of the
agent, `LogPump`, follows those files for the whole of a (whole-process) attempt:

* **console**: the streams that reach the console are read in chunks of `CHUNK_BYTES` from where the last
  read stopped and cut into lines by `ConsoleLines`, which holds at most `MAX_LINE_BYTES` of a line: a longer
  line is shown in pieces of that size, each with the rank prefix. A ``\\r`` ends a progress-bar state
  instead of a line: of the states written since the last pass only the latest is shown (at most one per
  stream every `POLL_SECONDS`); the file keeps every byte. torch's own tailer read each line whole
  (``readline``): one 200 MB line without a newline took the agent to 1 GB.
* **cap**: a log file that reaches ``max_bytes`` has its front moved to ``<file>.1`` (replacing the previous
  one; `trainguard.launch.log_rotation`), so a stream keeps its newest part and one rotated file: at most
  about twice the cap. The writers keep their file descriptors, so cutting the front is only safe when they
  write with ``O_APPEND`` (otherwise the next write lands at the old offset and leaves a hole the size of the
  cap): the pump sets ``O_APPEND`` on the agent's own descriptors of the files, which share their open file
  description (and so their flags) with the workers' stdout and stderr.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from trainguard.launch.lifetime import descendants
from trainguard.launch.log_rotation import ROTATED_SUFFIX, rotate

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
"""One read of a log file."""
MAX_LINE_BYTES = 16 * 1024
"""The longest piece of a line shown on the console at once."""
READ_BUDGET_BYTES = 4 * 1024 * 1024
"""At most this much of one file per pass, so one flooding rank cannot starve the others' lines."""
POLL_SECONDS = 0.1
"""A pass over every file when the last one found nothing new."""
_SEPARATORS = re.compile(rb"[\r\n]")


def _utf8_cut(data: bytes | bytearray, limit: int) -> int:
    """Where to cut ``data`` (longer than ``limit``) at most ``limit`` bytes in without splitting a UTF-8
    sequence: before the character ``data[limit]`` continues, unless that is not UTF-8 at all."""
    cut = limit
    while cut > limit - 3 and cut > 1 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if (data[cut] & 0xC0) != 0x80 else limit


class ConsoleLines:
    """One stream's bytes in, console lines out, holding at most `MAX_LINE_BYTES` of a line."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self.max_line = max_line
        self._buf = bytearray()
        self._bar: bytes | None = None
        """The latest ``\\r``-ended state not shown yet."""
        self._cr = False
        """The last chunk ended with ``\\r``: a ``\\n`` first in the next one makes it a line end."""

    def _add(self, data: bytes, out: list[bytes]) -> None:
        self._buf += data
        while len(self._buf) >= self.max_line + 1:
            cut = _utf8_cut(self._buf, self.max_line)
            out.append(bytes(self._buf[:cut]))
            del self._buf[:cut]

    def _end_line(self, out: list[bytes]) -> None:
        out.append(bytes(self._buf))
        self._buf.clear()
        self._bar = None

    def _end_bar(self) -> None:
        self._bar = bytes(self._buf)
        self._buf.clear()

    def feed(self, data: bytes) -> list[bytes]:
        """The complete lines (and pieces of over-long ones) ``data`` finishes."""
        out: list[bytes] = []
        pos = 0
        if self._cr and data:
            self._cr = False
            if data[:1] == b"\n":
                self._end_line(out)
                pos = 1
            else:
                self._end_bar()
        for m in _SEPARATORS.finditer(data, pos):
            self._add(data[pos:m.start()], out)
            pos = m.end()
            if m.group() == b"\n":
                self._end_line(out)
            elif pos == len(data):
                self._cr = True  # "\r\n" split across two reads, or a bar state: the next read says
            elif data[pos:pos + 1] != b"\n":
                self._end_bar()
        self._add(data[pos:], out)
        return out

    def pending_bar(self) -> list[bytes]:
        """The latest complete progress-bar state since the last call, once (a state ended by a ``\r`` that
        ends the data read so far waits for the next read: it may be half of a ``\r\n``)."""
        bar, self._bar = self._bar, None
        return [bar] if bar else []

    def close(self) -> list[bytes]:
        """What is left at the end of the stream: the last bar state, then a last line without a newline."""
        if self._cr:
            self._cr = False
            self._end_bar()
        out = self.pending_bar()
        if self._buf:
            out.append(bytes(self._buf))
            self._buf.clear()
        return out


@dataclass
class PumpedFile:
    """One log file the pump follows."""

    path: Path
    console: TextIO | None = None
    """Where its lines go (None: the file only, no console)."""
    prefix: str = ""
    lines: ConsoleLines = field(default_factory=ConsoleLines)
    offset: int = 0
    """How far the console has read."""
    appending: bool = False
    """The agent's descriptors of it have O_APPEND: it may be truncated."""
    warned: bool = False


def set_append(paths: Iterable[Path]) -> set[Path]:
    """Turn on ``O_APPEND`` on this process's open descriptors of ``paths`` (each shares its open file
    description with a worker's stdout or stderr). Returns the paths that now have it."""
    want = {str(p): p for p in paths}
    done: set[Path] = set()
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return done
    for name in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
            if target in want:
                fd = int(name)
                flags = fcntl.fcntl(fd, fcntl.F_GETFL)
                if flags & os.O_ACCMODE != os.O_RDONLY:
                    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_APPEND)
                    done.add(want[target])
        except (OSError, ValueError):
            continue
    return done


def writers_append(path: Path) -> bool:
    """Whether the processes below this one that write ``path`` all opened it with ``O_APPEND`` (a rank that
    opened its own log: forked by the fork server, or a warm spare); False when none is found. Read from
    ``/proc/<pid>/fdinfo``, once per file that reaches the cap."""
    target, found = str(path), False
    for pid in descendants(os.getpid()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{name}") != target:
                    continue
                with open(f"/proc/{pid}/fdinfo/{name}") as info:
                    flags = int(next(x for x in info if x.startswith("flags:")).split()[1], 8)
            except (OSError, StopIteration, ValueError, IndexError):
                continue
            if flags & os.O_ACCMODE == os.O_RDONLY:
                continue
            if not flags & os.O_APPEND:
                return False
            found = True
    return found


class LogPump:
    """Follows one attempt's log files: console lines in bounded memory, and the size cap."""

    def __init__(self, files: list[PumpedFile], max_bytes: int, poll_seconds: float = POLL_SECONDS) -> None:
        self.files = files
        self.max_bytes = max_bytes
        """Cap of each file (0: none)."""
        self.poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainguard-log-pump", daemon=True)
        self.rotations = 0

    def start(self) -> LogPump:
        if any(f.console is not None for f in self.files) or self.max_bytes > 0:
            self._thread.start()
        return self

    # --- one pass ---------------------------------------------------------------------------------

    def _write(self, f: PumpedFile, lines: list[bytes]) -> None:
        if not lines or f.console is None:
            return
        text = "".join(f"{f.prefix}{line.decode('utf-8', 'replace')}\n" for line in lines)
        with contextlib.suppress(OSError, ValueError):  # a closed console must not stop the pump
            f.console.write(text)
            f.console.flush()

    def _read(self, f: PumpedFile, size: int, budget: int) -> int:
        """Console lines from ``f.offset`` up to ``size``, at most ``budget`` bytes; returns the bytes read."""
        if f.offset > size:  # truncated by someone else: start over
            f.offset = 0
        done = 0
        try:
            fd = os.open(f.path, os.O_RDONLY)
        except OSError:
            return 0
        try:
            while f.offset < size and done < budget:
                data = os.pread(fd, min(CHUNK_BYTES, size - f.offset), f.offset)
                if not data:
                    break
                f.offset += len(data)
                done += len(data)
                self._write(f, f.lines.feed(data))
        finally:
            os.close(fd)
        return done

    def _cap(self, f: PumpedFile, size: int) -> None:
        if self.max_bytes <= 0 or size < self.max_bytes:
            return
        if not f.appending:
            f.appending = f.path in set_append([f.path]) or writers_append(f.path)
        if not f.appending:
            if not f.warned:
                f.warned = True
                log.warning("%s passed --max-log-mb but its writer does not append: it cannot be capped", f.path)
            return
        if f.console is not None and f.offset < size and size < 2 * self.max_bytes:
            return  # the console catches up first
        try:
            removed = rotate(f.path, keep=self.max_bytes)
        except OSError as exc:
            log.warning("could not rotate %s: %s", f.path, exc)
            return
        if f.console is not None and f.offset < removed:
            self._write(f, [*f.lines.close(), f"[... {removed - f.offset} bytes not shown: see {f.path.name}"
                            f"{ROTATED_SUFFIX}]".encode()])
        f.offset = max(0, f.offset - removed)
        self.rotations += 1

    def pass_once(self, budget: int = READ_BUDGET_BYTES) -> int:
        """Read and cap every file once; returns the bytes read for the console."""
        done = 0
        for f in self.files:
            try:
                size = os.stat(f.path).st_size
            except OSError:
                continue
            if f.console is not None:
                done += self._read(f, size, budget)
                self._write(f, f.lines.pending_bar())
            self._cap(f, size)
        return done

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                busy = self.pass_once() > 0
            except Exception as exc:  # the pump must never break the run
                log.debug("log pump: %s", exc)
                busy = False
            if not busy:
                self._stop.wait(self.poll_seconds)

    def stop(self) -> None:
        """The attempt's workers are gone: show what is left of their output, then end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with contextlib.suppress(Exception):
            while self.pass_once(budget=1 << 62):
                pass
        for f in self.files:
            self._write(f, f.lines.close())
