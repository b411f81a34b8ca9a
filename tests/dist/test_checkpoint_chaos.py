"""Chaos tests: real 2-rank gloo jobs checkpointing with trainguard, faults injected during saves and on disk.

Every case ends with a resumed job whose final loss equals the fault-free run's, bit for bit.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _ckpt_train import launch

from trainguard.checkpoint import latest_step
from trainguard.core.eventlog import read_events
from trainguard.core.events import CheckpointLoaded, CheckpointRejected, CheckpointSaveFinished

STEPS = 8


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    """A fault-free run: its checkpoint directory (steps 2, 4, 6, 8) and its per-step losses."""
    tmp = tmp_path_factory.mktemp("reference")
    codes, results = launch(tmp, tmp / "ckpt", steps=STEPS, tag="ref")
    assert codes == [0, 0], (tmp / "ref-rank0.log").read_text()
    assert results[0]["start"] == 0
    assert results[0]["losses"] == results[1]["losses"]
    return tmp / "ckpt", results[0]["losses"]


def _resume(tmp: Path, ckpt: Path, expected_start: int, reference_losses: dict[str, float]) -> None:
    codes, results = launch(tmp, ckpt, steps=STEPS, tag="resume")
    assert codes == [0, 0], (tmp / "resume-rank0.log").read_text()
    assert [r["start"] for r in results] == [expected_start, expected_start]
    final = str(STEPS)
    assert results[0]["losses"][final] == reference_losses[final]  # exact: deterministic training
    for step in range(expected_start + 1, STEPS + 1):
        assert results[1]["losses"][str(step)] == reference_losses[str(step)]
    loaded = [e for e in read_events(tmp / "resume-events-rank1.jsonl") if isinstance(e, CheckpointLoaded)]
    assert [e.step for e in loaded] == [expected_start]
    assert latest_step(ckpt) == STEPS


def test_fault_free_run_commits_every_interval(reference: tuple[Path, dict[str, float]]) -> None:
    ckpt, _ = reference
    assert sorted(p.name for p in ckpt.iterdir()) == [".trainguard.lock", "step-2", "step-4", "step-6", "step-8"]
    manifest = json.loads((ckpt / "step-8" / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(manifest["files"])
    assert "__rank_local__.1.rng" in manifest["structure"]


@pytest.mark.slow
def test_kill_a_rank_while_it_writes_its_shard(tmp_path: Path, reference: tuple[Path, dict[str, float]]) -> None:
    ckpt = tmp_path / "ckpt"
    codes, _ = launch(tmp_path, ckpt, steps=STEPS, fault="kill-write", fault_step=6, fault_rank=1, tag="fault")
    assert codes[1] == -9
    assert latest_step(ckpt) == 4
    assert not (ckpt / "step-6").exists()
    _resume(tmp_path, ckpt, 4, reference[1])


@pytest.mark.slow
def test_hung_writer_fails_the_save_at_the_group_timeout(
    tmp_path: Path, reference: tuple[Path, dict[str, float]]
) -> None:
    ckpt = tmp_path / "ckpt"
    codes, results = launch(
        tmp_path,
        ckpt,
        steps=STEPS,
        fault="stop-write",
        fault_step=8,
        fault_rank=1,
        tag="fault",
        ckpt_timeout_seconds=3,
    )
    assert codes[0] == 3  # rank 0 reported the failure at close() instead of waiting forever
    assert "checkpoint of step 8 failed" in results[0]["error"] and "Timed out" in results[0]["error"]
    finished = [e for e in read_events(tmp_path / "fault-events-rank0.jsonl") if isinstance(e, CheckpointSaveFinished)]
    assert [(e.step, e.ok) for e in finished] == [(2, True), (4, True), (6, True), (8, False)]
    assert 3 <= finished[-1].total_seconds < 30
    assert latest_step(ckpt) == 6
    _resume(tmp_path, ckpt, 6, reference[1])


@pytest.mark.slow
def test_kill_all_during_the_commit(tmp_path: Path, reference: tuple[Path, dict[str, float]]) -> None:
    ckpt = tmp_path / "ckpt"
    codes, _ = launch(tmp_path, ckpt, steps=STEPS, fault="kill-commit", fault_step=6, tag="fault")
    assert codes[0] == -9 and codes[1] != 0
    staged = [p for p in ckpt.iterdir() if p.name.startswith(".staging-step-6-")]
    assert len(staged) == 1 and (staged[0] / "manifest.json").exists()  # complete but never committed
    assert latest_step(ckpt) == 4
    _resume(tmp_path, ckpt, 4, reference[1])


@pytest.mark.slow
def test_full_disk_during_a_save_surfaces_and_resumes(tmp_path: Path, reference: tuple[Path, dict[str, float]]) -> None:
    ckpt = tmp_path / "ckpt"
    codes, results = launch(tmp_path, ckpt, steps=STEPS, fault="enospc", fault_step=6, fault_rank=1, tag="fault")
    assert codes == [3, 3]  # both ranks got the CheckpointError at the next save, none hung
    for r in results:
        assert "checkpoint of step 6 failed" in r["error"] and "No space left on device" in r["error"]
    for rank in (0, 1):
        records = read_events(tmp_path / f"fault-events-rank{rank}.jsonl")
        finished = [e for e in records if isinstance(e, CheckpointSaveFinished)]
        assert [(e.step, e.ok) for e in finished] == [(2, True), (4, True), (6, False)]
        assert "No space left on device" in finished[-1].error
    assert latest_step(ckpt) == 4 and not list(ckpt.glob(".staging-*"))
    _resume(tmp_path, ckpt, 4, reference[1])


@pytest.mark.slow
def test_corrupt_checkpoints_are_rejected_newest_complete_is_used(
    tmp_path: Path, reference: tuple[Path, dict[str, float]]
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0], ckpt)
    shard = ckpt / "step-8" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit, same size
    shard.write_bytes(bytes(data))
    (ckpt / "step-6" / "__0_0.distcp").unlink()
    manifest = ckpt / "step-4" / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:100])

    _resume(tmp_path, ckpt, 2, reference[1])
    rejected = [e for e in read_events(tmp_path / "resume-events-rank0.jsonl") if isinstance(e, CheckpointRejected)]
    assert [e.step for e in rejected] == [8, 6, 4]
    assert "checksum" in rejected[0].reason
    assert "missing" in rejected[1].reason
    assert "manifest" in rejected[2].reason
    assert len(list(ckpt.glob(".rejected-step-*"))) == 3  # moved aside, not deleted


@pytest.mark.slow
def test_damaged_manifests_and_escaping_paths_fall_back_on_every_rank(
    tmp_path: Path, reference: tuple[Path, dict[str, float]]
) -> None:
    """Each of these used to kill both ranks with a traceback (or hang them) instead of falling back."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[0], ckpt)
    data = json.loads((ckpt / "step-8" / "manifest.json").read_text())
    data["time"] = "yesterday"
    (ckpt / "step-8" / "manifest.json").write_text(json.dumps(data))
    (ckpt / "step-6" / "manifest.json").unlink()
    (ckpt / "step-6" / "manifest.json").symlink_to("/dev/zero")
    data = json.loads((ckpt / "step-4" / "manifest.json").read_text())
    data["files"]["../../../../etc/hostname"] = {"size": 1, "checksum": "0" * 16}
    (ckpt / "step-4" / "manifest.json").write_text(json.dumps(data))

    _resume(tmp_path, ckpt, 2, reference[1])
    rejected = [e for e in read_events(tmp_path / "resume-events-rank0.jsonl") if isinstance(e, CheckpointRejected)]
    assert [e.step for e in rejected] == [8, 6, 4]
    assert "time" in rejected[0].reason and "symlink" in rejected[1].reason and "plain name" in rejected[2].reason
    assert len(list(ckpt.glob(".rejected-step-*"))) == 3


@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real file system with 160 KiB of room (tmpfs), for a disk that really fills up. Needs root."""
    import os
    import subprocess

    mount = tmp_path / "small-disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root (CI runs as root)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_really_full_disk_keeps_the_older_checkpoints_and_resumes(
    tmp_path: Path, small_disk: Path, reference: tuple[Path, dict[str, float]]
) -> None:
    import subprocess

    # Each checkpoint of this job takes about 60 KiB: steps 2 and 4 fit, step 6 hits ENOSPC.
    ckpt = small_disk / "ckpt"
    codes, results = launch(tmp_path, ckpt, steps=STEPS, tag="fault")
    assert codes == [3, 3], (tmp_path / "fault-rank0.log").read_text()
    assert any("No space left on device" in r.get("error", "") for r in results)
    finished = [e for e in read_events(tmp_path / "fault-events-rank0.jsonl") if isinstance(e, CheckpointSaveFinished)]
    assert [(e.step, e.ok) for e in finished] == [(2, True), (4, True), (6, False)]
    assert latest_step(ckpt, checksums=True) == 4 and not list(ckpt.glob(".staging-*"))
    # The operator frees space; the job resumes from step 4 and ends exactly as the fault-free run.
    subprocess.run(["mount", "-o", "remount,size=2m", str(small_disk)], check=True)
    _resume(tmp_path, ckpt, 4, reference[1])
