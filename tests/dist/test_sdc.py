"""The SDC check on real gloo ranks of an unmodified DDP script (tests/dist/userscripts/ddp_tiny.py), plus the
torch side's fingerprint and bit flip in one process. The test process plays the agent: it starts the ranks
with the worker environment and the bootstrap folder on PYTHONPATH and reads the marker they leave."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainguard.core.protocol import RunLayout, WorkerEnv
from trainguard.sdc import check as worker_sdc
from trainguard.sdc import verdict as sdc
from trainguard.worker.bootstrap import site_dir

SCRIPT = Path(__file__).parent / "userscripts" / "ddp_tiny.py"
NODE = "n0"

pytestmark = pytest.mark.timeout(180)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawn(tmp_path: Path, world: int, steps: int, *, every: int, chaos: str = "") -> list[subprocess.Popen[bytes]]:
    run_dir = tmp_path / "run"
    layout = RunLayout(run_dir)
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    base.update(WorkerEnv(run_dir=run_dir, attempt=0, node=NODE, heartbeat_dir=layout.heartbeat_dir(NODE, 0),
                          evidence_dir=layout.diagnostics_dir(0), agent_pid=os.getpid(), chaos=chaos,
                          pg_timeout_seconds=60.0, auto=True).to_environ())
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(site_dir()), base.get("PYTHONPATH", "")) if p)
    base.update(OMP_NUM_THREADS="1", TRAINGUARD_FR_PREWARM="0", TRAINGUARD_SDC_EVERY=str(every))
    port = _port()
    procs = []
    for rank in range(world):
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        log = (tmp_path / f"rank-{rank}.log").open("wb")
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), "--steps", str(steps)], env=env, cwd=tmp_path,
                                      stdout=log, stderr=subprocess.STDOUT))
    return procs


def _logs(tmp_path: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(tmp_path.glob("*.log")))


def _wait_marker(tmp_path: Path, procs: list[subprocess.Popen[bytes]], timeout: float = 90) -> sdc.SdcMarker:
    path = sdc.marker_path(tmp_path / "run", 0)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            marker = sdc.read_marker(path)
            if marker is not None:
                # The ranks wait for their agent (us) to stop them: they must still be alive, not training on.
                time.sleep(0.5)
                assert all(p.poll() is None for p in procs), _logs(tmp_path)
                return marker
            if all(p.poll() is not None for p in procs):
                break
            time.sleep(0.1)
        raise AssertionError(f"no SDC marker\n{_logs(tmp_path)}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_a_flipped_bit_is_found_at_the_next_check_and_the_right_rank_named(tmp_path: Path) -> None:
    procs = _spawn(tmp_path, 4, 12, every=2, chaos="sdc@step=4,rank=3")
    marker = _wait_marker(tmp_path, procs)
    # The flip lands right after step 3's update; the check after step 4 is the next one.
    assert marker.step == 4 and marker.last_clean_step == 2
    assert marker.culprit_ranks == (3,) and marker.majority
    assert marker.ranks == (0, 1, 2, 3)
    fps = marker.fingerprints
    assert fps[0] == fps[1] == fps[2] != fps[3]
    assert marker.source == "optimizer" and marker.last_clean_time <= marker.time
    assert "chaos: sdc on rank 3" in (tmp_path / "rank-3.log").read_text()


def test_two_ranks_have_no_majority_and_both_are_suspects(tmp_path: Path) -> None:
    procs = _spawn(tmp_path, 2, 12, every=3, chaos="sdc@step=2,rank=0")
    marker = _wait_marker(tmp_path, procs)
    assert marker.step == 3 and marker.last_clean_step == 0  # no clean check yet: the attempt's start
    assert not marker.majority and marker.culprit_ranks == (0, 1)


def test_a_clean_run_with_checks_every_step_finds_nothing_and_finishes(tmp_path: Path) -> None:
    procs = _spawn(tmp_path, 3, 8, every=1)
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [0, 0, 0], _logs(tmp_path)
    assert not (tmp_path / "run" / sdc.MARKER_DIR).exists()
    assert "SDC check" not in _logs(tmp_path)  # no "check failed/off" warning either


# --- the torch side in one process ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_fingerprint_sees_the_chaos_flip_and_nothing_else(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)).to(dtype)
    params = list(model.parameters())
    twin = [p.detach().clone() for p in params]
    assert worker_sdc.fingerprint(params) == worker_sdc.fingerprint(twin)
    structure, value = worker_sdc.fingerprint(params)
    text = worker_sdc.flip_bit(params)
    assert "->" in text
    after = worker_sdc.fingerprint(params)
    assert after[0] == structure and after[1] != value
    changed = [not torch.equal(a.view(-1), b.view(-1)) for a, b in zip(params, twin, strict=True)]
    assert sum(changed) == 1  # exactly one parameter, in place


def test_fingerprint_structure_depends_on_shapes() -> None:
    a = [torch.zeros(4, 4)]
    b = [torch.zeros(16, 1, dtype=torch.float64)]
    assert worker_sdc.fingerprint(a)[0] != worker_sdc.fingerprint(b)[0]


def test_parameter_tensors_follow_the_optimizer_groups_in_order() -> None:
    lin = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD([{"params": [lin.bias]}, {"params": [lin.weight]}], lr=0.1)
    assert worker_sdc.parameter_tensors(opt) == [lin.bias, lin.weight]
