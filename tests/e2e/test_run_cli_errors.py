"""Bad input to `trainguard run` and `trainguard demo`: one line on stderr, a documented exit code."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e._run_helpers import ROOT, TRAIN_GPT, trainguard
from tests.e2e.cli import assert_one_line_error
from tests.e2e.cli import trainguard as trainguard_in

GPT = str(TRAIN_GPT)
USER = str(ROOT / "tests" / "e2e" / "userscripts" / "allreduce.py")


@pytest.mark.parametrize(("args", "code", "words"), [
    (["run"], 2, "no training command"),
    (["run", "--"], 2, "no training command"),
    (["run", "--inject", "bogus@step=1", "--", GPT], 2, "unknown fault kind"),
    (["run", "--inject", "crash@step=abc", "--", GPT], 2, "step must be"),
    (["run", "--nnodes", "3:1", "--", GPT], 2, "--nnodes"),
    (["run", "--nnodes", "x", "--", GPT], 2, "--nnodes"),
    (["run", "--nnodes", "2", "--", GPT], 2, "--rdzv-endpoint is required"),
    (["run", "--nproc-per-node", "lots", GPT], 2, "--nproc-per-node"),
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


# Issue 11 and the torchrun options: every bad value is refused with one line and exit 2 before any
# folder exists (neither the default runs/<id> nor the --run-dir given).
@pytest.mark.parametrize(("args", "words"), [
    (["--node-id", "../../../../X"], "bad node id"),
    (["--node-id", "a/b"], "bad node id"),
    (["--rdzv-id", "../up"], "bad rendezvous id"),
    (["--rdzv-endpoint", "::::"], "--rdzv-endpoint must be HOST[:PORT]"),
    (["--rdzv-endpoint", "host:0"], "port must be a number from 1 to 65535"),
    (["--rdzv-endpoint", "host:http"], "port must be a number from 1 to 65535"),
    (["--rdzv-endpoint", "[::1"], "--rdzv-endpoint must be HOST[:PORT]"),
    (["--rdzv-backend", "etcd"], "--rdzv-backend 'etcd' is not supported"),
    (["--rdzv-conf", "nonsense"], "--rdzv-conf must be KEY=VALUE"),
    (["--rdzv-conf", "colour=red"], "unknown key 'colour'"),
    (["--rdzv-conf", "join_timeout=-5"], "join_timeout must be a whole number"),
    (["--rdzv-backend", "static", "--nnodes", "1:2"], "fixed node count"),
    (["--nnodes", "2", "--node-rank", "2", "--master-port", "29500"], "--node-rank must be below --nnodes"),
    (["--master-port", "70000"], "--master-port must be a whole number"),
    (["--standalone", "--nnodes", "2"], "--standalone runs one node"),
    (["--nproc-per-node", "gpu"], "CUDA is not available"),
    (["--nproc_per_node", "-1"], "--nproc-per-node"),
    (["--redirects", "7"], "--redirects must be"),
    (["--tee", "0:3,1"], "--tee must be"),
    (["--local-ranks-filter", "0,x"], "--local-ranks-filter"),
    (["--monitor-interval", "0"], "--monitor-interval"),
    (["--stop-grace", "-1"], "--stop-grace"),
    (["--module", "--no-python"], "cannot be used together"),
    (["--numa-binding", "node"], "--numa-binding is not supported"),
    (["--run-path"], "--run-path"),
    (["--event-log-handler", "console"], "--event-log-handler"),
    (["--signals-to-handle", "SIGNOPE"], "unknown signal"),
    (["--inject", "crash@step=1,rank=x"], "--inject"),
    # Checked by SupervisorConfig/WatchdogConfig themselves; the CLI rewords the field as the flag.
    (["--hang-multiplier", "0"], "--hang-multiplier must be a positive number"),
    (["--first-step-allowance", "nan"], "--first-step-allowance must be a positive number"),
    (["--checkpoint-allowance", "-5"], "--checkpoint-allowance must be a positive number"),
    (["--node-lost-timeout", "1"], "--node-lost-timeout must be a number from 2 to 3600"),
    (["--no-progress-attempts", "-1"], "--no-progress-attempts must be a whole number from 1 to 10000"),
    (["--max-restarts", "10001"], "--max-restarts must be a whole number from 0 to 10000"),
    (["--rdzv-last-call", "0"], "--rdzv-last-call must be a whole number from 1 to 86400"),
    (["--nproc-per-node", "2", "--inject", "hang@step=3,rank=2"], "rank 2 does not exist"),
])
def test_bad_torchrun_style_values_create_nothing(args: list[str], words: str, tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    given = tmp_path / "given-run-dir"
    for extra in ([], ["--run-dir", str(given)]):
        res = trainguard_in("run", *args, *extra, USER, "--steps", "1", cwd=str(cwd), timeout=60)
        assert_one_line_error(res, 2)
        assert words in res.err
        assert res.out == ""
        assert list(cwd.iterdir()) == [] and not given.exists()


def test_missing_script_module_or_program_is_an_input_error_and_creates_nothing(tmp_path: Path) -> None:
    for args in (["/no/such/train.py"], ["--no-python", "no-such-program-xyz"], ["--no-python", "/no/such/prog"]):
        res = trainguard_in("run", *args, cwd=str(tmp_path), timeout=60)
        assert_one_line_error(res, 3)
        assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("name", "value", "words"), [
    ("TRAINGUARD_JOB_SECRET", "0123456789abcdef\udcff\udcfe", "TRAINGUARD_JOB_SECRET is not valid UTF-8"),
    ("TRAINGUARD_NODE", "node-\udcff", "TRAINGUARD_NODE is not valid UTF-8"),
    ("TRAINGUARD_JOB_SECRET", "0123456789 abcdef", "without spaces"),
    ("TRAINGUARD_JOB_SECRET", "short", "16 to 1024 characters"),
])
def test_a_bad_trainguard_variable_is_one_line_and_exit_2_before_the_run_folder(
        tmp_path: Path, name: str, value: str, words: str) -> None:
    # A str with surrogates reaches the child as the raw bytes (os.fsencode): 0xff 0xfe, not UTF-8.
    run_dir = tmp_path / "run"
    res = trainguard("run", "--standalone", "--run-dir", str(run_dir), "--", GPT, env={name: value}, timeout=60)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], res.stderr
    assert not run_dir.exists()
