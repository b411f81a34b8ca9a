"""What ``trainguard run`` tells a person on the console: one line per detection, diagnosis and restart,
a summary, faults that never fired, and nothing of it with ``--quiet``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e._run_helpers import TINY, TRAIN_GPT
from tests.e2e.cli import trainguard

pytestmark = pytest.mark.timeout(150)

SCHEDULE = "crash@step=3,rank=1;crash@step=99,rank=0"
"""One crash that fires, and one whose step the 6-step job never reaches."""


def _run(tmp_path: Path, *extra: str) -> tuple[int, str, dict]:
    res = trainguard("run", "--nproc-per-node", "2", "--no-health-checks", "--run-dir", str(tmp_path / "run"),
                     "--inject", SCHEDULE, "--json", *extra, str(TRAIN_GPT), "--steps", "6", "--ckpt-every", "2",
                     *TINY, timeout=140)
    assert res.code == 0, res.err[-3000:]
    return res.code, res.err, json.loads(res.out)


def _ours(err: str, word: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("trainguard: ") and word in line]


def test_a_crash_gives_one_detection_one_diagnosis_one_restart_and_a_summary(tmp_path: Path) -> None:
    _, err, result = _run(tmp_path)
    detected = _ours(err, " detected in attempt ")
    assert len(detected) == 1 and detected[0].startswith("trainguard: crash detected in attempt 0") \
        and "rank 1" in detected[0], err[-3000:]
    diagnosis = _ours(err, "diagnosis of attempt")
    assert len(diagnosis) == 1 and "culprit rank 1" in diagnosis[0] and "category " in diagnosis[0]
    assert str(tmp_path / "run" / "diagnostics" / "attempt-0") in diagnosis[0]
    restart = _ours(err, "restart: attempt")
    # "(N warm)" when the default warm spares were ready by the crash (they fill 5 s into the attempt)
    assert len(restart) == 1 and re.match(r"trainguard: restart: attempt 1 with 2 ranks( \([12] warm\))?, ", restart[0])
    summary = _ours(err, "summary:")
    assert len(summary) == 1
    assert re.search(r"summary: completed \(.*\); 6 steps, 1 restart, ETTR \d\.\d{3};", summary[0]), summary[0]
    # The fault that never fired is said, on the console and in the result, not silently dropped.
    assert result["unfired_faults"] == ["crash@step=99,rank=0"]
    assert len(_ours(err, "never fired: crash@step=99,rank=0")) == 1
    # Worker output is streamed with rank prefixes (on stderr, since --json keeps stdout for the result).
    assert re.search(r"^\[rank0\]: train_gpt: step 6/6 loss ", err, re.MULTILINE)


def test_quiet_prints_none_of_the_lines_but_still_the_result(tmp_path: Path) -> None:
    _, err, result = _run(tmp_path, "--quiet")
    assert result["status"] == "completed" and len(result["failures"]) == 1
    for word in (" detected in attempt ", "diagnosis of attempt", "restart: attempt", "summary:"):
        assert _ours(err, word) == [], err
    assert "[rank" not in err
    # Faults that never fired are still said: a schedule is never silently dropped.
    assert result["unfired_faults"] == ["crash@step=99,rank=0"]


def test_a_missing_module_in_a_rank_is_a_dependency_named_in_one_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nimport a_package_this_machine_lacks\n")
    res = trainguard("run", "--nproc-per-node", "2", "--no-health-checks", "--max-restarts", "0", "--run-dir",
                     str(tmp_path / "run"), "--json", str(script), timeout=140)
    assert res.code != 0 and json.loads(res.out)["status"] == "failed", res.err[-3000:]
    (line,) = _ours(res.err, "diagnosis of attempt 0")
    assert ("category Dependency (confidence 0.90: a Python package is missing: a_package_this_machine_lacks)"
            in line), line
