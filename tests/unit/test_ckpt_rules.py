"""Which observed saves and loads are checkpoints, the step a loaded one holds, and how it ranks as a resume point."""

from __future__ import annotations

import pytest

from trainguard.accounting import resume
from trainguard.accounting.resume import AttemptSteps
from trainguard.core.events import CheckpointLoaded
from trainguard.worker import ckpt_rules


class _Optimizer:
    def __init__(self) -> None:
        self.param_groups: list[dict[str, object]] = [{}]
        self.state: dict[object, object] = {}

    def state_dict(self) -> dict[str, object]:
        return {"state": self.state, "param_groups": self.param_groups}


@pytest.mark.parametrize(("content", "path", "nbytes", "why"), [
    (({"model": {}, "opt": {"state": {}, "param_groups": []}, "step": 3},), "last.pt", 10, "optimizer state"),
    (({"model": _Optimizer()},), "state.pt", 10, "optimizer state"),  # Fabric saves the objects
    (({"w": 1},), "/x/step-15.pt", 10, "name"),
    (({"w": 1},), "/x/model_epoch3.pt", 10, "name"),
    (({"w": 1},), "/out/checkpoint-250/model.safetensors", 10, "name"),
    (({"w": 1},), "/out/last.ckpt", 10, "name"),
    (({"w": 1},), "/out/model_final.pt", 10, ""),  # an export
    (({"w": 1},), "/ckpt/model_final.pt", 10, ""),  # a folder named ckpt alone says nothing
    (({"w": 1},), "/out/model_final.pt", 256 << 20, "size"),
    ((None,), "", 10, ""),
])
def test_what_is_a_checkpoint(content: tuple[object, ...], path: str, nbytes: int, why: str) -> None:
    assert ckpt_rules.is_checkpoint(always=False, content=content, path=path, nbytes=nbytes, environ={}) == why
    assert ckpt_rules.is_checkpoint(always=True, content=content, path=path, nbytes=nbytes, environ={}) == "entry"


def test_the_size_threshold_is_configurable() -> None:
    assert ckpt_rules.min_bytes({ckpt_rules.MIN_BYTES_ENV: "4096"}) == 4096
    assert ckpt_rules.min_bytes({ckpt_rules.MIN_BYTES_ENV: "lots"}) == ckpt_rules.DEFAULT_MIN_BYTES


def test_the_step_a_checkpoint_holds() -> None:
    assert ckpt_rules.step_in_content({"global_step": 40, "step": 7, "epoch": 2}) == (40, 2.0)
    assert ckpt_rules.step_in_content({"iteration": 9}) == (9, None)
    assert ckpt_rules.step_in_content({"epoch": 3}) == (None, 3.0)
    assert ckpt_rules.step_in_content({"step": True}, {"step": -1}, {"step": 2.5}) == (None, None)
    assert ckpt_rules.step_in_content(None, {"step": 12}) == (12, None)
    paths = ("ckpt/step-15", "checkpoint_7", "out/checkpoint-250/model.safetensors", "lightning/epoch=1-step=300.ckpt",
             "iter_0042.pt", "ckpt/last.pt")
    assert [ckpt_rules.step_in_path(p) for p in paths] == [15, 7, 250, 300, 42, None]


def _loaded(step: int, source: str, attempt: int = 1) -> CheckpointLoaded:
    return CheckpointLoaded(time=1.0, attempt=attempt, rank=0, step=step, seconds=0.1, step_source=source)


def test_loaded_evidence_prefers_exact_sources_and_ignores_unknown_steps() -> None:
    found = resume.loaded_evidence([_loaded(0, "unknown"), _loaded(30, "optimizer"), _loaded(20, "name"),
                                    _loaded(0, "unknown", attempt=2)])
    assert {a: (e.step, e.source) for a, e in found.items()} == {1: (20, "checkpoint_name")}


def test_content_or_name_comes_before_a_continued_optimizer_count_and_the_count_before_the_optimizer_state() -> None:
    steps = [AttemptSteps(0, "optimizer", 1, 23), AttemptSteps(1, "optimizer", 22, 31)]
    content = resume.Evidence(20, "checkpoint_content", "its content says so")
    assert resume.infer(steps, {1: content})[1].source == "checkpoint_content"
    assert resume.infer(steps, {1: content})[1].offset == -1
    by_optimizer = resume.Evidence(21, "optimizer_state", "the optimizer's count")
    assert resume.infer(steps, {1: by_optimizer})[1].source == "numbering"
    sgd = [AttemptSteps(0, "attempt", 1, 23), AttemptSteps(1, "attempt", 1, 10)]
    assert (resume.infer(sgd, {1: content})[1].step, resume.infer(sgd, {1: content})[1].offset) == (20, 20)
    assert resume.infer(sgd, {})[1].source == "unknown"
    # a restore seen in the first attempt is a start from given weights
    assert resume.infer(sgd, {0: content, 1: content})[0].source == "first"
