"""Bad input to `trainguard run` and `trainguard demo`: one line on stderr, a documented exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e._run_helpers import TRAIN_GPT, trainguard

GPT = str(TRAIN_GPT)


@pytest.mark.parametrize(("args", "code", "words"), [
    (["run"], 2, "no training command"),
    (["run", "--"], 2, "no training command"),
    (["run", "--inject", "bogus@step=1", "--", GPT], 2, "unknown fault kind"),
    (["run", "--inject", "crash@step=abc", "--", GPT], 2, "step must be"),
    (["run", "--nnodes", "3:1", "--", GPT], 2, "--nnodes"),
    (["run", "--nnodes", "x", "--", GPT], 2, "--nnodes"),
    (["run", "--nnodes", "2", "--", GPT], 2, "--rdzv-endpoint is required"),
    (["run", "--max-restarts", "-1", "--", GPT], 2, "--max-restarts"),
    (["run", "--hang-floor", "0", "--", GPT], 2, "--hang-floor"),
    (["run", "--nproc-per-node", "0", "--", GPT], 2, "--nproc-per-node"),
    (["run", "--", "/nonexistent/train.py"], 3, "no such training script"),
    (["run", "--run-dir", "/proc/no/such/dir", "--", GPT], 4, "cannot create run directory"),
    (["demo", "--ranks", "0"], 2, "--ranks"),
    (["demo", "--steps", "-3"], 2, "--steps"),
    (["demo", "--model", "d_model=abc"], 2, "--model"),
    (["demo", "--model", "colour=3"], 2, "--model"),
    (["demo", "--inject", "crash"], 2, "needs step"),
    (["demo", "--ranks", "two"], 2, "invalid int"),
])
def test_bad_input_is_one_line_and_an_exit_code(args: list[str], code: int, words: str, tmp_path: Path) -> None:
    res = trainguard(*args, timeout=60)
    assert res.returncode == code, res.stderr
    assert words in res.stderr
    assert "Traceback" not in res.stderr
    assert res.stdout == ""
