"""The classifier's behaviour: precedence, verdicts, unknown input, user rules, streaming, bad input."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pytest

from trainguard.classify import classify_paths, classify_text, load_rules
from trainguard.classify.scan import MAX_LINE_BYTES
from trainguard.errors import InputError

XID79 = ("Nov 30 08:00:01 node-17 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=0, name=python, "
         "GPU has fallen off the bus.")
WATCHDOG = ("[rank1]:[E1130 07:41:02.118 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=4411, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600032 milliseconds "
            "before timing out.")
TRACEBACK = "Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\nKeyError: 'lr'"


def test_hardware_outranks_its_software_consequences() -> None:
    text = "\n".join([TRACEBACK, WATCHDOG, XID79])
    c = classify_text(text, "mixed.log")
    assert (c.category, c.group) == ("Faulty GPU", "GPU")
    assert c.evidence[0].line == 5 and c.evidence[0].rule == "xid-79"
    assert (c.host, c.gpu) == ("node-17", "0000:3b:00")
    assert {a for a, _ in c.alternatives} == {"Software Bug", "NCCL Watchdog Timeouts"}


def test_software_bug_outranks_the_watchdog_timeout_it_causes() -> None:
    c = classify_text(WATCHDOG + "\n" + TRACEBACK, "x")
    assert c.category == "Software Bug"
    assert c.evidence[0].text == "KeyError: 'lr'"


def test_weak_hardware_signal_does_not_outrank_a_strong_software_one() -> None:
    weak = "pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0"
    c = classify_text(weak + "\nModuleNotFoundError: No module named 'apex'", "x")
    assert c.category == "Dependency"
    c = classify_text(weak, "x")
    assert c.category == "IO Expansion Board" and c.confidence < 0.5


def test_application_xid_is_software_unless_hardware_evidence() -> None:
    xid13 = "NVRM: Xid (PCI:0000:1b:00): 13, pid=9, name=python, Graphics SM Warp Exception"
    assert classify_text(xid13, "x").category == "Software Bug"
    both = xid13 + "\nNVRM: Xid (PCI:0000:1b:00): 64, pid=0, Row Remapper Error: Failed to remap row"
    assert classify_text(both, "x").category == "GPU HBM3 Memory"


def test_xid48_qualifiers_pick_hbm_or_sram() -> None:
    base = "NVRM: Xid (PCI:0000:4c:00): 48, pid=1, name=python, Ch 00000008, {}"
    assert classify_text(base.format("DRAM ECC error: 171 (DBE)"), "x").category == "GPU HBM3 Memory"
    assert classify_text(base.format("SRAM ECC error: 172 (DBE)"), "x").category == "GPU SRAM Memory"
    assert classify_text(base.format("An uncorrectable double bit error"), "x").category == "GPU HBM3 Memory"


def test_hang_verdict_without_hardware_is_a_watchdog_timeout_of_unknown_cause() -> None:
    c = classify_text("step 10 loss 2.1\nstep 11 loss 2.0", "tail.txt", verdict="hang")
    assert (c.category, c.group) == ("NCCL Watchdog Timeouts", "Unknown")
    assert 0.4 <= c.confidence <= 0.6
    assert c.evidence == () and c.verdict == "hang"
    c = classify_text(XID79, "x", verdict="hang")
    assert c.category == "Faulty GPU"
    assert classify_text("step 1", "x", verdict="desync").category == "Software Bug"


def test_unknown_input_is_unknown_with_partial_evidence_and_low_confidence() -> None:
    c = classify_text("all good\nnothing here", "x")
    assert (c.category, c.group, c.confidence, c.evidence) == ("Unknown", "Unknown", 0.0, ())
    c = classify_text("step 3\nE1130 api.py:874] failed (exitcode: -9) local_rank: 2", "x")
    assert c.category == "Unknown" and 0 < c.confidence <= 0.2
    assert c.evidence[0].line == 2
    c = classify_text("NVRM: Xid (PCI:0000:e1:00): 4242, pid=0, Reserved", "x")
    assert c.category == "Unknown" and c.xids == {4242: 1} and c.gpu == "0000:e1:00"


def test_user_rules_extend_and_override(tmp_path: Path) -> None:
    extra = tmp_path / "site.toml"
    extra.write_text(
        '[[rule]]\nid = "site-psu"\ncategory = "Power Supply"\nconfidence = 0.9\n'
        "keywords = [\"PDU\"]\npattern = 'PDU \\d+ breaker tripped'\n"
        '[[rule]]\nid = "python-exception"\ncategory = "Software Bug"\nconfidence = 0.2\n'
        "pattern = '^NeverMatches$'\n"
        '[[xid]]\ncodes = [13]\ncategory = "Faulty GPU"\nconfidence = 0.9\n'
    )
    rules = load_rules(extra)
    c = classify_text("rack 7: PDU 3 breaker tripped", "x", rules=rules)
    assert c.category == "Power Supply" and c.evidence[0].rule == "site-psu"
    assert classify_text(TRACEBACK, "x", rules=rules).category == "Unknown"
    assert classify_text("NVRM: Xid (PCI:0000:1b:00): 13, pid=9", "x", rules=rules).category == "Faulty GPU"
    assert classify_text(TRACEBACK, "x").category == "Software Bug"  # built-ins untouched


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[[rule]\n", "not a valid TOML"),
        ('[[rule]]\nid = "a"\ncategory = "Flux Capacitor"\nconfidence = 0.5\npattern = "x"\n', "unknown category"),
        ('[[rule]]\nid = "a"\ncategory = "CPU"\nconfidence = 0.5\npattern = "(x"\n', "bad regular expression"),
        ('[[rule]]\nid = "a"\ncategory = "CPU"\nconfidence = 5\npattern = "x"\n', "confidence"),
        ('[[rule]]\ncategory = "CPU"\nconfidence = 0.5\npattern = "x"\n', "needs an id"),
        ("[[rule]]\nid = 'a'\ncategory = 'CPU'\nconfidence = 0.5\npattern = '(a)\\1'\n", "rule 'a'.*not supported"),
        ("[[rule]]\nid = 'a'\ncategory = 'CPU'\nconfidence = 0.5\nkeywords = ['a']\npattern = 'a(?=b)'\n",
         "rule 'a'.*RE2"),
        ("rule = 3\n", "rule must be written as"),
        ('[[rule]]\nid = "a"\ncategory = "CPU"\nconfidence = 0.5\npattern = "x"\nkeep_last = "yes"\n',
         "keep_last must be true or false"),
    ],
)
def test_bad_rules_files_are_input_errors(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(body)
    with pytest.raises(InputError, match=message):
        load_rules(f)


def test_streams_a_large_file_with_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    filler = b"".join(b"2026-11-30 09:00:%02d train INFO step %d loss 2.%04d tokens/s 81234\n" % (i % 60, i, i)
                      for i in range(10000))
    n_blocks = (60 << 20) // len(filler) + 1
    with path.open("wb") as f:
        for _ in range(n_blocks):
            f.write(filler)
        f.write(XID79.encode() + b"\n")
    tracemalloc.start()
    try:
        [c] = classify_paths([path])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert path.stat().st_size > 60 << 20
    assert c.category == "Faulty GPU"
    assert c.evidence[0].line == n_blocks * 10000 + 1 == c.lines
    assert peak < 16 << 20, f"peak traced memory {peak / 2**20:.1f} MiB"


def test_over_long_lines_are_cut_and_line_numbers_stay_right(tmp_path: Path) -> None:
    path = tmp_path / "long.log"
    with path.open("wb") as f:
        f.write(b"first\n")
        f.write(XID79.encode() + b" " + b"x" * (3 * MAX_LINE_BYTES) + b"\n")
        f.write(b"y" * (5 << 20) + b"\n")  # longer than a read block
        f.write(b"ModuleNotFoundError: No module named 'z'\r\n")
    [c] = classify_paths([path])
    assert c.category == "Faulty GPU" and c.evidence[0].line == 2
    assert c.truncated_lines == 2 and c.lines == 4
    assert len(c.evidence[0].text) <= 500
    dep = [e for e in c.evidence if e.category == "Dependency"]
    assert dep and dep[0].line == 4 and not dep[0].text.endswith("\r")


def test_gzip_json_and_directories(tmp_path: Path) -> None:
    gz = tmp_path / "kern.log.gz"
    with gzip.open(gz, "wt") as f:
        f.write("boot\n" + XID79 + "\n")
    [c] = classify_paths([gz])
    assert c.category == "Faulty GPU" and c.evidence[0].line == 2
    err = tmp_path / "error.json"
    err.write_text(json.dumps({"message": {"message": "ValueError: bad shape",
                                           "extraInfo": {"py_callstack": TRACEBACK, "timestamp": "1"}}}))
    [c] = classify_paths([err])
    assert c.category == "Software Bug" and c.evidence[0].text == "ValueError: bad shape"
    d = tmp_path / "attempt-1"
    d.mkdir()
    (d / "fr_trace_rank_0.pkl").write_bytes(b"\x80\x04\x95\x00\x00binary")
    (d / "log_tail_rank_0.txt").write_text(WATCHDOG + "\n")
    (d / "log_tail_rank_1.txt").write_text(TRACEBACK + "\n")
    [c] = classify_paths([d])
    assert c.category == "Software Bug" and c.files == 2 and len(c.skipped) == 1
    assert c.evidence[0].file.endswith("log_tail_rank_1.txt")
    [c] = classify_paths([d / "log_tail_rank_0.txt", d / "log_tail_rank_1.txt"], combine=True)
    assert c.category == "Software Bug" and c.files == 2


def test_bad_inputs_raise_one_line_input_errors(tmp_path: Path) -> None:
    binary = tmp_path / "core"
    binary.write_bytes(bytes(range(256)) * 40)
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    small = tmp_path / "small.log"
    small.write_text(XID79 * 10)
    cases = [
        ([tmp_path / "missing.log"], {}, "no such file"),
        ([binary], {}, "binary file"),
        ([Path("/proc/self/mem")], {}, "cannot read"),
        ([small], {"max_bytes": 100}, "over the 100 bytes limit"),
        ([empty_dir], {}, "no readable text logs"),
        ([], {}, "no input files"),
    ]
    for paths, kwargs, message in cases:
        with pytest.raises(InputError, match=message) as info:
            classify_paths(paths, **kwargs)  # type: ignore[arg-type]
        assert "\n" not in str(info.value)


def test_to_json_has_the_documented_fields() -> None:
    doc = classify_text(XID79, "k.log").to_json()
    assert set(doc) >= {"source", "category", "group", "confidence", "evidence", "host", "gpu"}
    assert doc["evidence"][0] == {"file": "k.log", "line": 1, "text": XID79, "rule": "xid-79",
                                  "category": "Faulty GPU", "explained_by": None}
    assert doc["device"] == "0000:3b:00"
    json.dumps(doc)


def test_healthy_training_output_gives_no_evidence() -> None:
    healthy = "\n".join([
        "2026-11-30 09:00:01,100 train INFO step 812 loss 2.7711 lr 3.0e-4 grad_norm 0.41 tokens/s 81234",
        "node-17:3341:3560 [3] NCCL INFO Channel 02/0 : 27[3] -> 35[3] via NET/IB/3/GDRDMA",
        "node-17:3341:3560 [3] NCCL INFO Connected all rings",
        "[rank3]:[W1130 07:41:02 ProcessGroupNCCL.cpp:4115] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS is deprecated",
        "init: fan_in=4096 fan_out=4096 tensor parallel size 8, host buffers pinned",
        "checkpoint step-800 saved in 3.2 s (blocking 0.21 s); PSU telemetry nominal",
        "Nov 30 09:00:02 node-17 kernel: mlx5_core 0000:0c:00.0 ibp12s0: Link up",
    ])
    c = classify_text(healthy, "train.log")
    assert (c.category, c.confidence, c.evidence) == ("Unknown", 0.0, ())


def test_nvlink_link_down_is_a_gpu_fault() -> None:
    c = classify_text("nvidia-fabricmanager: GPU 0000:18:00.0 NVLink link 5 is down", "x")
    assert c.category == "Faulty GPU"



def test_evidence_strings() -> None:
    c = classify_text(XID79, "kern.log")
    assert c.evidence_strings() == (f"kern.log:1: {XID79}",)


def test_follow_on_errors_are_partial_evidence_that_points_elsewhere() -> None:
    c = classify_text("[rank2]: RuntimeError: CUDA error: unspecified launch failure", "x")
    assert c.category == "Unknown" and "kernel log" in c.explanation and c.evidence[0].line == 1
    c = classify_text("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients", "x")
    assert c.category == "Unknown" and c.evidence and "rendezvous" in c.explanation


def test_user_xid_pattern_for_another_format(tmp_path: Path) -> None:
    f = tmp_path / "dcgm.toml"
    f.write_text("[settings]\nxid_pattern = 'XID_ERRORS\\{gpu=\"(?P<gpu>\\d+)\"\\} (?P<code>\\d+)'\n")
    c = classify_text('DCGM_FI_DEV_XID_ERRORS{gpu="3"} 79', "metrics.txt", rules=load_rules(f))
    assert c.category == "Faulty GPU" and c.gpu == "3"


# Lines from a rank of `trainguard demo` installed with torch's CPU wheel and no numpy (torch 2.13.0).
NO_NUMPY_WARNING = ("/v/lib/python3.11/site-packages/torch/_subclasses/functional_tensor.py:368: UserWarning: Failed "
                    "to initialize NumPy: No module named 'numpy' (Triggered internally at "
                    "/__w/pytorch/pytorch/torch/csrc/utils/tensor_numpy.cpp:84.)")
NO_NUMPY_CRASH = ("[rank1]:     buf = tensor.numpy().tobytes()[:tensor_size]\n"
                  "[rank1]: RuntimeError: Numpy is not available")


def test_a_missing_module_is_a_dependency_named_in_the_reason() -> None:
    c = classify_text("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
                      "    import lightning\nModuleNotFoundError: No module named 'lightning.fabric'", "r.log")
    assert (c.category, c.group) == ("Dependency", "Dependency")
    assert c.explanation == "a Python package is missing: lightning.fabric"
    numpy = classify_text(f"{NO_NUMPY_WARNING}\n{NO_NUMPY_CRASH}", "rank-1.log")
    assert numpy.category == "Dependency" and "numpy" in numpy.explanation
    assert numpy.evidence[0].rule == "torch-numpy-missing"


def test_torchs_numpy_warning_alone_is_no_failure() -> None:
    c = classify_text(f"{NO_NUMPY_WARNING}\n{TRACEBACK}", "rank-0.log")
    assert c.category == "Software Bug"
