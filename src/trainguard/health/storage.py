"""Storage round trip: a timed write, fsync and read back under the run, checkpoint and data directories.

For each directory (the nearest existing parent when it does not exist yet: nothing is created but the probe
file, which is removed), ``storage_probe_bytes`` of random data are written to a temporary file, fsynced, the
file's cached pages dropped (``posix_fadvise(DONTNEED)``, so the read goes to the storage where the kernel allows
it), read back and compared. The whole probe of one directory is bounded by ``timeout_seconds``.

* ``storage_roundtrip`` (high): a probe fails, reads back other bytes, or does not finish within ``timeout_seconds``;
* ``storage_latency`` (low): a probe took longer than ``max_storage_latency_seconds`` (a slow shared file system).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from trainguard.health.base import HIGH, LOW, CheckResult, HealthConfig, failed, passed, skipped


@dataclass(frozen=True)
class Probe:
    """One directory's round trip."""

    directory: Path
    ok: bool
    seconds: float
    """Write + fsync + read back."""
    detail: str = ""


def _existing(path: Path) -> Path:
    p = path
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def _roundtrip(directory: Path, size: int) -> tuple[float, str | None]:
    data = os.urandom(size)
    start = time.monotonic()
    fd, name = tempfile.mkstemp(dir=directory, prefix=".trainguard-storage-")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        with contextlib.suppress(AttributeError, OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while (chunk := os.read(fd, 1 << 20)):
            chunks.append(chunk)
        seconds = time.monotonic() - start
        if b"".join(chunks) != data:
            return seconds, "read back different bytes than were written"
        return seconds, None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name)


def probe(directory: Path, size: int, timeout: float) -> Probe:
    """Round-trip ``size`` bytes under ``directory``, at most ``timeout`` seconds (a hung mount is a failure)."""
    outcome: list[tuple[float, str | None]] = []

    def run() -> None:
        try:
            outcome.append(_roundtrip(directory, size))
        except OSError as exc:
            outcome.append((0.0, exc.strerror or str(exc)))

    t = threading.Thread(target=run, name="health-storage-probe", daemon=True)
    start = time.monotonic()
    t.start()
    t.join(timeout)
    if t.is_alive():
        return Probe(directory, False, time.monotonic() - start,
                     f"no answer within {timeout:g} s (hung file system?)")
    if not outcome:
        return Probe(directory, False, 0.0, "probe ended without a result")
    seconds, error = outcome[0]
    return Probe(directory, error is None, seconds, error or "")


def check_storage(config: HealthConfig) -> list[CheckResult]:
    """The run, checkpoint and data directories answer a write, fsync and read back, and fast enough."""
    wanted = [p for p in (config.run_dir, config.checkpoint_dir, *config.data_dirs) if p is not None]
    if not wanted:
        why = "no run, checkpoint or data directory given"
        return [skipped("storage_roundtrip", HIGH, why), skipped("storage_latency", LOW, why)]
    seen: dict[Path, Path] = {}
    for p in wanted:
        seen.setdefault(_existing(Path(p)), Path(p))
    probes = []
    for target, asked in seen.items():
        if not target.is_dir():
            probes.append(Probe(asked, False, 0.0, "not a directory"))
            continue
        probes.append(probe(target, config.storage_probe_bytes, config.timeout_seconds))
    kib = config.storage_probe_bytes // 1024
    broken = [f"{p.directory}: {p.detail}" for p in probes if not p.ok]
    timings = ", ".join(f"{p.directory} {p.seconds * 1000:.0f} ms" for p in probes if p.ok)
    slow = [f"{p.directory}: {p.seconds:.2f} s" for p in probes
            if p.ok and p.seconds > config.max_storage_latency_seconds]
    out = [failed("storage_roundtrip", HIGH, "; ".join(broken)) if broken
           else passed("storage_roundtrip", HIGH, f"{kib} KiB written, synced, read back: {timings}")]
    if slow:
        out.append(failed("storage_latency", LOW, f"slower than {config.max_storage_latency_seconds:g} s: "
                                                  + "; ".join(slow)))
    elif broken and not timings:
        out.append(skipped("storage_latency", LOW, "no directory answered"))
    else:
        out.append(passed("storage_latency", LOW, f"within {config.max_storage_latency_seconds:g} s"))
    return out
