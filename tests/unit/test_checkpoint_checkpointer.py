"""Checkpointer in one process (no process group): commit, verified restore, fallback, errors, events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainguard.checkpoint import (
    CheckpointConfig,
    Checkpointer,
    CheckpointError,
    DiskQuota,
    IntervalPolicy,
    latest_step,
    read_manifest,
)
from trainguard.core.eventlog import EventWriter, read_events
from trainguard.core.events import (
    CheckpointLoaded,
    CheckpointPolicyChanged,
    CheckpointRejected,
    CheckpointSaveFinished,
    CheckpointSaveStarted,
)


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()  # optimizer state exists (exp_avg, exp_avg_sq, step)
    return model, opt


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> dict:
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "step": step,
        "rank_local": {"rng": torch.get_rng_state(), "position": step * 10},
    }


@pytest.mark.parametrize("async_save", [True, False])
def test_round_trip_restores_everything_in_place(tmp_path: Path, async_save: bool) -> None:
    model, opt = _model()
    events = EventWriter(tmp_path / "events.jsonl")
    ckpt = Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=async_save), events=events, attempt=2)
    rng = torch.get_rng_state()
    ckpt.save(7, _state(model, opt, 7))
    ckpt.close()

    model2, opt2 = _model()
    with torch.no_grad():
        model2.weight.zero_()
    state = {
        "model": model2.state_dict(),
        "optim": opt2.state_dict(),
        "step": 0,
        "rank_local": {"rng": torch.zeros_like(rng), "position": 0},
    }
    restorer = Checkpointer(tmp_path / "ckpt", events=events)
    assert restorer.restore(state) == 7
    opt2.load_state_dict(state["optim"])
    assert torch.equal(model2.weight, model.weight)
    assert state["step"] == 7 and state["rank_local"]["position"] == 70
    assert torch.equal(state["rank_local"]["rng"], rng)
    for a, b in zip(opt.state.values(), opt2.state.values(), strict=True):
        assert torch.equal(a["exp_avg"], b["exp_avg"])
    assert list(opt2.state_dict()["state"]) == [0, 1]  # integer keys kept, no str duplicates

    records = read_events(tmp_path / "events.jsonl")
    types = [type(r) for r in records]
    assert types == [
        CheckpointPolicyChanged,
        CheckpointSaveStarted,
        CheckpointSaveFinished,
        CheckpointPolicyChanged,
        CheckpointLoaded,
    ]
    finished = records[2]
    assert isinstance(finished, CheckpointSaveFinished)
    assert finished.ok and finished.step == 7 and finished.attempt == 2 and finished.bytes > 0
    assert 0 <= finished.blocking_seconds <= finished.total_seconds
    manifest = read_manifest(tmp_path / "ckpt" / "step-7")
    assert manifest.world_size == 1 and manifest.torch_version == torch.__version__
    assert manifest.structure["model.weight"] == {"kind": "tensor", "shape": [3, 4], "dtype": "float32"}
    assert sum(f.size for f in manifest.files.values()) == finished.bytes


def test_full_disk_in_the_background_raises_at_the_next_call_and_keeps_older(tmp_path: Path) -> None:
    model, opt = _model()
    quota = DiskQuota()
    events = EventWriter(tmp_path / "events.jsonl")
    ckpt = Checkpointer(tmp_path / "ckpt", CheckpointConfig(keep_last=1), events=events, hooks=quota)
    ckpt.save(1, _state(model, opt, 1))
    ckpt.wait()
    quota.remaining = 64
    ckpt.save(2, _state(model, opt, 2))  # returns: the failure happens in the background
    with pytest.raises(CheckpointError, match=r"checkpoint of step 2 failed.*No space left on device"):
        ckpt.save(3, _state(model, opt, 3))
    failed = [r for r in read_events(tmp_path / "events.jsonl") if isinstance(r, CheckpointSaveFinished)][-1]
    assert not failed.ok and "No space left" in failed.error
    assert latest_step(tmp_path / "ckpt") == 1  # keep_last=1 yet the valid older one survives
    assert not list((tmp_path / "ckpt").glob(".staging-*"))
    quota.remaining = None
    ckpt.save(3, _state(model, opt, 3))  # the error was reported once; saving works again
    ckpt.close()
    assert latest_step(tmp_path / "ckpt") == 3


def test_corrupt_newest_falls_back_to_older(tmp_path: Path) -> None:
    model, opt = _model()
    events = EventWriter(tmp_path / "events.jsonl")
    with Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=False), events=events) as ckpt:
        ckpt.save(1, _state(model, opt, 1))
        ckpt.save(2, _state(model, opt, 2))
    shard = tmp_path / "ckpt" / "step-2" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert latest_step(tmp_path / "ckpt") == 2  # sizes still match: only checksums catch a flipped byte
    assert latest_step(tmp_path / "ckpt", checksums=True) == 1
    state = _state(*_model(), 0)
    assert Checkpointer(tmp_path / "ckpt", events=events).restore(state) == 1
    rejected = [r for r in read_events(tmp_path / "events.jsonl") if isinstance(r, CheckpointRejected)]
    assert [r.step for r in rejected] == [2] and "checksum" in rejected[0].reason


def test_structure_mismatch_raises_instead_of_starting_over(tmp_path: Path) -> None:
    model, opt = _model()
    with Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=False)) as ckpt:
        ckpt.save(1, _state(model, opt, 1))
    other = torch.nn.Linear(4, 5)
    with pytest.raises(CheckpointError, match=r"model\.weight"):
        Checkpointer(tmp_path / "ckpt").restore(
            {
                "model": other.state_dict(),
                "optim": opt.state_dict(),
                "step": 0,
                "rank_local": {"rng": torch.get_rng_state(), "position": 0},
            }
        )
    fresh = torch.optim.Adam(model.parameters())  # optimizer state not initialised
    with pytest.raises(CheckpointError, match="optimizer state"):
        Checkpointer(tmp_path / "ckpt").restore(
            {
                "model": model.state_dict(),
                "optim": fresh.state_dict(),
                "step": 0,
                "rank_local": {"rng": torch.get_rng_state(), "position": 0},
            }
        )
    assert (tmp_path / "ckpt" / "step-1").exists()  # a mismatch is not corruption: nothing moved


def test_empty_or_uncommitted_directory_restores_nothing(tmp_path: Path) -> None:
    assert Checkpointer(tmp_path / "none").restore({"x": torch.zeros(2)}) is None
    staged = tmp_path / "ckpt" / ".staging-step-5-abcd"
    staged.mkdir(parents=True)
    (staged / "manifest.json").write_text("{}")
    (tmp_path / "ckpt" / "step-6").mkdir()  # renamed but no manifest: never committed
    assert latest_step(tmp_path / "ckpt") is None
    assert Checkpointer(tmp_path / "ckpt").restore({"x": torch.zeros(2)}) is None


def test_retention_and_interval(tmp_path: Path) -> None:
    events = EventWriter(tmp_path / "events.jsonl")
    config = CheckpointConfig(async_save=True, keep_last=2, keep_every=4, interval=IntervalPolicy.every_steps(2))
    ckpt = Checkpointer(tmp_path / "ckpt", config, events=events)
    x = torch.arange(6.0)
    saved = []
    for step in range(1, 11):
        x += 1
        if ckpt.should_save(step):
            ckpt.save(step, {"x": x})
            saved.append(step)
    ckpt.close()
    assert saved == [2, 4, 6, 8, 10]
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names == [".trainguard.lock", "step-10", "step-4", "step-8"]  # the lock file stays (see lock.py)
    target = {"x": torch.zeros(6)}
    assert Checkpointer(tmp_path / "ckpt").restore(target) == 10
    assert torch.equal(target["x"], torch.arange(6.0) + 10)  # staged copy, not a later mutation
    with pytest.raises(CheckpointError, match="closed"):
        ckpt.save(11, {"x": x})


def test_auto_policy_records_measured_cost(tmp_path: Path) -> None:
    events = EventWriter(tmp_path / "events.jsonl")
    policy = IntervalPolicy.auto(mtbf_seconds=3600, save_cost_seconds=100)
    ckpt = Checkpointer(tmp_path / "ckpt", CheckpointConfig(interval=policy), events=events)
    assert not ckpt.should_save(1)  # the interval (minutes) has not passed
    ckpt.save(1, {"x": torch.ones(3)})
    ckpt.wait()  # measured blocking cost (milliseconds) replaces the 100 s guess
    ckpt.set_mtbf(60.0)
    ckpt.close()
    changes = [r for r in read_events(tmp_path / "events.jsonl") if isinstance(r, CheckpointPolicyChanged)]
    assert len(changes) == 3 and changes[0].save_cost_seconds == 100
    assert changes[1].save_cost_seconds is not None and changes[1].save_cost_seconds < 100
    assert changes[2].mtbf_seconds == 60.0
    assert changes[2].interval_seconds is not None and changes[2].interval_seconds < changes[0].interval_seconds  # type: ignore[operator]


def test_manifest_is_plain_json_with_versions(tmp_path: Path) -> None:
    with Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=False)) as ckpt:
        ckpt.save(3, {"x": torch.ones(2, dtype=torch.bfloat16), "note": "hello"})
    data = json.loads((tmp_path / "ckpt" / "step-3" / "manifest.json").read_text())
    assert data["format"] == "trainguard-checkpoint" and data["step"] == 3
    assert data["structure"]["x"]["dtype"] == "bfloat16" and data["structure"]["note"] == {"kind": "object"}
    assert data["checksum"] == "xxh3_64" and all(len(f["checksum"]) == 16 for f in data["files"].values())


def test_crc32_checkpoints_verify_and_unverifiable_ones_are_kept(tmp_path: Path) -> None:
    with Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=False, checksum="crc32")) as ckpt:
        ckpt.save(1, {"x": torch.ones(3)})
    assert read_manifest(tmp_path / "ckpt" / "step-1").checksum_algorithm == "crc32"
    target = {"x": torch.zeros(3)}
    assert Checkpointer(tmp_path / "ckpt").restore(target) == 1 and torch.equal(target["x"], torch.ones(3))
    path = tmp_path / "ckpt" / "step-1" / "manifest.json"
    path.write_text(path.read_text().replace('"crc32"', '"blake9"'))
    with pytest.raises(CheckpointError, match="cannot be verified here"):
        Checkpointer(tmp_path / "ckpt").restore(target)
    assert (tmp_path / "ckpt" / "step-1").exists()  # not proof of damage: left in place
    with pytest.raises(ValueError, match="not available"):
        CheckpointConfig(checksum="blake9")


def test_rank_local_state_needs_the_same_world_size(tmp_path: Path) -> None:
    with Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=False)) as ckpt:
        ckpt.save(1, {"x": torch.ones(2), "rank_local": {"position": 1}})
    path = tmp_path / "ckpt" / "step-1" / "manifest.json"
    data = json.loads(path.read_text())
    data["world_size"] = 2
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="saved by 2 ranks"):
        Checkpointer(tmp_path / "ckpt").restore({"x": torch.zeros(2), "rank_local": {"position": 0}})
    target = {"x": torch.zeros(2)}  # without rank-local state the checkpoint is still usable...
    with pytest.raises(CheckpointError, match="state lacks"):  # ...but the state must cover all of it
        Checkpointer(tmp_path / "ckpt").restore(target)


def test_with_a_real_process_group(tmp_path: Path) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="own gloo group"):
            Checkpointer(tmp_path / "ckpt", process_group=dist.GroupMember.WORLD)
        ckpt = Checkpointer(tmp_path / "ckpt", CheckpointConfig(interval=IntervalPolicy.every_seconds(3600)))
        assert not ckpt.should_save(1)  # time policy: decided on rank 0, broadcast on the control group
        ckpt.save(1, {"x": torch.arange(4.0), "rank_local": {"position": 1}})
        ckpt.close()
        state = {"x": torch.zeros(4), "rank_local": {"position": 0}}
        assert Checkpointer(tmp_path / "ckpt").restore(state) == 1
        assert torch.equal(state["x"], torch.arange(4.0)) and state["rank_local"] == {"position": 1}
    finally:
        dist.destroy_process_group()
