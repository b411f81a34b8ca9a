"""The Slurm adapter, the drain policy and ``trainguard health --return-node`` against a real slurmctld (three
slurmd "nodes" on this machine, tests/sched/_slurm.py). No training: seconds, not minutes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.e2e.cli import assert_one_line_error, trainguard
from tests.postgres_server import PostgresServer
from tests.sched._slurm import SlurmCluster
from trainguard.health.drain import DrainPolicy, DrainSettings, Verdict
from trainguard.health.scheduler import drain_reason, open_adapter
from trainguard.health.slurm import SlurmAdapter

pytestmark = pytest.mark.timeout(180)


def adapter(slurm: SlurmCluster, **env: str) -> SlurmAdapter:
    return SlurmAdapter(environ=slurm.env(**env))


def reasons(slurm: SlurmCluster) -> dict[str, str]:
    out = slurm.run("sinfo", "-h", "-N", "-R", "-o", "%N|%E").stdout
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def test_drain_resume_and_listing_through_scontrol(slurm: SlurmCluster) -> None:
    a = adapter(slurm, SLURM_JOB_NODELIST="n[1-3]")
    assert a.cluster_nodes() == ["n1", "n2", "n3"] and a.job_nodes() == ["n1", "n2", "n3"]
    assert not a.node("n2").drained
    reason = "trainguard: Xid 79 GPU 0000:18:00 (Faulty GPU), run 12 attempt 2"
    a.drain("n2", reason)
    assert reasons(slurm) == {"n2": reason}  # exactly what a person reads in sinfo -R
    state = a.node("n2")
    assert state.drained and state.by_trainguard and state.by == "root" and state.since is not None
    slurm.run("scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=fan|replaced")
    listed = {s.node: s for s in a.drained()}
    assert set(listed) == {"n2", "n3"} and listed["n3"].reason == "fan|replaced" and not listed["n3"].by_trainguard
    a.resume("n2")
    assert not a.node("n2").drained
    with pytest.raises(KeyError):
        a.node("n9")
    with pytest.raises(KeyError):
        a.drain("n9", "trainguard: x")


def test_rate_limit_with_real_slurm_refuses_the_drain_past_it(slurm: SlurmCluster, tmp_path: Path) -> None:
    a = adapter(slurm, SLURM_JOB_NODELIST="n[1-3]")
    policy = DrainPolicy(DrainSettings(scheduler="slurm", max_share=0.34, max_cluster_share=1.0), a,
                         tmp_path / "run", "12", "n1")
    first = policy.decide(Verdict("n2", "lost", "node lost (agent silent for 10 s)", 0))
    second = policy.decide(Verdict("n3", "health", "failed health check gpu_ecc: 3 errors", 1))
    assert (first.status, second.status) == ("drained", "refused")
    assert "rate limit: 1 of the job's 3 nodes" in second.detail
    [(node, reason)] = reasons(slurm).items()
    assert node == "n2" and reason.startswith("trainguard: node lost (agent silent for 10 s), run 12 attempt 0")
    assert reason.endswith("]") and f" [uid {os.getuid()} " in reason  # the user and job that drained it


def test_return_node_cli(slurm: SlurmCluster, tmp_path: Path) -> None:
    env = {**slurm.env(), "TRAINGUARD_DB": str(tmp_path / "db" / "fleet.db")}
    a = adapter(slurm)
    a.drain("n2", drain_reason("node lost", "12", 0))  # this user's drain
    slurm.run("scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=RMA 4711")
    run = tmp_path / "run"  # where the nodes record their own checks (this test process is none of n1..n3)
    base = ["health", "--scheduler", "slurm", "--no-torch", "--no-gpu", "--run-dir", str(run)]

    listed = trainguard(*base, "--drained", "--json", env=env, timeout=60)
    assert listed.code == 0, listed.err
    assert {d["node"]: d["by_trainguard"] for d in json.loads(listed.out)} == {"n2": True, "n3": False}

    r = trainguard(*base, "--return-node", "n3", env=env, timeout=60)
    assert_one_line_error(r, 3)
    assert "not by trainguard" in r.err and "RMA 4711" in r.err
    r = trainguard(*base, "--return-node", "n1", env=env, timeout=60)
    assert_one_line_error(r, 3)
    assert "not drained" in r.err
    # from another host, this host's checks say nothing about n2: the node's own recorded rounds are needed
    r = trainguard(*base[:-2], "--return-node", "n2", env=env, timeout=60)
    assert_one_line_error(r, 2)
    assert "this host is not n2" in r.err
    r = trainguard(*base, "--return-node", "n2", "--passes", "1", env=env, timeout=60)
    assert_one_line_error(r, 3)
    assert "0 health round(s) recorded by node n2" in r.err and a.node("n2").drained

    # n2 records a failing high-severity check: it stays drained (exit 1)
    record = [*base, "--node", "n2", "--record"]
    (run / "chaos").mkdir(parents=True)
    (run / "chaos" / "unhealthy-n2").touch()
    assert trainguard(*record, env=env, timeout=60).code == 1
    r = trainguard(*base, "--return-node", "n2", "--passes", "1", env=env, timeout=60)
    assert r.code == 1 and "still drained" in r.out and "injected" in r.out, r
    assert a.node("n2").drained

    # two passing rounds recorded by n2 (another node's passing rounds would not count)
    (run / "chaos" / "unhealthy-n2").unlink()
    assert trainguard(*base, "--node", "n1", "--record", env=env, timeout=60).code == 0
    for _ in range(2):
        assert trainguard(*record, env=env, timeout=60).code == 0
    r = trainguard(*base, "--return-node", "n2", "--passes", "2", "--json", env=env, timeout=60)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["status"] == "returned" and doc["passes"] == 2 and doc["before"]["by_trainguard"]
    assert not a.node("n2").drained
    assert doc["recorded_in"] == str(tmp_path / "db" / "maintenance")
    hosts = trainguard("hosts", "--json", "--drained", env=env, timeout=60)
    assert hosts.code == 0, hosts.err
    [n2] = json.loads(hosts.out)
    assert n2["host"] == "n2" and n2["drains"]["returned"] == 1 and n2["drains"]["state"] == "returned"


def test_a_return_is_recorded_in_a_fleet_database_on_a_server(slurm: SlurmCluster, tmp_path: Path,
                                                              postgres_server: PostgresServer) -> None:
    """``--db postgresql://...``: the return's record goes to this host's data folder and is indexed on the server."""
    url = postgres_server.url(postgres_server.new_database())
    env = {**slurm.env(), "XDG_DATA_HOME": str(tmp_path / "data"), "TRAINGUARD_DB": str(tmp_path / "unused.db")}
    adapter(slurm).drain("n2", drain_reason("node lost", "12", 0))
    run = tmp_path / "run"
    base = ["health", "--scheduler", "slurm", "--no-torch", "--no-gpu", "--run-dir", str(run)]
    assert trainguard(*base, "--node", "n2", "--record", env=env, timeout=60).code == 0
    r = trainguard(*base, "--return-node", "n2", "--passes", "1", "--db", url, "--json", env=env, timeout=60)
    assert r.code == 0, r.err
    assert json.loads(r.out)["recorded_in"] == str(tmp_path / "data" / "trainguard" / "maintenance")
    hosts = trainguard("hosts", "--json", "--drained", "--db", url, env=env, timeout=60)
    assert hosts.code == 0, hosts.err
    [n2] = json.loads(hosts.out)
    assert n2["host"] == "n2" and n2["drains"]["returned"] == 1
    assert not (tmp_path / "unused.db").exists()


def test_return_node_refuses_another_users_drain(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A reason starting ``trainguard:`` is not enough: it must name this user (uid), whatever its health."""
    env = {**slurm.env(), "TRAINGUARD_DB": str(tmp_path / "db" / "fleet.db")}
    run = tmp_path / "run"
    base = ["health", "--scheduler", "slurm", "--no-torch", "--no-gpu", "--run-dir", str(run)]
    other = f"trainguard: node lost, run R attempt 0 [uid {os.getuid() + 4242} bob job 9001]"
    slurm.run("scontrol", "update", "NodeName=n2", "State=DRAIN", f"Reason={other}")
    slurm.run("scontrol", "update", "NodeName=n3", "State=DRAIN", "Reason=trainguard: node lost, run R attempt 0")
    for node in ("n2", "n3"):
        assert trainguard(*base, "--node", node, "--record", env=env, timeout=60).code == 0  # healthy rounds
    r = trainguard(*base, "--return-node", "n2", "--passes", "1", env=env, timeout=60)
    assert_one_line_error(r, 3)
    assert "job 9001 of user bob" in r.err
    r = trainguard(*base, "--return-node", "n3", "--passes", "1", env=env, timeout=60)
    assert_one_line_error(r, 3)
    assert "names no user" in r.err
    assert reasons(slurm) == {"n2": other,
                              "n3": "trainguard: node lost, run R attempt 0"}  # both still drained


def _running_job(slurm: SlurmCluster, nodes: str, out: Path) -> str:
    job = slurm.run("sbatch", "--parsable", "-N", str(len(nodes.split(","))), "-w", nodes, f"--output={out}",
                    "--wrap", "sleep 600").stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while slurm.job_fields(job).get("JobState") != "RUNNING":
        assert time.monotonic() < deadline, f"job {job} not running: {slurm.job_fields(job)}"
        time.sleep(0.2)
    return job


def test_a_node_outside_the_jobs_allocation_is_not_drained(slurm: SlurmCluster, tmp_path: Path) -> None:
    """The allocation from a real job (scontrol show job) and from SLURM_JOB_NODELIST: n3 is another job's."""
    job = _running_job(slurm, "n1,n2", tmp_path / "job.out")
    for i, env in enumerate(({"SLURM_JOB_ID": job}, {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": job})):
        a = adapter(slurm, **env)
        assert a.job_nodes() == ["n1", "n2"]
        policy = DrainPolicy(DrainSettings(scheduler="slurm", max_share=1.0, max_cluster_share=1.0), a,
                             tmp_path / f"run{i}", "12", "n1")
        record = policy.decide(Verdict("n3", "hardware", "Xid 79 GPU 0000:18:00 (Faulty GPU)", 1))
        assert record.status == "refused" and "not in the job's allocation (2 nodes)" in record.detail
        assert reasons(slurm) == {} and slurm.node_states()["n3"] == "idle"
    assert policy.decide(Verdict("n2", "hardware", "Xid 79", 1)).status == "drained"  # its own node: yes
    assert set(reasons(slurm)) == {"n2"}


def test_run_drain_flag_needs_a_scheduler(slurm: SlurmCluster, tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('hi')\n")
    outside = {k: v for k, v in slurm.env().items() if k != "SLURM_JOB_ID"}
    r = trainguard("run", "--drain-bad-nodes", "--run-dir", str(tmp_path / "r1"), str(script), env=outside,
                   timeout=60)
    assert_one_line_error(r, 2)
    assert "--drain-bad-nodes: no scheduler found" in r.err and not (tmp_path / "r1").exists()
    r = trainguard("run", "--drain-bad-nodes", "--drain-max-share", "2", "--run-dir", str(tmp_path / "r2"),
                   str(script), env=outside, timeout=60)
    assert_one_line_error(r, 2)
    assert "--drain-max-share must be a number from 0 to 1" in r.err
    # inside a Slurm job (scontrol on the PATH) auto finds Slurm
    assert open_adapter("auto", {**slurm.env(), "SLURM_JOB_ID": "5"}).name == "slurm"
