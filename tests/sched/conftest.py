"""The real Slurm cluster the tests in this folder use (`tests.sched._slurm.SlurmCluster`).

One cluster per test session, started on first use (about 5 s) and stopped at the end. Where Slurm is not
installed the Slurm tests are skipped with the missing programs named (scripts/setup installs Debian's
slurm-wlm and munge, so CI has them); where it is installed but does not start, they fail.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.sched._slurm import SlurmCluster, missing_programs


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    missing = missing_programs()
    if missing:
        pytest.skip(f"Slurm is not installed here (missing: {', '.join(missing)}); scripts/setup installs "
                    "Debian's slurm-wlm and munge")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=3, cpus=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster with every node up and idle before and after the test (jobs cancelled, dead
    slurmds restarted, drained nodes resumed)."""
    _restore(slurm_cluster)
    yield slurm_cluster
    _restore(slurm_cluster)


def _restore(c: SlurmCluster, timeout: float = 60) -> None:
    c.run("scancel", "--full", "-u", "root", check=False)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not c.run("squeue", "-h", check=False).stdout.strip():
            break
        time.sleep(0.5)
    for node in c.names:
        if not c.slurmd_alive(node):
            c.restart_node(node)
    for node, state in c.node_states().items():
        if state.rstrip("*") != "idle":
            c.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
    while time.monotonic() < deadline:
        states = c.node_states()
        if states and all(s == "idle" for s in states.values()):
            return
        time.sleep(0.5)
    raise AssertionError(f"cluster not back to idle: {c.node_states()}")
