"""``trainguard classify`` as a user runs it: JSON schema, text output, exit codes on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CORPUS = Path(__file__).parents[1] / "unit" / "corpus"


def tg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainguard", "classify", *args],
                          capture_output=True, text=True, timeout=60)


def test_json_output_is_one_list_with_the_documented_fields() -> None:
    r = tg("--json", str(CORPUS / "xid74_nvlink.journal"), str(CORPUS / "gloo_hang_log_tail.txt"))
    assert r.returncode == 0, r.stderr
    docs = json.loads(r.stdout)
    assert [d["category"] for d in docs] == ["Faulty GPU", "Unknown"]
    first = docs[0]
    assert first["group"] == "GPU" and first["host"] == "gpu-node-0412" and first["gpu"] == "0000:18:00"
    assert first["evidence"][0]["line"] == 3
    assert set(first["evidence"][0]) == {"file", "line", "text", "rule", "category", "explained_by"}
    for key in ("source", "confidence", "device", "explanation", "alternatives", "xids", "verdict", "lines",
                "truncated_lines", "files", "skipped"):
        assert key in first


def test_text_output_and_verdict() -> None:
    r = tg("--verdict", "hang", str(CORPUS / "gloo_hang_log_tail.txt"))
    assert r.returncode == 0
    assert "NCCL Watchdog Timeouts (Unknown)" in r.stdout
    r = tg(str(CORPUS / "xid79_fell_off_bus.dmesg"))
    assert "Faulty GPU (GPU)" in r.stdout and "xid79_fell_off_bus.dmesg:3:" in r.stdout


def test_user_rules_file(tmp_path: Path) -> None:
    rules = tmp_path / "r.toml"
    rules.write_text('[[rule]]\nid = "lab-ups"\ncategory = "Power Supply"\nconfidence = 0.9\n'
                     "pattern = 'UPS on battery'\n")
    log = tmp_path / "l.log"
    log.write_text("12:00 UPS on battery\n")
    r = tg("--json", "--rules", str(rules), str(log))
    assert json.loads(r.stdout)[0]["category"] == "Power Supply"
    bad = tmp_path / "bad.toml"
    bad.write_text("[[rule]]\nid='x'\n")
    r = tg("--rules", str(bad), str(log))
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_bad_input_gives_one_line_and_exit_code(tmp_path: Path) -> None:
    binary = tmp_path / "a.out"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(4000))
    log = tmp_path / "k.log"
    log.write_text("x" * 5000 + "\n")
    for args, code, text in [
        ([str(tmp_path / "nope.log")], 3, "no such file"),
        ([str(binary)], 3, "binary file"),
        (["/proc/self/mem"], 3, "cannot read"),
        (["--max-bytes", "1000", str(log)], 3, "over the"),
        (["--max-bytes", "-5", str(log)], 2, "--max-bytes"),
        (["--verdict", "bogus", str(log)], 2, "invalid choice"),
        ([], 2, "required"),
    ]:
        r = tg(*args)
        assert r.returncode == code, (args, r.stderr)
        assert text in r.stderr and r.stderr.count("\n") == 1 and r.stdout == ""


def test_reads_standard_input() -> None:
    text = (CORPUS / "xid119_gsp_timeout.log").read_text()
    r = subprocess.run([sys.executable, "-m", "trainguard", "classify", "--json", "-"], input=text,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    [doc] = json.loads(r.stdout)
    assert doc["category"] == "GPU System Processor" and doc["evidence"][0]["file"] == "<stdin>"
    rb = subprocess.run([sys.executable, "-m", "trainguard", "classify", "-"], input=b"\x00\x01\x02" * 100,
                        capture_output=True, timeout=60)
    assert rb.returncode == 3 and b"binary" in rb.stderr


def test_upstream_cause_and_its_consequences_in_both_outputs(tmp_path: Path) -> None:
    case = CORPUS / "aer_switch_fatal_gpus_off.dmesg"
    r = tg("--json", str(case))
    assert r.returncode == 0, r.stderr
    [doc] = json.loads(r.stdout)
    assert (doc["category"], doc["device"], doc["gpu"]) == ("IO Expansion Board", "0000:16:00", None)
    consequences = [e for e in doc["evidence"] if e["explained_by"]]
    assert consequences and {e["explained_by"] for e in consequences} == {f"{case}:1"}
    r = tg(str(case))
    assert "suspect: device 0000:16:00" in r.stdout
    assert f"[Faulty GPU, consequence of {case}:1]" in r.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("[[rule]]\nid='x'\ncategory='CPU'\nconfidence=0.5\nkeywords=['x']\npattern='x'\n"
                   "explains = {categories = ['NIC'], scope = 'rack'}\n")
    r = tg("--rules", str(bad), str(case))
    assert r.returncode == 3 and r.stderr.count("\n") == 1 and "explains.scope" in r.stderr
