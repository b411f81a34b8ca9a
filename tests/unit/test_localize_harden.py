"""`trainguard diagnose` on hostile or damaged input: unreadable ranks, memory bounds, wrong types, links."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from trainguard.cli import main
from trainguard.localize import diagnose_path
from trainguard.localize.reader import MAX_ENTRIES, MAX_RANK, safe_unpickle
from trainguard.localize.synth import SynthConfig, rank_dump, write_dumps


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["diagnose", *args])
    out, err = capsys.readouterr()
    return rc, out, err


# --- 1. an unreadable rank is unknown, never evidence of health --------------------------------------

@pytest.mark.parametrize("backend", ["nccl", "gloo"])
@pytest.mark.parametrize("damage", ["truncated", "malicious"])
def test_unreadable_culprit_is_not_healthy(tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str,
                                           damage: str) -> None:
    write_dumps(SynthConfig(ranks=4, entries_per_rank=10, fault="hang", culprit=2, backend=backend), tmp_path)
    culprit = tmp_path / "nccl_trace_rank_2"
    if damage == "truncated":
        culprit.write_bytes(culprit.read_bytes()[:100])
    else:
        culprit.write_bytes(b"\x80\x02cos\nsystem\n(S'touch /tmp/never'\ntR.")
    rc, out, err = _cli([str(tmp_path), "--json"], capsys)
    doc = json.loads(out)
    assert rc == 1 and "Traceback" not in err
    assert doc["verdict"] == "incomplete"
    assert doc["unreadable_ranks"] == [2] and doc["culprit_ranks"] == [2]
    assert "2" in doc["explanation"] and "could not be read" in doc["explanation"]
    rc, out, _ = _cli([str(tmp_path)], capsys)
    assert rc == 1 and out.startswith("verdict: incomplete") and "unreadable ranks: 2" in out


def test_unreadable_rank_without_waiters_is_still_incomplete(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    write_dumps(SynthConfig(ranks=4, entries_per_rank=10), tmp_path)
    (tmp_path / "nccl_trace_rank_3").write_bytes(b"\x80\x02}q\x00")  # truncated
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "incomplete" and rep.unreadable_ranks == (3,) and rep.culprit_ranks == (3,)
    rc, _, _ = _cli([str(tmp_path)], capsys)
    assert rc == 1


def test_readable_culprit_keeps_its_verdict_and_names_unreadable_ranks(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=4, entries_per_rank=10, fault="hang", culprit=3), tmp_path)
    (tmp_path / "nccl_trace_rank_1").write_bytes(b"junk")
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "hang" and rep.culprit_ranks == (3,) and rep.unreadable_ranks == (1,)
    assert rep.to_json()["unreadable_ranks"] == [1]


# --- 2. memory is bounded by the data present ----------------------------------------------------------

def _peak_rss_growth_mb(directory: Path) -> tuple[float, int]:
    """Peak RSS growth (MB) of a fresh process running the diagnose CLI on ``directory``, and its exit code."""
    code = textwrap.dedent(f"""
        import resource, sys
        from trainguard.cli import main
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rc = main(["diagnose", {str(directory)!r}, "--json"])
        grow = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
        print("RESULT", grow / 1024, rc, file=sys.stderr)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr
    line = [ln for ln in out.stderr.splitlines() if ln.startswith("RESULT")][-1]
    _, mb, rc = line.split()
    return float(mb), int(rc)


def test_absurd_rank_in_file_name_is_refused_without_allocating(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=2, entries_per_rank=5), tmp_path, prefix="fr_trace_rank_")
    (tmp_path / "fr_trace_rank_1").rename(tmp_path / "fr_trace_rank_200000000")
    mb, rc = _peak_rss_growth_mb(tmp_path)
    assert mb < 100 and rc in (0, 1)
    rep = diagnose_path(tmp_path)
    assert any("200000000" in w.file and f"above {MAX_RANK}" in w.message for w in rep.warnings)
    assert rep.ranks_analyzed == (0,)


def test_huge_world_claimed_by_a_dump_stays_small(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=2, entries_per_rank=5), tmp_path)
    raw = rank_dump(SynthConfig(ranks=2, entries_per_rank=5), 1)
    assert raw is not None
    raw["pg_config"]["0"]["ranks"] = "[" + ", ".join(str(r) for r in range(2_000_000)) + "]"
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps(raw, protocol=2))
    mb, rc = _peak_rss_growth_mb(tmp_path)
    assert mb < 300 and rc in (0, 1, 3)


def test_ten_million_references_to_one_entry(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=2, entries_per_rank=5, fault="hang", culprit=0), tmp_path)
    raw = rank_dump(SynthConfig(ranks=2, entries_per_rank=5, fault="hang", culprit=0), 1)
    assert raw is not None
    entry = raw["entries"][-1]
    raw["entries"] = [entry] * 10_000_000  # the pickler writes one entry and 10M memo references
    data = pickle.dumps(raw, protocol=2)
    assert len(data) < 30_000_000
    (tmp_path / "nccl_trace_rank_1").write_bytes(data)
    mb, rc = _peak_rss_growth_mb(tmp_path)
    assert mb < 400 and rc in (1, 3)
    rep = diagnose_path(tmp_path)
    assert any(f"only the newest {MAX_ENTRIES}" in w.message for w in rep.warnings)


def test_memo_index_that_would_allocate_gigabytes_is_refused() -> None:
    # 9 bytes asking the unpickler to size its memo for 100 million objects (1.6 GB)
    from trainguard.localize import DumpError

    with pytest.raises(DumpError, match="memo"):
        safe_unpickle(b"\x80\x02N" + b"r" + (100_000_000).to_bytes(4, "little") + b".")


def test_many_small_containers_are_refused_before_unpickling() -> None:
    from trainguard.localize import DumpError

    data = b"\x80\x02]" + b"}" * 20_000_000 + b"."  # 20 MB, 20 million dicts left on the stack
    with pytest.raises(DumpError, match="objects"):
        safe_unpickle(data)


# --- 3. wrong-typed fields: exit 3 or an unreadable rank, never 70 --------------------------------------

_DEEP = "__DEEP__"
"""Stands for a list nested 100,000 deep: pickle cannot write one, so `_dumps` splices its opcodes in."""


def _dumps(obj: Any) -> bytes:
    """A protocol-2 pickle of ``obj`` in which every `_DEEP` string is a list nested 100,000 deep."""
    deep = b"]" * 100_000 + b"a" * 99_999  # push the lists, then append each into the one below it
    return pickle.dumps(obj, protocol=2).replace(b"X\x08\x00\x00\x00" + _DEEP.encode(), deep)

_BAD_VALUES: list[tuple[str, Any]] = [
    ("collective_seq_id", "12"), ("collective_seq_id", 10**5000), ("collective_seq_id", [1]),
    ("profiling_name", ["gloo:all_reduce"]), ("profiling_name", 7), ("input_sizes", {"a": 1}),
    ("input_sizes", _DEEP), ("input_sizes", [[10**400]]), ("process_group", [["0"], "x"]),
    ("process_group", {"0": 1}), ("frames", [{"name": 10**5000, "filename": [], "line": "x"}]),
    ("frames", _DEEP), ("time_created_ns", 10**5000), ("pg_id", [0]), ("record_id", 2.5),
    ("state", ["started"]), ("input_dtypes", _DEEP), ("retired", "yes"),
]


@pytest.mark.parametrize(("field", "value"), _BAD_VALUES, ids=[f"{f}-{i}" for i, (f, _) in enumerate(_BAD_VALUES)])
def test_wrong_typed_entry_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str,
                                  value: Any) -> None:
    cfg = SynthConfig(ranks=3, entries_per_rank=6, fault="hang", culprit=2)
    write_dumps(cfg, tmp_path)
    for rank in (0, 1):
        raw = rank_dump(cfg, rank)
        assert raw is not None
        for e in raw["entries"]:
            e[field] = value
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(_dumps(raw))
    rc, out, err = _cli([str(tmp_path), "--json"], capsys)
    assert rc in (1, 3), err
    assert "Traceback" not in err and "internal error" not in err
    if rc == 1:
        doc = json.loads(out)
        assert doc["verdict"] != "healthy"
    # alone, the bad dump is an input error naming the file and the field
    rc, _, err = _cli([str(tmp_path / "nccl_trace_rank_0")], capsys)
    assert rc == 3 and "nccl_trace_rank_0" in err, err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("top", [
    {"version": "2.10", "entries": [], "pg_status": {"0": {"last_enqueued_collective": float("inf")}}},
    {"version": "2.10", "entries": [], "pg_status": {10**5000: {"x": 1}}},
    {"version": 10**5000, "entries": []},
    {"version": _DEEP, "entries": []},
    {"version": "2.10", "entries": [], "pg_config": {"0": {"name": _DEEP, "desc": 10**5000, "ranks": _DEEP}}},
    {"version": "2.10", "entries": [], "pg_config": {"0": {"ranks": "[" + "1," * 10 + "]"}}},
    {"version": "2.10", "entries": [], "pg_config": {"0": {"ranks": [10**40]}}},
])
def test_wrong_typed_top_level_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str], top: Any) -> None:
    (tmp_path / "fr_trace_rank_0").write_bytes(_dumps(top))
    rc, _, err = _cli([str(tmp_path)], capsys)
    assert rc in (0, 1, 3) and "Traceback" not in err and "internal error" not in err


def test_deep_json_dump_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "fr_trace_rank_0.json").write_text('{"entries": ' + "[" * 200_000 + "]" * 200_000 + "}")
    (tmp_path / "fr_trace_rank_1.json").write_text('{"version": "2.10", "entries": [' + "9" * 6000 + "]}")
    rc, _, err = _cli([str(tmp_path)], capsys)
    assert rc == 3 and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("proto", [0, 2, 4])
def test_restricted_unpickler_still_refuses_code(tmp_path: Path, proto: int) -> None:
    from trainguard.localize import DumpError

    marker = tmp_path / "pwned"

    class _Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    for obj in (_Boom(), {"version": "2.10", "entries": [_Boom()]}, [print], {"x": (eval, ("1",))}):
        with pytest.raises(DumpError, match="refused"):
            safe_unpickle(pickle.dumps(obj, protocol=proto))
    assert not marker.exists()


# --- 4. evidence files are never followed through links; FIFOs never block ---------------------------------

def test_symlinked_stacks_file_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-LINE\n")
    d = tmp_path / "dumps"
    write_dumps(SynthConfig(ranks=3, entries_per_rank=10, fault="hang", culprit=1), d)
    (d / "stacks_rank_1.txt").symlink_to(secret)
    rep = diagnose_path(d)
    assert rep.verdict == "hang"
    files = rep.problems[0].evidence_files
    assert files and all("TOP-SECRET" not in f for f in files)
    assert any("symbolic link" in f for f in files)


def test_symlinked_dump_is_refused_and_counted_unreadable(tmp_path: Path) -> None:
    d = tmp_path / "dumps"
    write_dumps(SynthConfig(ranks=3, entries_per_rank=10), d)
    other = tmp_path / "elsewhere"
    (d / "nccl_trace_rank_2").rename(other)
    (d / "nccl_trace_rank_2").symlink_to(other)
    rep = diagnose_path(d)
    assert rep.unreadable_ranks == (2,) and rep.verdict == "incomplete"
    assert any("symbolic link" in w.message for w in rep.warnings)


def test_fifo_named_like_a_dump_does_not_hang(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=3, entries_per_rank=10), tmp_path)
    (tmp_path / "nccl_trace_rank_2").unlink()
    os.mkfifo(tmp_path / "nccl_trace_rank_2")
    os.mkfifo(tmp_path / "stacks_rank_2.txt")
    code = f"from trainguard.localize import diagnose_path; print(diagnose_path({str(tmp_path)!r}).verdict)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "incomplete", out.stderr
    rep = diagnose_path(tmp_path)
    assert any("not a regular file" in w.message for w in rep.warnings)


# --- 5. the memory cap that replaced the opcode walk ----------------------------------------------------


@pytest.fixture(params=["cap", "walk"])
def guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with the RLIMIT_DATA cap (where the kernel enforces it) and with the opcode walk that
    replaces it elsewhere."""
    from trainguard.localize import unpickle

    if request.param == "cap" and not unpickle._cap_enforced():
        pytest.skip("RLIMIT_DATA is not enforced here")
    monkeypatch.setattr(unpickle, "_cap_state", [request.param == "cap"])
    return str(request.param)


@pytest.mark.parametrize("attack", [
    b"\x80\x02N" + b"r" + (2**27).to_bytes(4, "little") + b".",  # LONG_BINPUT: a 2 GB memo
    b"\x80\x02N" + b"r" + (2**32 - 1).to_bytes(4, "little") + b".",  # 64 GB
    b"Np100000000\n.",  # protocol 0 PUT, decimal index
    b"\x80\x02]" + b"N" * 10 + b"r" + (2**26).to_bytes(4, "little") + b".",  # after other opcodes
])
def test_memo_attacks_are_refused_either_way(guard: str, attack: bytes) -> None:
    from trainguard.localize import DumpError

    with pytest.raises(DumpError, match="memo"):
        safe_unpickle(attack)


def test_real_dumps_decode_the_same_either_way(guard: str) -> None:
    raw = rank_dump(SynthConfig(ranks=4, entries_per_rank=50, tp=2, fault="hang", culprit=1), 2)
    for proto in (0, 2, 4, 5):
        assert safe_unpickle(pickle.dumps(raw, protocol=proto)) == raw


def test_the_cap_is_lifted_after_each_decode() -> None:
    from trainguard.localize import DumpError, unpickle

    resource = pytest.importorskip("resource")
    if not unpickle._cap_enforced():
        pytest.skip("RLIMIT_DATA is not enforced here")
    before = resource.getrlimit(resource.RLIMIT_DATA)
    safe_unpickle(pickle.dumps({"a": [1, 2]}, protocol=2))
    with pytest.raises(DumpError):
        safe_unpickle(b"\x80\x02N" + b"r" + (2**27).to_bytes(4, "little") + b".")
    with pytest.raises(DumpError):
        safe_unpickle(b"\x80\x02}}}")  # truncated
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    bytearray(256 * 1024**2)  # the process may allocate freely again


def test_memo_attack_in_a_directory_allocates_nothing(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=3, entries_per_rank=10, fault="hang", culprit=2), tmp_path)
    (tmp_path / "nccl_trace_rank_1").write_bytes(b"\x80\x02N" + b"r" + (2**27).to_bytes(4, "little") + b".")
    mb, rc = _peak_rss_growth_mb(tmp_path)
    assert mb < 100 and rc == 1
    rep = diagnose_path(tmp_path)
    assert rep.unreadable_ranks == (1,) and any("memo" in w.message for w in rep.warnings)
