"""Live healing (`trainguard.Replica`) on a real 3-rank gloo job under ``trainguard run --in-process``.

Waiting for the new ranks (``keep_training=False``): after a rank is killed the survivors go on from the step
they finished (no rollback: the job has no checkpoint at all) and the new rank takes their state from the lowest
live rank; a second fault kills that source rank itself; the job ends with the fault-free final loss.
Training on (the default): the survivors train in a group of their own right after the fault, and every rank
ends with the same state once the new rank has healed from them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e._run_helpers import ROOT, events, of_type, trainguard

pytestmark = pytest.mark.timeout(600)

SCRIPT = ROOT / "tests" / "e2e" / "userscripts" / "inprocess_heal.py"


def _run(run_dir: Path, *options: str, steps: int = 20, wait: bool = True) -> str:
    proc = trainguard("run", "--nproc-per-node", "3", "--run-dir", str(run_dir), "--no-health-checks",
                      "--max-restarts", "3", "--in-process", *options, "--", str(SCRIPT), "--steps", str(steps),
                      "--ckpt-dir", str(run_dir / "ck"), *(["--wait-for-new-ranks"] if wait else []), timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def _loss(output: str) -> float:
    found = re.findall(r"\]: final loss ([0-9.]+)", output)
    assert found, output[-3000:]
    return float(found[-1])


def _steps_by_rank(run_dir: Path, attempt: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for s in of_type(events(run_dir, "rank-"), "step_completed"):
        if s["attempt"] == attempt:
            out.setdefault(s["rank"], []).append(s["step"])
    return out


@pytest.mark.slow
def test_survivors_keep_their_steps_and_new_ranks_heal_from_a_live_peer(tmp_path: Path) -> None:
    clean = _loss(_run(tmp_path / "clean"))
    run_dir = tmp_path / "faults"
    out = _run(run_dir, "--inject", "crash@step=7,rank=1;crash@step=12,rank=0")
    assert _loss(out) == pytest.approx(clean, abs=1e-9), out[-3000:]
    assert not (run_dir / "ck").exists()  # no checkpoint was ever written: nothing to roll back to
    # Attempt 1: rank 1 was killed in step 7; ranks 0 and 2 had finished step 6, rank 0 sent it.
    # Attempt 2: rank 0, the last source, was killed in step 12; rank 1 (healed in attempt 1) sent step 11.
    for attempt, step, source in ((1, 6, 0), (2, 11, 1)):
        said = set(re.findall(rf"rank (\d): attempt {attempt} healed to step {step} from rank {source} "
                              r"\(received (True|False)\)", out))
        assert said == {(str(r), str(r != source)) for r in range(3)}, out[-4000:]
    assert re.findall(r"attempt (\d+) restored step (\d+) from the checkpoint", out) == [("0", "0")] * 3
    assert "survivor(s)" not in out  # they waited for the new rank
    # Every rank's steps in an attempt after a fault start right after the healed step: none was repeated.
    for attempt, first in ((1, 7), (2, 12)):
        by_rank = _steps_by_rank(run_dir, attempt)
        assert sorted(by_rank) == [0, 1, 2] and {min(v) for v in by_rank.values()} == {first}, by_rank
    recoveries = of_type(events(run_dir, "agent-"), "inprocess_recovery")
    assert [(r["status"], r["ranks"]) for r in recoveries] == [("recovered", [1]), ("recovered", [0])]


@pytest.mark.slow
def test_survivors_train_on_without_the_lost_rank_and_heal_it_when_it_arrives(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = _run(run_dir, "--inject", "crash@step=7,rank=1", steps=60, wait=False)
    # Ranks 0 and 2 trained on at once as a group of two (renumbered 0 and 1 in the order they came).
    assert sorted(re.findall(r"rank (\d) trains on as rank (\d) of 2 survivor", out)) in (
        [("0", "0"), ("2", "1")], [("0", "1"), ("2", "0")]), out[-4000:]
    left = re.findall(r"rank (\d) leaves the interim group after (\d+) step", out)
    assert sorted(r for r, _ in left) == ["0", "2"] and len({n for _, n in left}) == 1 and int(left[0][1]) >= 1
    interim_steps = int(left[0][1])
    by_rank = _steps_by_rank(run_dir, 1)
    assert min(by_rank[0]) == min(by_rank[2]) == 7, by_rank  # no step lost or repeated by the survivors
    # The new rank healed to where the survivors were when it arrived, from the lowest rank holding it.
    healed = re.findall(rf"rank (\d): attempt 1 healed to step {6 + interim_steps} from rank 0 "
                        r"\(received (True|False)\)", out)
    assert sorted(healed) == [("0", "False"), ("1", "True"), ("2", "True")], out[-4000:]
    if 6 + interim_steps < 60:  # the new rank came before the survivors had finished: it trained on from there
        assert min(by_rank[1]) == 7 + interim_steps, by_rank
    # Every rank ends with the same state: the same loss on the same fixed batch.
    finals = dict(re.findall(r"rank (\d): attempt 1 final loss ([0-9.]+)", out))
    assert set(finals) == {"0", "1", "2"} and len(set(finals.values())) == 1, finals
    [recovery] = of_type(events(run_dir, "agent-"), "inprocess_recovery")
    assert recovery["status"] == "recovered" and recovery["ranks"] == [1]
