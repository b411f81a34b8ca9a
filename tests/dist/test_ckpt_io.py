"""Checkpoint saves and restores seen at torch's, DCP's and safetensors' public calls, in one process."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from trainguard.core.protocol import RunLayout, WorkerEnv
from trainguard.worker import autohooks, bootstrap, ckpt_entries, ckpt_io, runtime


@pytest.fixture
def rt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[runtime.Runtime]:
    for key in ("RANK", "TRAINGUARD_AGENT_PID", "TRAINGUARD_CHAOS", ckpt_io.ENV, "TRAINGUARD_CHECKPOINT_MIN_BYTES"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TRAINGUARD_RUN_DIR", str(tmp_path / "run"))
    r = runtime.acquire(env=WorkerEnv.from_environ())
    assert autohooks.install_optimizer_hooks(torch.optim)
    assert ckpt_entries.on_import("torch.optim", torch.optim)
    yield r
    ckpt_entries.uninstall()
    autohooks.uninstall()
    r.close()


def _records(rt: runtime.Runtime, kind: str) -> list[dict[str, Any]]:
    path = RunLayout(rt.run_dir).rank_events(0)
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["type"] == kind]


def _model_and_opt(kind: str = "adamw") -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters()) if kind == "adamw" else torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    model(torch.ones(2, 8)).sum().backward()
    opt.step()


def test_the_bootstrap_watches_the_modules_with_checkpoint_calls() -> None:
    assert bootstrap.CHECKPOINT_MODULES == tuple(m for m in ckpt_entries.MODULES if m != "torch.optim")
    assert set(bootstrap.CHECKPOINT_MODULES) <= set(bootstrap.watched({}))
    assert not set(bootstrap.CHECKPOINT_MODULES) & set(bootstrap.watched({bootstrap.CHECKPOINT_ENV: "0"}))


def test_a_save_with_optimizer_state_is_a_checkpoint_and_a_small_export_is_not(rt: runtime.Runtime,
                                                                               tmp_path: Path) -> None:
    model, opt = _model_and_opt()
    _step(model, opt)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": 1}, tmp_path / "last.pt")
    torch.save(model.state_dict(), tmp_path / "model_final.pt")  # an export: small, no optimizer, plain name
    torch.save(model.state_dict(), tmp_path / "step-1.pt")  # named like a checkpoint
    (started_a, started_b) = _records(rt, "checkpoint_save_started")
    saves = _records(rt, "checkpoint_save_finished")
    assert [Path(s["path"]).name for s in saves] == ["last.pt", "step-1.pt"]
    assert [(s["entry"], s["framework"], s["step"], s["ok"]) for s in saves] == [("torch.save", "torch", 1, True)] * 2
    assert saves[0]["bytes"] == os.path.getsize(tmp_path / "last.pt")
    assert started_a["step"] == 1 and started_a["time"] <= saves[0]["time"] - saves[0]["blocking_seconds"] + 1e-3
    assert rt.phase != "checkpoint"


class _Probe(io.BytesIO):
    """A file object that notes the rank's heartbeat phase at each write (inside the save)."""

    def __init__(self, rt: runtime.Runtime, fail: bool = False) -> None:
        super().__init__()
        self.rt, self.fail, self.phases = rt, fail, set[str]()

    def write(self, data: Any) -> int:
        self.phases.add(self.rt.phase)
        if self.fail:
            raise OSError("disk full")
        return super().write(data)


def test_a_save_that_is_no_checkpoint_is_a_save_phase_while_it_runs(rt: runtime.Runtime) -> None:
    """An export the other ranks may wait for in a barrier: the rank writes, it is not stuck (the watchdog gives
    the phase the checkpoint allowance). The phase before it comes back after it, also when it fails."""
    model, _ = _model_and_opt()
    rt.set_phase("step")
    export = _Probe(rt)
    torch.save(model.state_dict(), export)
    assert export.phases == {ckpt_io.SAVE_PHASE} and rt.phase == "step"
    with pytest.raises(OSError, match="disk full"):
        torch.save(model.state_dict(), _Probe(rt, fail=True))
    assert rt.phase == "step"
    assert not _records(rt, "checkpoint_save_finished")  # still no checkpoint


def test_large_saves_count_and_file_objects_count_their_bytes(rt: runtime.Runtime, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINGUARD_CHECKPOINT_MIN_BYTES", "6000")
    buffer = io.BytesIO()
    torch.save({"w": torch.zeros(2000)}, buffer)
    torch.save({"w": torch.zeros(10)}, tmp_path / "tiny.pt")
    (save,) = _records(rt, "checkpoint_save_finished")
    assert save["bytes"] == len(buffer.getvalue()) and save["path"] == ""
    assert not _records(rt, "checkpoint_save_started")  # only known to be one once its size was


def test_a_failing_save_raises_the_users_error_unchanged_and_is_recorded(rt: runtime.Runtime, tmp_path: Path) -> None:
    _, opt = _model_and_opt()
    with pytest.raises(RuntimeError, match="does not exist") as info:
        torch.save({"opt": opt.state_dict()}, tmp_path / "missing" / "ckpt.pt")
    assert info.type is RuntimeError and info.traceback[-1].name != "call"  # raised where torch raised it
    (save,) = _records(rt, "checkpoint_save_finished")
    assert not save["ok"] and "does not exist" in save["error"]


def test_a_failing_observation_never_breaks_the_call(rt: runtime.Runtime, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> str:
        raise RuntimeError("observation bug")

    monkeypatch.setattr(ckpt_io.ckpt_rules, "is_checkpoint", broken)
    torch.save({"a": 1}, tmp_path / "ckpt.pt")
    assert torch.load(tmp_path / "ckpt.pt") == {"a": 1}
    assert rt.phase != "checkpoint"


def test_a_save_inside_an_observed_save_counts_once(rt: runtime.Runtime, tmp_path: Path) -> None:
    spec = ckpt_io.EntryPoint("fabric.save", "save", "fabric", path=((0, "path"),), always=True)

    def framework_save(path: Path, state: dict[str, Any]) -> None:
        torch.save(state, path / "model.pt")
        torch.save({"opt": state["opt"]}, path / "optimizer.pt")

    _, opt = _model_and_opt()
    (tmp_path / "ckpt").mkdir()
    ckpt_io.call(spec, framework_save, (tmp_path / "ckpt", {"opt": opt.state_dict()}), {})
    (save,) = _records(rt, "checkpoint_save_finished")
    assert save["entry"] == "fabric.save" and save["bytes"] == sum(
        p.stat().st_size for p in (tmp_path / "ckpt").iterdir())
    with ckpt_io.quiet():  # an adapter reporting its own save
        torch.save({"opt": opt.state_dict()}, tmp_path / "ckpt.pt")
    assert len(_records(rt, "checkpoint_save_finished")) == 1


def _save_plain(tmp_path: Path, name: str, kind: str, step: int | None) -> Path:
    model, opt = _model_and_opt(kind)
    for _ in range(3):
        _step(model, opt)
    state: dict[str, Any] = {"model": model.state_dict(), "opt": opt.state_dict()}
    if step is not None:
        state["step"] = step
    path = tmp_path / name
    torch.save(state, path)
    return path


@pytest.mark.parametrize(("name", "kind", "step", "found"), [
    pytest.param("last.pt", "sgd", 15, (15, "content"), id="content"),
    pytest.param("step-12.pt", "sgd", None, (12, "name"), id="name"),
    pytest.param("last.pt", "adamw", None, (3, "optimizer"), id="optimizer"),
    pytest.param("last.pt", "sgd", None, (0, "unknown"), id="sgd-nothing"),
])
def test_a_restore_is_the_load_and_the_state_it_is_applied_to(rt: runtime.Runtime, tmp_path: Path, name: str,
                                                               kind: str, step: int | None,
                                                               found: tuple[int, str]) -> None:
    path = _save_plain(tmp_path, name, kind, step)
    model, opt = _model_and_opt(kind)
    state = torch.load(path)
    assert not _records(rt, "checkpoint_loaded")  # the restore is still going on
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    torch.nn.Linear(8, 8).load_state_dict(model.state_dict())  # not what was loaded: not part of the restore
    _step(model, opt)  # the first update ends the restore
    (loaded,) = _records(rt, "checkpoint_loaded")
    assert (loaded["step"], loaded["step_source"]) == found
    assert loaded["entry"] == "torch.load" and loaded["path"] == str(path)
    assert loaded["bytes"] == os.path.getsize(path)
    assert 0 < loaded["seconds"] < 60


def test_loading_something_that_is_no_checkpoint_is_no_restore(rt: runtime.Runtime, tmp_path: Path) -> None:
    torch.save({"w": torch.zeros(4)}, tmp_path / "pretrained.pt")
    model, opt = _model_and_opt()
    torch.load(tmp_path / "pretrained.pt")
    _step(model, opt)
    ckpt_io.close_episode()
    assert not _records(rt, "checkpoint_loaded")


def test_dcp_save_and_load_are_checkpoints(rt: runtime.Runtime, tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    assert ckpt_entries.on_import("torch.distributed.checkpoint", dcp)
    model, opt = _model_and_opt()
    _step(model, opt)
    state: dict[str, Any] = {"model": model.state_dict(), "step": 7}
    dcp.save(state, checkpoint_id=str(tmp_path / "ckpt-a"), no_dist=True)
    (save,) = _records(rt, "checkpoint_save_finished")
    assert save["entry"] == "dcp.save" and save["bytes"] > 0 and save["step"] == 1
    fresh: dict[str, Any] = {"model": torch.nn.Linear(8, 8).state_dict(), "step": 0}
    dcp.load(fresh, checkpoint_id=str(tmp_path / "ckpt-a"), no_dist=True)
    model.load_state_dict(fresh["model"])
    ckpt_io.close_episode()
    (loaded,) = _records(rt, "checkpoint_loaded")
    assert (loaded["entry"], loaded["step"], loaded["step_source"]) == ("dcp.load", 7, "content")


def test_safetensors_files_count_by_their_name(rt: runtime.Runtime, tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.torch")
    assert ckpt_entries.on_import("safetensors.torch", st)
    (tmp_path / "checkpoint-20").mkdir()
    st.save_file({"w": torch.zeros(4)}, str(tmp_path / "checkpoint-20" / "model.safetensors"))
    st.save_file({"w": torch.zeros(4)}, str(tmp_path / "export.safetensors"))
    (save,) = _records(rt, "checkpoint_save_finished")
    assert save["entry"] == "safetensors.save_file" and save["path"].endswith("checkpoint-20/model.safetensors")
    st.load_file(str(tmp_path / "checkpoint-20" / "model.safetensors"))
    ckpt_io.close_episode()
    (loaded,) = _records(rt, "checkpoint_loaded")
    assert (loaded["step"], loaded["step_source"]) == (20, "name")


def test_dcp_state_preparation_is_part_of_the_restore_and_its_zero_step_no_step(rt: runtime.Runtime,
                                                                                tmp_path: Path) -> None:
    import time

    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.state_dict as dcp_state

    assert ckpt_entries.on_import("torch.distributed.checkpoint", dcp)
    assert ckpt_entries.on_import("torch.distributed.checkpoint.state_dict", dcp_state)
    model, opt = _model_and_opt()
    _step(model, opt)
    model_sd, optim_sd = dcp_state.get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd, "step": 1}, checkpoint_id=str(tmp_path / "c"), no_dist=True)
    steps_before = len(_records(rt, "step_completed"))
    fresh, fresh_opt = _model_and_opt()  # no optimizer state yet: DCP steps it once with zero gradients
    began = time.time()
    model_sd, optim_sd = dcp_state.get_state_dict(fresh, fresh_opt)
    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    dcp.load(state, checkpoint_id=str(tmp_path / "c"), no_dist=True)
    dcp_state.set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    ended = time.time()
    assert len(_records(rt, "step_completed")) == steps_before
    _step(fresh, fresh_opt)
    (loaded,) = _records(rt, "checkpoint_loaded")
    assert (loaded["step"], loaded["step_source"]) == (1, "content")
    assert began - 1e-3 <= loaded["time"] - loaded["seconds"] and loaded["time"] <= ended + 1e-3
    assert loaded["seconds"] >= 0.9 * (ended - began)


def test_the_launchers_feature_probe_does_not_import_dcp() -> None:
    # Importing torch.distributed.checkpoint to see that async_save exists cost `trainguard run` 0.5-1 s at start.
    import subprocess
    import sys

    code = ("import sys; from trainguard.torch_api.features import probe; s = probe(); "
            "print('torch.distributed.checkpoint' in sys.modules, dict((f.name, f.available) for f in s.features)"
            "['dcp_async'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "True"]


def test_an_async_dcp_save_is_one_save_blocking_for_its_call(rt: runtime.Runtime, tmp_path: Path) -> None:
    # async_save runs DCP's own save in a background thread: that write is the async save's, not a second save.
    import torch.distributed.checkpoint as dcp

    assert ckpt_entries.on_import("torch.distributed.checkpoint", dcp)
    model, opt = _model_and_opt()
    _step(model, opt)
    future = dcp.async_save({"model": model.state_dict(), "step": 1}, checkpoint_id=str(tmp_path / "a"), no_dist=True)
    import threading

    recorded = threading.Event()  # callbacks run in the order added: the observation's first, then this one
    future.add_done_callback(lambda _: recorded.set())
    future.result(timeout=60)
    assert recorded.wait(timeout=60)
    (save,) = _records(rt, "checkpoint_save_finished")
    assert save["entry"] == "dcp.async_save" and save["blocking_seconds"] <= save["total_seconds"]
