"""torchrun's launcher options under ``trainguard run``: same spellings, same meanings, on real gloo jobs.

Each test launches real ``trainguard run`` processes on 127.0.0.1 with tiny scripts from
``userscripts/`` that never import trainguard, and checks what a torchrun user would look at: the
workers' output (rank prefixes, which ranks and streams reach the console), their environment, the
log files, and the JSON result.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e._run_helpers import events, free_port, of_type
from tests.e2e.cli import Result, trainguard

pytestmark = pytest.mark.timeout(120)

SCRIPTS = Path(__file__).resolve().parent / "userscripts"
ALLREDUCE = str(SCRIPTS / "allreduce.py")
FLAKY = str(SCRIPTS / "flaky.py")
QUICK = ("--no-health-checks",)


def _out_lines(text: str) -> list[tuple[int, int, dict[str, str]]]:
    """(prefix rank, step, fields) of every ``[rank<r>]: out ...`` line on the console."""
    found = []
    for m in re.finditer(r"^\[rank(\d+)\]: out (.*)$", text, re.MULTILINE):
        fields = dict(kv.split("=", 1) for kv in m.group(2).split())
        found.append((int(m.group(1)), int(fields["step"]), fields))
    return found


def _ok(res: Result) -> None:
    assert res.code == 0, res.err[-3000:]
    # trainguard's own traceback would start a line; a worker's carries its rank prefix
    assert not re.search(r"^Traceback", res.err, re.MULTILINE)


@pytest.mark.parametrize("spelling", [
    ("--standalone", "--nproc-per-node", "2"),
    ("--nproc_per_node", "2"),
    ("--nproc_per_node=2",),
])
def test_standalone_and_nproc_spellings_run_every_rank(tmp_path: Path, spelling: tuple[str, ...]) -> None:
    # torchrun syntax: the script is the first positional argument, no "--" needed.
    res = trainguard("run", *spelling, *QUICK, "--run-dir", str(tmp_path / "run"), ALLREDUCE, "--steps", "2")
    _ok(res)
    lines = _out_lines(res.out + res.err)
    assert sorted((r, s) for r, s, _ in lines) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert all(f["rank"] == str(r) and f["world"] == "2" and f["sum"] == "3" for r, _, f in lines)


@pytest.mark.parametrize("value", ["cpu", "auto"])
def test_nproc_per_node_cpu_and_auto_mean_the_usable_cpus(tmp_path: Path, value: str) -> None:
    cpus = len(os.sched_getaffinity(0))
    if cpus > 4:
        pytest.skip(f"{cpus} usable CPUs: too many ranks for a quick test")
    res = trainguard("run", "--nproc-per-node", value, *QUICK, "--run-dir", str(tmp_path / "run"), "--json",
                     "--", ALLREDUCE, "--steps", "1")
    _ok(res)
    assert {f["world"] for _, _, f in _out_lines(res.out + res.err)} == {str(cpus)}
    assert json.loads(res.out)["status"] == "completed"


def test_rdzv_backend_endpoint_id_and_conf_reach_the_rendezvous(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    res = trainguard("run", "--rdzv-backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv-id", "job-42",
                     "--rdzv-conf", "join_timeout=30,last_call_timeout=1,close_timeout=5,read_timeout=20",
                     "--nproc-per-node", "2", *QUICK, "--run-dir", str(tmp_path / "run"), "--json",
                     ALLREDUCE, "--steps", "1")
    _ok(res)
    # TORCHELASTIC_RUN_ID of the workers
    assert {f["run_id"] for _, _, f in _out_lines(res.out + res.err)} == {"job-42"}
    config = of_type(events(tmp_path / "run", "agent-"), "run_started")[0]["config"]
    assert config["rdzv_backend"] == "c10d" and config["rdzv_endpoint"] == endpoint
    assert (config["join_timeout_seconds"], config["last_call_seconds"], config["rdzv_close_timeout_seconds"]) \
        == (30, 1, 5)
    assert config["rdzv_conf"] == [["read_timeout", "20"]]


def test_static_rendezvous_from_master_addr_port_and_node_rank_restarts(tmp_path: Path) -> None:
    # torchrun's classic spelling selects the static backend; a failed attempt restarts on it.
    res = trainguard("run", "--nnodes", "1", "--node_rank", "0", "--master_addr", "127.0.0.1",
                     "--master_port", str(free_port()), "--nproc_per_node", "2", "--max_restarts", "2",
                     *QUICK, "--run-dir", str(tmp_path / "run"), "--json", FLAKY, "--fail-attempts", "1")
    _ok(res)
    result = json.loads(res.out)
    assert result["attempts"] == 2 and [f["ranks"] for f in result["failures"]] == [[1]]
    assert "rendezvous static 127.0.0.1:" in res.err
    assert re.search(r"^\[rank1\]: flaky rank=1 attempt=1 ", res.err, re.MULTILINE)  # --json: on stderr


def test_module_and_no_python(tmp_path: Path) -> None:
    mod = trainguard("run", "--nproc-per-node", "2", *QUICK, "--run-dir", str(tmp_path / "m"), "-m", "pkg.job",
                     "--steps", "1", cwd=str(SCRIPTS))
    _ok(mod)
    assert re.search(r"^\[rank0\]: module-main argv0=.*pkg/job\.py$", mod.out, re.MULTILINE)
    assert len(_out_lines(mod.out)) == 2

    shell = trainguard("run", "--nproc-per-node", "2", "--no-python", *QUICK, "--run-dir", str(tmp_path / "s"),
                       "--", str(SCRIPTS / "job.sh"), "a", "b")
    _ok(shell)
    assert sorted(re.findall(r"^\[rank(\d)\]: shell rank=\1 world=2 args=a b$", shell.out, re.MULTILINE)) == ["0", "1"]


def test_log_dir_redirects_and_tee_keep_every_line_in_the_files(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    # -r 3: both streams of every rank off the console; -t 0:1: local rank 0's stdout shown anyway.
    res = trainguard("run", "--nproc-per-node", "2", "--log-dir", str(log_dir), "-r", "3", "--tee", "0:1",
                     "--rdzv-id", "logjob", *QUICK, "--run-dir", str(tmp_path / "run"), ALLREDUCE, "--steps", "2")
    _ok(res)
    assert sorted((r, s) for r, s, _ in _out_lines(res.out + res.err)) == [(0, 1), (0, 2)]
    assert "err rank=" not in res.out + res.err
    attempt = log_dir / "logjob" / "attempt-0"
    for rank in (0, 1):
        assert f"out rank={rank} step=2" in (attempt / f"rank-{rank}.stdout.log").read_text()
        assert f"err rank={rank} step=2" in (attempt / f"rank-{rank}.log").read_text()
    assert not (tmp_path / "run" / "logs" / "attempt-0").exists()


def test_local_ranks_filter_shows_only_those_ranks(tmp_path: Path) -> None:
    res = trainguard("run", "--nproc-per-node", "2", "--local_ranks_filter", "1", *QUICK,
                     "--run-dir", str(tmp_path / "run"), ALLREDUCE, "--steps", "2")
    _ok(res)
    assert {r for r, _, _ in _out_lines(res.out + res.err)} == {1}
    assert re.search(r"^\[rank1\]: err rank=1 step=2$", res.err, re.MULTILINE)
    assert "[rank0]" not in res.out + res.err
    logs = tmp_path / "run" / "logs" / "attempt-0"
    assert "out rank=0 step=2" in (logs / "rank-0.stdout.log").read_text()


def test_json_keeps_stdout_for_the_result_and_quiet_silences_the_console(tmp_path: Path) -> None:
    res = trainguard("run", "--nproc-per-node", "2", "--quiet", "--json", *QUICK, "--run-dir", str(tmp_path / "run"),
                     ALLREDUCE, "--steps", "1")
    _ok(res)
    assert json.loads(res.out)["status"] == "completed"  # nothing but the JSON on stdout
    assert "[rank" not in res.err and "trainguard:" not in res.err


def test_default_run_ids_differ_for_runs_started_in_the_same_second(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "trainguard", "run", *QUICK, "--json", "--quiet", ALLREDUCE, "--steps", "1"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=100) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    dirs = {json.loads(o)["run_dir"] for o, _ in outs}
    assert len(dirs) == 2
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(Path(d).name for d in dirs)


def test_signals_to_handle_reach_torch_for_the_run_only(tmp_path: Path) -> None:
    # torch's agent reads the list from its process environment; the workers inherit that environment,
    # so they show what the agent used. The CLI process itself is not changed for good (tests/unit).
    script = tmp_path / "show_signals.py"
    script.write_text("import os\nprint('signals', os.environ.get('TORCHELASTIC_SIGNALS_TO_HANDLE'), flush=True)\n")
    res = trainguard("run", "--signals-to-handle", "SIGUSR1, SIGTERM", *QUICK, "--run-dir", str(tmp_path / "run"),
                     str(script))
    _ok(res)
    assert re.search(r"^\[rank0\]: signals SIGUSR1,SIGTERM$", res.out + res.err, re.MULTILINE), res.err[-2000:]
    config = of_type(events(tmp_path / "run", "agent-"), "run_started")[0]["config"]
    assert config["signals_to_handle"] == "SIGUSR1, SIGTERM"
