"""Reading dumps: the restricted unpickler, JSON, format versions, and bad files."""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

import pytest

from trainguard.errors import InputError
from trainguard.localize import DumpError, diagnose_path, read_dump, safe_unpickle
from trainguard.localize.reader import find_dump_files, rank_from_name
from trainguard.localize.synth import SynthConfig, rank_dump, to_json_form, write_dumps


class _RunsShell:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


class _WritesFile:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("payload", [_RunsShell, _WritesFile])
def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path: Path, payload: type) -> None:
    marker = tmp_path / "pwned"
    data = pickle.dumps({"version": "2.10", "entries": [payload(marker)]}, protocol=2)
    with pytest.raises(DumpError, match="refused"):
        safe_unpickle(data)
    assert not marker.exists()
    # in a directory: reported per file, the other ranks still analysed
    d = tmp_path / "dumps"
    write_dumps(SynthConfig(ranks=3, entries_per_rank=10), d)
    (d / "nccl_trace_rank_1").write_bytes(data)
    rep = diagnose_path(d)
    assert not marker.exists()
    assert any(w.file == "nccl_trace_rank_1" and "refused" in w.message for w in rep.warnings)
    assert rep.ranks_analyzed == (0, 2)


def test_only_malicious_input_is_an_input_error(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "fr_trace_rank_0.pkl").write_bytes(pickle.dumps(_RunsShell(marker)))
    with pytest.raises(InputError, match="no valid flight-recorder dump"):
        diagnose_path(tmp_path)
    assert not marker.exists()


def test_restricted_unpickler_reads_plain_data() -> None:
    obj = {"a": [1, 2.5, None, True], "b": ("x", "y"), "c": {"d": -3}}
    assert safe_unpickle(pickle.dumps(obj, protocol=2)) == obj
    assert safe_unpickle(pickle.dumps({**obj, "e": b"raw"}, protocol=5)) == {**obj, "e": b"raw"}
    # protocol 2 spells bytes as a call to _codecs.encode: refused like every other global
    with pytest.raises(DumpError, match=r"_codecs\.encode"):
        safe_unpickle(pickle.dumps(b"raw", protocol=2))


def test_analysis_does_not_import_torch(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=2, entries_per_rank=5), tmp_path)
    code = ("import sys; from trainguard.localize import diagnose_path; "
            f"diagnose_path({str(tmp_path)!r}); print('torch' in sys.modules)")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("name", "rank"),
    [("nccl_trace_rank_12", 12), ("fr_trace_rank_3.pkl", 3), ("trace_7.json", 7), ("x0.pickle", 0),
     ("stacks_rank_3.txt", None), ("log_tail_rank_2.txt", None), ("verdict.json", None), ("notes", None),
     (".fr_trace_rank_3.pkl.tmp", None), ("fr_trace_rank_3.pkl.tmp", None)],
)
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert rank_from_name(name) == rank


def test_json_form_is_normalised(tmp_path: Path) -> None:
    cfg = SynthConfig(ranks=2, entries_per_rank=4, fault="hang", culprit=1)
    raw = rank_dump(cfg, 0)
    assert raw is not None
    p = tmp_path / "fr_trace_rank_0.json"
    p.write_text(json.dumps(to_json_form(raw)))
    d = read_dump(p)
    assert d.fmt.json_form and d.rank == 0
    assert d.pg_status["0"]["last_enqueued_collective"] == raw["pg_status"]["0"]["last_enqueued_collective"]
    assert all("frames" not in e for e in d.entries)


def test_pickle_preferred_over_json_twin_and_unrelated_numbered_files(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=2, entries_per_rank=4), tmp_path, prefix="fr_trace_rank_", fmt="json")
    write_dumps(SynthConfig(ranks=2, entries_per_rank=4), tmp_path, prefix="fr_trace_rank_")
    (tmp_path / "done_0").write_text("ok")
    files = find_dump_files(tmp_path)
    assert files[0][0].name == "fr_trace_rank_0"
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "healthy" and rep.ranks_analyzed == (0, 1)


@pytest.mark.parametrize("version", ["1.0", "2.2", "2.4", "2.7", "2.10"])
def test_every_format_version_gives_the_same_verdict(tmp_path: Path, version: str) -> None:
    write_dumps(SynthConfig(ranks=4, entries_per_rank=30, fault="mismatch", culprit=2, version=version), tmp_path)
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "mismatch" and rep.culprit_ranks == (2,)
    assert rep.format_versions == (version,)
    assert not rep.warnings or version == "1.0"


def test_newer_format_is_analysed_with_a_warning(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=3, entries_per_rank=10, fault="hang", culprit=0, version="3.1"), tmp_path)
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "hang" and rep.culprit_ranks == (0,)
    assert any("newer than the newest known" in w.message for w in rep.warnings)


def test_bad_files_are_reported_per_file_and_the_rest_analysed(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=6, entries_per_rank=20, fault="hang", culprit=5), tmp_path)
    full = (tmp_path / "nccl_trace_rank_1").read_bytes()
    (tmp_path / "nccl_trace_rank_1").write_bytes(full[: len(full) // 2])  # truncated
    (tmp_path / "nccl_trace_rank_2").write_bytes(b"\x00garbage\xff" * 10)  # not a dump
    (tmp_path / "nccl_trace_rank_3").write_bytes(pickle.dumps([1, 2, 3]))  # a pickle, not a dump
    (tmp_path / "nccl_trace_rank_4").write_bytes(b"")  # empty
    rep = diagnose_path(tmp_path)
    msgs = {w.file: w.message for w in rep.warnings}
    assert "truncated" in msgs["nccl_trace_rank_1"]
    assert "not a flight-recorder dump" in msgs["nccl_trace_rank_2"]
    assert "not a flight-recorder dump" in msgs["nccl_trace_rank_3"]
    assert "empty" in msgs["nccl_trace_rank_4"]
    assert rep.ranks_analyzed == (0, 5)
    # unreadable ranks are never blamed: their state is unknown
    assert rep.verdict == "hang" and rep.culprit_ranks == (5,)
    assert "unreadable" in rep.explanation


def test_mixed_versions_warn_and_still_analyse(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=4, entries_per_rank=20, fault="desync", culprit=3), tmp_path)
    old = rank_dump(SynthConfig(ranks=4, entries_per_rank=20, fault="desync", culprit=3, version="2.4"), 1)
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps(old, protocol=2))
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "desync" and rep.culprit_ranks == (3,)
    assert any("mixed torch versions" in w.message and w.file == "nccl_trace_rank_1" for w in rep.warnings)


def test_empty_dir_and_missing_path_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no flight-recorder dumps"):
        diagnose_path(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        diagnose_path(tmp_path / "nope")
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(InputError):
        diagnose_path(tmp_path)


def test_entries_that_are_not_dicts_are_skipped(tmp_path: Path) -> None:
    write_dumps(SynthConfig(ranks=3, entries_per_rank=10, fault="hang", culprit=2), tmp_path)
    raw = rank_dump(SynthConfig(ranks=3, entries_per_rank=10, fault="hang", culprit=2), 1)
    assert raw is not None
    raw["entries"] = ["junk", 7, *raw["entries"]]
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps(raw, protocol=2))
    rep = diagnose_path(tmp_path)
    assert rep.verdict == "hang" and rep.culprit_ranks == (2,)


def test_group_configs_normalise_on_lookup() -> None:
    from trainguard.localize.reader import GroupConfigs

    cfg = GroupConfigs({"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}, 3: {"name": 3, "ranks": [2]},
                        "junk": 7, (1,): {"name": "x"}})
    assert cfg["0"] == {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}
    assert cfg.get("3") == {"name": "3", "ranks": [2]}  # numbered groups (old dumps) found by name
    assert "junk" not in cfg and cfg.get("nope") is None and sorted(cfg) == ["0", "3"]
    assert bool(cfg) and not GroupConfigs({"junk": 7}) and not GroupConfigs(None)
