"""One job per checkpoint directory: a second job is refused by name, a dead holder's directory is free at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from trainguard.checkpoint import CheckpointConfig, Checkpointer, CheckpointError
from trainguard.checkpoint.lock import acquire, current_owner

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

ROOT = Path(__file__).resolve().parents[2]

# Job A: a real Checkpointer that saved once and stays alive (mid-run) until told to go.
_HOLDER = """
import sys, torch
from trainguard.checkpoint import CheckpointConfig, Checkpointer
ckpt = Checkpointer(sys.argv[1], CheckpointConfig(async_save=False))
ckpt.save(1, {"x": torch.ones(3)})
print("ready", flush=True)
sys.stdin.readline()
"""


def _start_holder(directory: Path, run_id: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TORCHELASTIC_RUN_ID": run_id, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(directory)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_second_job_is_refused_and_a_dead_holder_frees_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt = tmp_path / "ckpt"
    holder = _start_holder(ckpt, "job-a")
    try:
        # Job B, another run: refused at construction, before it could save, restore or retire anything.
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-b")
        with pytest.raises(CheckpointError, match=rf"in use by another job \(run job-a, pid {holder.pid} on "):
            Checkpointer(ckpt)
        assert (ckpt / "step-1").exists()

        # The restarted attempt of job A waits for its predecessor (still exiting) and then takes over.
        taken = []
        waiter = threading.Thread(
            target=lambda: taken.append(acquire(ckpt, current_owner("job-a"), wait_same_run_seconds=60))
        )
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive()  # blocked while the holder lives
        holder.send_signal(signal.SIGKILL)  # killed without any cleanup: the kernel drops the flock
        holder.wait()
        waiter.join(30)
        assert taken and taken[0].held
        taken[0].release()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()

    # Free now: a new job takes it at once, and its holder record names it.
    with Checkpointer(ckpt) as mine:
        target = {"x": torch.zeros(3)}
        assert mine.restore(target) == 1 and torch.equal(target["x"], torch.ones(3))
        assert '"run_id": "job-b"' in (ckpt / ".trainguard.lock").read_text()


def test_checkpointers_of_one_process_share_the_directory(tmp_path: Path) -> None:
    saver = Checkpointer(tmp_path / "ckpt", CheckpointConfig(async_save=False))
    saver.save(1, {"x": torch.ones(2)})
    reader = Checkpointer(tmp_path / "ckpt")  # same job (e.g. a restore helper): allowed
    target = {"x": torch.zeros(2)}
    assert reader.restore(target) == 1
    reader.close()
    saver.save(2, {"x": torch.ones(2)})  # closing one does not release the other's hold
    saver.close()
    again = acquire(tmp_path / "ckpt", current_owner("x"), wait_same_run_seconds=0)
    assert again.held
    again.release()


def test_lock_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / ".trainguard.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match="is a symlink"):
        Checkpointer(ckpt)
    assert not (tmp_path / "elsewhere").exists()


def test_with_a_process_group_every_rank_gets_the_refusal(tmp_path: Path) -> None:
    import torch.distributed as dist

    ckpt = tmp_path / "ckpt"
    holder = _start_holder(ckpt, "job-a")
    store = dist.TCPStore("127.0.0.1", 0, 1, True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with pytest.raises(CheckpointError, match=f"pid {holder.pid}"):
            Checkpointer(ckpt)
    finally:
        dist.destroy_process_group()
        holder.kill()
        holder.wait()
