"""`trainguard diagnose`: exit codes, --json schema, rank maps, run directories, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.core.events import AttemptStarted, StepCompleted
from trainguard.core.rundir import RunDir
from trainguard.localize import diagnose_path
from trainguard.localize.synth import SynthConfig, write_dumps

TOP_KEYS = {"verdict", "process_group", "collective_seq", "op", "culprit_ranks", "culprit_hosts", "explanation",
            "problems", "warnings", "ranks_analyzed", "missing_ranks", "backend", "format_versions", "path",
            "seconds", "unreadable_ranks", "missing_records"}
PROBLEM_KEYS = {"verdict", "process_group", "process_group_desc", "group_ranks", "collective_seq", "op",
                "culprit_ranks", "culprit_hosts", "waiting_ranks", "consequence_ranks", "explanation",
                "confidence", "blocked_by", "evidence", "evidence_files", "missing_records"}


def test_healthy_exits_0_and_problem_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_dumps(SynthConfig(ranks=4, entries_per_rank=10), tmp_path / "ok")
    write_dumps(SynthConfig(ranks=4, entries_per_rank=10, fault="desync", culprit=2), tmp_path / "bad")
    assert main(["diagnose", str(tmp_path / "ok")]) == 0
    assert "verdict: healthy" in capsys.readouterr().out
    assert main(["diagnose", str(tmp_path / "bad")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("verdict: desync") and "culprit ranks: 2" in out


def test_json_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_dumps(SynthConfig(ranks=4, entries_per_rank=10, fault="hang", culprit=1), tmp_path)
    rank_map = tmp_path / "hosts.json"
    rank_map.write_text(json.dumps({"0": "a", "1": "b", "2": "a", "3": "b"}))
    assert main(["diagnose", str(tmp_path), "--json", "--rank-map", str(rank_map)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == TOP_KEYS
    assert doc["verdict"] == "hang" and doc["culprit_ranks"] == [1] and doc["culprit_hosts"] == ["b"]
    assert set(doc["problems"][0]) == PROBLEM_KEYS
    ev = doc["problems"][0]["evidence"][0]
    assert ev["rank"] == 1 and ev["frames"]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["diagnose", "{d}/missing"], 3, "no such file"),
        (["diagnose", "{d}/empty"], 3, "no flight-recorder dumps"),
        (["diagnose", "{d}/garbage"], 3, "no valid flight-recorder dump"),
        (["diagnose", "{d}/ok", "--rank-map", "{d}/garbage/x_0"], 3, "rank map is not JSON"),
        (["diagnose", "{d}/ok", "--rank-map", "{d}/list.json"], 3, "must be a JSON object"),
        (["diagnose", "{d}/ok", "--world-size", "-4"], 2, "--world-size"),
        (["diagnose"], 2, "required"),
    ],
)
def test_bad_input_one_line_and_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                          code: int, message: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "x_0").write_bytes(b"\x80\x02garbage")
    (tmp_path / "list.json").write_text("[1, 2]")
    write_dumps(SynthConfig(ranks=2, entries_per_rank=4), tmp_path / "ok")
    try:
        rc = main([a.format(d=tmp_path) for a in args])
    except SystemExit as exc:  # argparse usage errors leave through SystemExit
        rc = int(exc.code or 0)
    assert rc == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 or code == 2


def test_run_directory_gives_hosts_from_events(run_dir: RunDir) -> None:
    with run_dir.writer("rank-0") as w:
        w.write(AttemptStarted(time=1.0, host="n0", attempt=1, world_size=4))
        for r in range(3):  # rank 3 never logged a step: its host comes from nowhere
            w.write(StepCompleted(time=2.0, host=f"n{r}", attempt=1, rank=r, step=1, duration_seconds=1.0))
            w.write(StepCompleted(time=1.0, host="old", attempt=0, rank=r, step=1, duration_seconds=1.0))
    write_dumps(SynthConfig(ranks=4, entries_per_rank=10, fault="hang", culprit=2, backend="gloo"),
                run_dir.diagnostics_dir(1), prefix="fr_trace_rank_")
    (run_dir.diagnostics_dir(1) / "stacks_rank_2.txt").write_text("Thread main:\n  File train.py, in compute\n")
    for path in (run_dir.root, run_dir.diagnostics_dir(1)):
        rep = diagnose_path(path)
        assert rep.verdict == "hang" and rep.culprit_ranks == (2,) and rep.culprit_hosts == ("n2",)
        assert any("stacks_rank_2.txt" in f and "compute" in f for f in rep.problems[0].evidence_files)


def test_world_size_from_events_reveals_a_dead_last_rank(run_dir: RunDir) -> None:
    with run_dir.writer("agent-n0") as w:
        w.write(AttemptStarted(time=1.0, host="n0", attempt=0, world_size=4))
    write_dumps(SynthConfig(ranks=4, entries_per_rank=10, fault="crash", culprit=3, backend="gloo"),
                run_dir.diagnostics_dir(0), prefix="fr_trace_rank_")
    rep = diagnose_path(run_dir.root)
    assert rep.verdict == "crash" and rep.culprit_ranks == (3,)


def test_single_file_and_json_dumps(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=3, entries_per_rank=10, fault="mismatch", culprit=0), tmp_path, fmt="json")
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "mismatch" and rep.culprit_ranks == (0,)
    one = diagnose_path(tmp_path / "nccl_trace_rank_1.json")
    assert one.ranks_analyzed == (1,)


REAL = Path(__file__).parent / "corpus" / "real"


@pytest.mark.parametrize(("case", "says"), [
    # real logs of the corpus's development half (tests/unit/corpus/real/manifest.toml)
    ("desync-logdict-lightning-19106", ["Software Bug", "Detected mismatch between collectives on ranks"]),
    ("rank0-only-barrier-autocast-381", ["Software Bug", "rank-local work before a collective",
                                         "`Trainer.fit` stopped"]),
])
def test_without_dumps_the_text_logs_are_read(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str,
                                              says: list[str]) -> None:
    (tmp_path / f"{case}.log").write_bytes((REAL / f"{case}.log").read_bytes())
    assert main(["diagnose", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{tmp_path}: no flight-recorder dumps") and "from the text logs there" in out
    assert all(s in out for s in says), out
    assert main(["diagnose", str(tmp_path / f"{case}.log"), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"source", "path", "no_dumps", "classification"} and doc["source"] == "text-logs"
    assert doc["classification"]["category"] == "Software Bug" and "no rank in the file name" in doc["no_dumps"]


def test_without_dumps_or_a_cause_in_the_text_the_missing_dumps_are_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "rank-0.log").write_text("epoch 1 loss 2.3\nepoch 2 loss 2.1\n")
    assert main(["diagnose", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "no flight-recorder dumps" in err and "its text logs name no cause either" in err
    assert len(err.strip().splitlines()) == 1
