"""Damaged or hostile checkpoint directories: restore falls back and never raises, hangs or leaves the directory.

Each case is one that used to crash (a traceback on every rank), hang (a read of /dev/zero or a FIFO)
or read outside the checkpoint (``..`` entries, a symlinked ``step-N``) before the manifest schema and
the confinement of paths (docs/checkpoint.md, "Restore and fallback").
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from trainguard.checkpoint import CheckpointConfig, Checkpointer, latest_step
from trainguard.checkpoint.checksum import file_checksum
from trainguard.core.eventlog import EventWriter, read_events
from trainguard.core.events import CheckpointRejected

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _value(step: int) -> torch.Tensor:
    return torch.arange(6.0) + 100 * step


def _save(directory: Path, *steps: int) -> None:
    with Checkpointer(directory, CheckpointConfig(async_save=False, keep_last=10)) as ckpt:
        for step in steps:
            ckpt.save(step, {"x": _value(step), "note": f"step {step}"})


def _restore(directory: Path, events: Path | None = None) -> tuple[int | None, dict[str, Any]]:
    state: dict[str, Any] = {"x": torch.zeros(6), "note": ""}
    writer = EventWriter(events) if events is not None else None
    ckpt = Checkpointer(directory, events=writer)
    try:
        return ckpt.restore(state), state
    finally:
        ckpt.close()


def _manifest(directory: Path, step: int) -> Path:
    return directory / f"step-{step}" / "manifest.json"


def _edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _raw(path: Path, placeholder: str, raw: str) -> None:
    """Put text that ``json.dumps`` cannot produce (1e400, a 5000-digit integer) where ``placeholder`` is."""
    path.write_text(path.read_text().replace(json.dumps(placeholder), raw))


def _first_file(data: dict[str, Any]) -> dict[str, Any]:
    return data["files"][sorted(data["files"])[0]]


DAMAGE: dict[str, Callable[[Path], None]] = {
    "time is a word": lambda p: _edit(p, lambda d: d.update(time="yesterday")),
    "extra is a number": lambda p: _edit(p, lambda d: d.update(extra=5)),
    "size 1e400": lambda p: (_edit(p, lambda d: _first_file(d).update(size="@@")), _raw(p, "@@", "1e400")),
    "size of 5000 digits": lambda p: (_edit(p, lambda d: _first_file(d).update(size="@@")), _raw(p, "@@", "9" * 5000)),
    "step of 5000 digits": lambda p: (_edit(p, lambda d: d.update(step="@@")), _raw(p, "@@", "7" * 5000)),
    "100k-deep JSON": lambda p: (
        _edit(p, lambda d: d.update(extra={"a": "@@"})),
        _raw(p, "@@", "[" * 100_000 + "]" * 100_000),
    ),
    "negative size": lambda p: _edit(p, lambda d: _first_file(d).update(size=-1)),
    "size true": lambda p: _edit(p, lambda d: _first_file(d).update(size=True)),
    "NaN time": lambda p: (_edit(p, lambda d: d.update(time="@@")), _raw(p, "@@", "NaN")),
    "files is a list": lambda p: _edit(p, lambda d: d.update(files=[1, 2])),
    "structure entry is a string": lambda p: _edit(p, lambda d: d["structure"].update(x="tensor")),
    "shape holds a string": lambda p: _edit(p, lambda d: d["structure"]["x"].update(shape=["6"])),
    "checksum not hex": lambda p: _edit(p, lambda d: _first_file(d).update(checksum="zz" * 8)),
    "unknown field": lambda p: _edit(p, lambda d: d.update(owner="someone")),
    "entry ../../etc/hostname": lambda p: _edit(
        p, lambda d: d["files"].update({"../../etc/hostname": {"size": 1, "checksum": "0" * 16}})
    ),
    "entry ../../../../dev/zero": lambda p: _edit(
        p, lambda d: d["files"].update({"../../../../dev/zero": {"size": 1 << 40, "checksum": "0" * 16}})
    ),
    "absolute entry": lambda p: _edit(p, lambda d: d["files"].update({"/dev/zero": {"size": 1, "checksum": "0" * 16}})),
    "no .metadata listed": lambda p: _edit(p, lambda d: d["files"].pop(".metadata")),
    "manifest symlinked to /dev/zero": lambda p: (p.unlink(), p.symlink_to("/dev/zero")),
    "manifest is a FIFO": lambda p: (p.unlink(), os.mkfifo(p)),
    "manifest is a directory": lambda p: (p.unlink(), p.mkdir()),
    "manifest of 65 MiB": lambda p: p.write_bytes(p.read_bytes()[:-2] + b" " * (65 << 20) + b"}\n"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_manifest_falls_back_to_the_older_checkpoint(tmp_path: Path, damage: str) -> None:
    ckpt = tmp_path / "ckpt"
    _save(ckpt, 1, 2)
    DAMAGE[damage](_manifest(ckpt, 2))
    assert latest_step(ckpt) == 1  # the no-process-group check survives it too

    step, state = _restore(ckpt, tmp_path / "events.jsonl")

    assert step == 1 and torch.equal(state["x"], _value(1)) and state["note"] == "step 1"
    rejected = [e for e in read_events(tmp_path / "events.jsonl") if isinstance(e, CheckpointRejected)]
    assert [e.step for e in rejected] == [2]
    assert "\n" not in rejected[0].reason and len(rejected[0].reason) < 400  # one line, bounded
    assert not (ckpt / "step-2").exists() and len(list(ckpt.glob(".rejected-step-2-*"))) == 1  # aside, kept


def test_entry_pointing_outside_is_never_read(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _save(ckpt, 1, 2)
    outside = tmp_path / "secret"
    outside.write_bytes(b"not a shard")
    size, digest = file_checksum(outside, "xxh3_64")
    # A valid-looking entry (right size and checksum) for a file outside: confinement alone refuses it.
    _edit(_manifest(ckpt, 2), lambda d: d["files"].update({"../../secret": {"size": size, "checksum": digest}}))
    os.chmod(outside, 0)  # reading it would now fail with EACCES... unless running as root
    step, state = _restore(ckpt, tmp_path / "events.jsonl")
    assert step == 1 and torch.equal(state["x"], _value(1))
    (reason,) = [e.reason for e in read_events(tmp_path / "events.jsonl") if isinstance(e, CheckpointRejected)]
    assert "not a plain name" in reason


def test_step_directory_symlinked_outside_is_rejected_not_restored(tmp_path: Path) -> None:
    ckpt, elsewhere = tmp_path / "ckpt", tmp_path / "elsewhere"
    _save(ckpt, 1, 2)
    _save(elsewhere, 3)  # a complete, valid checkpoint, but not in this directory
    (ckpt / "step-3").symlink_to(elsewhere / "step-3", target_is_directory=True)
    assert latest_step(ckpt) == 2

    step, state = _restore(ckpt, tmp_path / "events.jsonl")

    assert step == 2 and torch.equal(state["x"], _value(2))
    (rejected,) = [e for e in read_events(tmp_path / "events.jsonl") if isinstance(e, CheckpointRejected)]
    assert rejected.step == 3 and "not a real directory" in rejected.reason
    assert (elsewhere / "step-3" / "manifest.json").exists()  # the link moved aside, its target untouched
    assert not os.path.lexists(ckpt / "step-3")


@pytest.mark.parametrize("kind", ["symlink to a copy", "fifo", "symlink to /dev/zero"])
def test_shard_that_is_not_a_regular_file_is_rejected(tmp_path: Path, kind: str) -> None:
    ckpt = tmp_path / "ckpt"
    _save(ckpt, 1, 2)
    shard = ckpt / "step-2" / "__0_0.distcp"
    copy = tmp_path / "copy.distcp"
    copy.write_bytes(shard.read_bytes())
    shard.unlink()
    if kind == "fifo":
        os.mkfifo(shard)
    else:
        shard.symlink_to(copy if kind == "symlink to a copy" else Path("/dev/zero"))
    step, state = _restore(ckpt)
    assert step == 1 and torch.equal(state["x"], _value(1))


def test_step_names_that_are_not_plain_numbers_are_ignored(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _save(ckpt, 1)
    (ckpt / "step-002").mkdir()
    (ckpt / "step-002" / "manifest.json").write_text("{}")
    (ckpt / ("step-" + "9" * 5000)[:250]).mkdir()
    (ckpt / "step-٣").mkdir()  # a non-ASCII digit
    step, state = _restore(ckpt)
    assert step == 1 and torch.equal(state["x"], _value(1))


def test_everything_corrupt_returns_none_without_raising(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _save(ckpt, 1, 2)
    DAMAGE["100k-deep JSON"](_manifest(ckpt, 2))
    DAMAGE["manifest symlinked to /dev/zero"](_manifest(ckpt, 1))
    step, state = _restore(ckpt)
    assert step is None and torch.equal(state["x"], torch.zeros(6))
    assert sorted(p.name.rsplit("-", 1)[0] for p in ckpt.glob(".rejected-*")) == [
        ".rejected-step-1",
        ".rejected-step-2",
    ]


def test_created_directories_and_files_ignore_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        ckpt = tmp_path / "runs" / "ckpt"
        _save(ckpt, 4)
    finally:
        os.umask(old)

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.lstat().st_mode)

    assert mode(tmp_path / "runs") == 0o750 and mode(ckpt) == 0o750 and mode(ckpt / "step-4") == 0o750
    files = [*(ckpt / "step-4").iterdir(), ckpt / ".trainguard.lock"]
    assert {p.name: mode(p) for p in files} == {p.name: 0o640 for p in files}
