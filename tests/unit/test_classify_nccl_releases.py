"""Known-bad NCCL releases (docs/classify.md): the table, the version a line names, and the verdict a log gets when
it shows a failure under such a release. Lines are real ones from public threads and the dev half of the real
corpus (never its held-out half)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainguard.classify import classify_text, load_rules
from trainguard.classify.nccl_releases import (
    KnownBadRelease,
    known_bad_releases,
    load_table,
    match,
    nccl_settings,
    parse_version,
)
from trainguard.errors import InputError

REAL = Path(__file__).parent / "corpus" / "real"
RAS_EXCERPT = REAL / "nccl-ras-segfault-2277-nccl-1996.log"  # split = "dev"

# NCCL's INFO banner (an nccl-tests run pasted in a public issue; 2.29.2 is known to hang on ARM builds)
BANNER_2292 = "gpu-st-ml-2:49542:49542 [0] NCCL INFO NCCL version 2.29.2+cuda12.8"
# NVIDIA/nccl#1996's own words above its backtrace
RAS_VERSION = "* case 1 using H100, NCCL version 2.27.7 + cuda12.4"
# a rank's watchdog timeout (dev excerpt slow-rank-eval-lm-eval-harness-1404)
WATCHDOG = ("[E ProcessGroupNCCL.cpp:474] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, "
            "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1800000) ran for 1800668 milliseconds before "
            "timing out.")
# NCCL's settings line, as the same nccl-tests run prints it (the setting changed to the one a workaround names)
RAS_OFF = "gpu-st-ml-2:49542:49542 [0] NCCL INFO NCCL_RAS_ENABLE set by environment to 0."


def _with_version(version_line: str, *lines: str) -> str:
    return "\n".join([version_line, *lines])


def _version_of(line: str) -> tuple[int, int, int] | None:
    """What the built-in readings rule captures from ``line``, parsed."""
    rule = next(r for r in load_rules().rules if r.id == "reading-nccl-version")
    m = rule.pattern.search(line)
    return parse_version(m.group("version")) if m else None


# ---- the table ------------------------------------------------------------------------------------------------

def test_the_table_loads_with_sourced_entries() -> None:
    table = known_bad_releases()
    assert 8 <= len(table) <= 15
    assert len({e.id for e in table}) == len(table)
    for e in table:
        assert re.match(r"https://github\.com/[\w.-]+/[\w.-]+/(issues|releases/tag|pull)/", e.source), e.id
        assert e.source_kind and e.description and e.symptoms
        assert 0.4 <= e.confidence < 0.7, e.id  # below the explicit version rules and any hardware cause
        if e.fixed_in is not None:  # the fix comes after every affected release
            fixed = parse_version(e.fixed_in)
            assert fixed is not None and all(hi < fixed for _, hi in e.ranges), e.id


def test_every_required_string_is_a_keyword_of_the_context_rule() -> None:
    rule = next(r for r in load_rules().rules if r.id == "reading-nccl-context")
    for e in known_bad_releases():
        for needed in e.requires:
            assert any(k in needed for k in rule.keywords), (e.id, needed)
            assert rule.pattern.search(needed), (e.id, needed)


def test_no_entry_rests_on_a_held_out_thread() -> None:
    import tomllib
    with (REAL / "manifest.toml").open("rb") as f:
        held_out = {c["source"] for c in tomllib.load(f)["case"] if c["split"] == "heldout"}
    assert not {e.source for e in known_bad_releases()} & held_out


def test_a_bad_table_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "t.toml"
    bad.write_text('[[release]]\nid = "x"\nversions = ["2.27"]\nsymptoms = ["crash"]\ndescription = "d"\n'
                   'source = "https://example.org"\nsource_kind = "k"\nconfidence = 0.5\n')
    with pytest.raises(InputError, match="version must be written like"):
        load_table(bad)
    bad.write_text(bad.read_text().replace('"2.27"', '"2.27.7"').replace('"crash"', '"slow"'))
    with pytest.raises(InputError, match="symptoms"):
        load_table(bad)


# ---- versions from real lines -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("line", "version"), [
    (BANNER_2292, (2, 29, 2)),
    ("[default0]:tp4-dp2-inference-pods-0:78:78 [0] NCCL INFO NCCL version 2.27.3+cuda12.9", (2, 27, 3)),
    ("NCCL version 2.18.5+cuda12.2", (2, 18, 5)),  # dev excerpt nvls-invalid-argument-fabricmanager-nccl-976
    ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, "
     "remote process exited or there was a network error, NCCL version 2.21.5", (2, 21, 5)),
    ("NCCL version: (2, 27, 7)", (2, 27, 7)),  # torch.cuda.nccl.version() printed
    ("PyTorch build NCCL version: (2, 26, 2)", (2, 26, 2)),
    (RAS_VERSION, (2, 27, 7)),
    ("nvidia-nccl-cu11 2.20.5", (2, 20, 5)),  # pip list
    ("NCCL INFO NCCL git version stable dcf2a2fbe", None),
    ("/usr/local/cuda-10.0/targets/x86_64-linux/lib/libnccl.so.2(+0x3533c)[0x7f8eab35933c]", None),  # major only
])
def test_the_version_a_real_line_names(line: str, version: tuple[int, int, int] | None) -> None:
    assert _version_of(line) == version


def test_nccl_settings_lines_are_read() -> None:
    assert nccl_settings([RAS_OFF, "x NCCL INFO NCCL_BUFFSIZE set by environment to 8388608."]) == {
        "NCCL_RAS_ENABLE": "0", "NCCL_BUFFSIZE": "8388608"}


# ---- verdicts ---------------------------------------------------------------------------------------------------

def test_the_ras_segfault_excerpt_under_2277_names_the_defect_and_workaround() -> None:
    c = classify_text(_with_version(RAS_VERSION, RAS_EXCERPT.read_text()), "rank0.log")
    assert c.category == "Dependency", c.explanation
    assert "NCCL 2.27.7" in c.explanation and "RAS" in c.explanation
    assert "NCCL_RAS_ENABLE=0" in c.explanation
    assert "https://github.com/NVIDIA/nccl/issues/1996" in c.explanation
    assert c.evidence[0].rule == "known-bad-nccl" and c.evidence[0].line == 1
    segv = next(e for e in c.evidence if e.rule == "segfault")
    assert segv.explained_by == "rank0.log:1" and segv.category == "Software Bug"


def test_the_excerpt_alone_shows_no_version_and_gets_no_table_verdict() -> None:
    c = classify_text(RAS_EXCERPT.read_text(), "rank0.log")
    assert c.category == "Dependency"  # the crash inside libnccl.so, as before
    assert "has a known" not in c.explanation and not any(e.rule == "known-bad-nccl" for e in c.evidence)


def test_a_backtrace_inside_libnccl_alone_is_read_as_the_release_defect() -> None:
    frames = [line for line in RAS_EXCERPT.read_text().splitlines() if "libnccl.so" in line]
    c = classify_text(_with_version(RAS_VERSION, *frames), "r.log")
    assert c.category == "Dependency" and c.evidence[0].rule == "known-bad-nccl", c.explanation
    assert "NCCL_RAS_ENABLE=0" in c.explanation


def test_a_hang_under_2292_names_the_fix_and_the_condition() -> None:
    c = classify_text(_with_version(BANNER_2292, WATCHDOG), "r.log")
    assert c.category == "Dependency", c.explanation
    assert "NCCL 2.29.2" in c.explanation and "fixed in NCCL 2.29.3" in c.explanation
    assert "ARM" in c.explanation and "releases/tag/v2.29.3-1" in c.explanation
    assert c.evidence[1].rule == "nccl-watchdog-timeout" and c.evidence[1].explained_by == "r.log:1"


@pytest.mark.parametrize("text", [
    _with_version(BANNER_2292.replace("2.29.2", "2.29.3"), WATCHDOG),  # the fixed release
    _with_version(BANNER_2292.replace("2.29.2", "2.28.9"), WATCHDOG),  # a release with no entry
    _with_version(RAS_VERSION.replace("2.27.7", "2.27.6"), RAS_EXCERPT.read_text()),
])
def test_a_fixed_or_unaffected_release_gets_no_table_verdict(text: str) -> None:
    c = classify_text(text, "r.log")
    assert not any(e.rule == "known-bad-nccl" for e in c.evidence), c.explanation
    assert "known crash" not in c.explanation and "known hang" not in c.explanation


@pytest.mark.parametrize("text", [
    BANNER_2292,                                  # the version alone
    _with_version(RAS_VERSION, "NCCL INFO Init COMPLETE"),
    _with_version(BANNER_2292, RAS_EXCERPT.read_text()),  # 2.29.2's defect is a hang, the log shows a crash
    _with_version(RAS_VERSION, WATCHDOG),         # 2.27.7's defect is a crash, the log shows a hang
])
def test_a_known_bad_release_without_its_symptom_gets_no_table_verdict(text: str) -> None:
    c = classify_text(text, "r.log")
    assert not any(e.rule == "known-bad-nccl" for e in c.evidence), c.explanation


def test_the_setting_that_switches_ras_off_rules_the_ras_defect_out() -> None:
    c = classify_text(_with_version(RAS_VERSION, RAS_OFF, RAS_EXCERPT.read_text()), "r.log")
    assert not any(e.rule == "known-bad-nccl" for e in c.evidence), c.explanation


@pytest.mark.parametrize(("line", "named"), [
    ("CUDA_LAUNCH_BLOCKING=1 torchrun --nproc_per_node 8 train.py", True),
    ("RuntimeError: CUDA error: an illegal memory access was encountered\nFor debugging consider passing "
     "CUDA_LAUNCH_BLOCKING=1.", False),  # torch's advice, not the setting
    ("", False),
])
def test_a_required_condition_must_be_in_the_log(line: str, named: bool) -> None:
    c = classify_text("\n".join(["NCCL version: (2, 14, 3)", line, WATCHDOG]), "r.log")
    assert any(e.rule == "known-bad-nccl" for e in c.evidence) is named, c.explanation


# ---- precedence: a log whose own cause is something else keeps it ----------------------------------------------

def test_an_nvlink_xid_stays_the_cause_of_a_hang_under_a_known_bad_release() -> None:
    text = _with_version(BANNER_2292, (REAL / "nvlink-xid145-b200-nccl-2241.log").read_text(), WATCHDOG)
    c = classify_text(text, "r.log")
    assert c.category == "Faulty GPU", c.explanation


def test_out_of_memory_stays_the_cause_of_a_hang_under_a_known_bad_release() -> None:
    oom = next(line for line in (REAL / "oom-1gb-gpu-pytorch-examples-621.log").read_text().splitlines()
               if "CUDA out of memory" in line)
    c = classify_text(_with_version(BANNER_2292, oom, WATCHDOG), "r.log")
    assert c.category == "Software Bug", c.explanation


def test_out_of_memory_stays_the_cause_of_a_crash_under_a_known_bad_release() -> None:
    oom = next(line for line in (REAL / "oom-1gb-gpu-pytorch-examples-621.log").read_text().splitlines()
               if "CUDA out of memory" in line)
    c = classify_text(_with_version(RAS_VERSION, oom, RAS_EXCERPT.read_text()), "r.log")
    assert c.category == "Software Bug", c.explanation


def test_a_network_error_under_a_version_with_a_hang_entry_keeps_its_cause() -> None:
    # dev excerpt: NCCL 2.21.5 (work-FIFO hang entry) named in a remote-error line; no hang in the log
    c = classify_text((REAL / "ib-node-issues-nccl-2076.log").read_text(), "r.log")
    assert c.category == "Network Switch/Cable", c.explanation
    assert not any(e.rule == "known-bad-nccl" for e in c.evidence)


def test_match_prefers_the_more_confident_entry() -> None:
    a = KnownBadRelease("a", (((2, 1, 0), (2, 1, 9)),), ("hang",), "d", "https://x", "k", 0.5)
    b = KnownBadRelease("b", (((2, 1, 3), (2, 1, 3)),), ("hang",), "d", "https://x", "k", 0.6)
    assert match((2, 1, 3), {"hang"}, table=(a, b)) is b
    assert match((2, 1, 4), {"hang"}, table=(a, b)) is a
    assert match((2, 1, 4), {"crash"}, table=(a, b)) is None
