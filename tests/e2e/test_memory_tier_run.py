"""The memory tier under `trainguard run`: a crashed rank's restart restores from host memory, reading nothing
from storage, although the agent ends every process of an attempt that outlives its rank (the holder is not one)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e._run_helpers import trainguard

SCRIPT = Path(__file__).parent / "userscripts" / "memory_tier_crash.py"


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_crash_restores_from_memory_under_trainguard_run(tmp_path: Path) -> None:
    out, shm = tmp_path / "out", tmp_path / "shm"
    out.mkdir()
    shm.mkdir(mode=0o700)
    res = trainguard("run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                     "--run-dir", str(tmp_path / "run"), str(SCRIPT), timeout=300,
                     env={"OUT": str(out), "SHM": str(shm), "CKPT": str(tmp_path / "ckpt"),
                          "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        first, second = _records(out / f"rank-{rank}.jsonl")
        assert first == {"attempt": 0, "start": 0, "tier": "", "storage_bytes": 0}
        # Step 6 was copied to memory (storage holds step 4 only): the restart resumes from memory.
        assert second["attempt"] == 1 and second["start"] == 6, second
        assert second["tier"] == "own", second  # one node: its own holder kept both ranks' copies
        assert second["storage_bytes"] == 0, second


def test_the_run_flag_turns_the_memory_tier_on_for_an_unconfigured_checkpointer(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    res = trainguard("run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                     "--memory-checkpoint-gb", "0.05", "--run-dir", str(tmp_path / "run"), str(SCRIPT),
                     timeout=300, env={"OUT": str(out), "SHM": "", "CKPT": str(tmp_path / "ckpt"),
                                       "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        _, second = _records(out / f"rank-{rank}.jsonl")
        # Step 4's storage save was also kept in memory: the restart reads it from there, not from storage.
        assert second == {"attempt": 1, "start": 4, "tier": "own", "storage_bytes": 0}, second


def test_a_negative_memory_bound_is_a_usage_error(tmp_path: Path) -> None:
    res = trainguard("run", "--standalone", "--memory-checkpoint-gb", "-1", "--run-dir", str(tmp_path / "run"),
                     str(SCRIPT), timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len([line for line in res.stderr.splitlines() if line.strip()]) == 1, res.stderr


def test_a_bad_placement_is_a_usage_error(tmp_path: Path) -> None:
    res = trainguard("run", "--standalone", "--memory-checkpoint-gb", "1", "--memory-checkpoint-placement", "clique:1",
                     "--run-dir", str(tmp_path / "run"), str(SCRIPT), timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "--memory-checkpoint-placement" in res.stderr and "clique:K" in res.stderr, res.stderr
    assert not (tmp_path / "run").exists()
