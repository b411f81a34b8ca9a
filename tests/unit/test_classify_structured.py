"""Structured inputs read as data (JSON documents, CSV tables) and the one-line answer for a killed process."""

from __future__ import annotations

import json
from pathlib import Path

from trainguard.classify import classify_paths, classify_text
from trainguard.classify.structured import as_structured, csv_records, json_records

REAL = Path(__file__).parent / "corpus" / "real"


def _telemetry(jump: bool, all_rise: bool = False) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for second in range(4):
        for gpu in range(4):
            temp = 60 + gpu
            if second >= 2 and (all_rise or (jump and gpu == 2)):
                temp += 66
            rows.append({"timestamp": f"2024-05-01T10:00:0{second}Z", "gpu": gpu, "temp_c": temp})
    return rows


def test_a_json_telemetry_series_with_one_sensor_jumping_is_the_sensor(tmp_path: Path) -> None:
    f = tmp_path / "telemetry.txt"  # the content, not the name, makes it JSON
    f.write_text(json.dumps(_telemetry(jump=True)))
    [c] = classify_paths([f])
    assert c.category == "GPU Thermal Interface + Sensor"
    assert "temp_c[2] 62 -> 128" in c.explanation


def test_a_json_series_where_every_sensor_rises_or_none_does_is_no_sensor_fault() -> None:
    assert classify_text(json.dumps(_telemetry(jump=False)), "t.json").category == "Unknown"
    assert classify_text(json.dumps(_telemetry(jump=False, all_rise=True)), "t.json").category == "Unknown"


def test_a_per_replica_checksum_document_names_the_odd_replica() -> None:
    doc = {"step": 4000, "checksums": {"rank0": "9f3ac01b", "rank1": "9f3ac01b", "rank2": "77e0aa13",
                                       "rank3": "9f3ac01b"}}
    c = classify_text(json.dumps(doc), "sums.json")
    assert c.category == "Silent Data Corruption"
    assert "replica 2 reads 77e0aa13" in c.explanation and "step 4000" in c.explanation
    doc["checksums"]["rank2"] = "9f3ac01b"  # type: ignore[index]
    assert classify_text(json.dumps(doc), "sums.json").category == "Unknown"


def test_an_nvidia_smi_query_csv_is_read_as_a_table(tmp_path: Path) -> None:
    rows = ["timestamp, index, temperature.gpu"]
    rows += [f"2024/05/01 10:00:0{s}.000, {g}, {127 if (s >= 2 and g == 1) else 60 + g}"
             for s in range(4) for g in range(3)]
    f = tmp_path / "query.csv"
    f.write_text("\n".join(rows) + "\n")
    [c] = classify_paths([f])
    assert c.category == "GPU Thermal Interface + Sensor"
    assert c.evidence[0].line == 1 + 2 * 3 + 1 + 1  # line numbers are the file's: header, two seconds, then GPU 1


def test_records_keep_time_first_and_skip_lone_values() -> None:
    assert json_records({"a": 1}) == []
    assert json_records([{"ts": 1714557600, "gpu": 3, "power_w": 700}]) == [
        "2024-05-01T10:00:00.000Z gpu=3 power_w=700"]
    assert csv_records("Epoch 1, loss 0.5\nEpoch 2, loss 0.4\n") is None  # values in the first row: no header


def test_logs_stay_logs() -> None:
    assert as_structured("[E ProcessGroupNCCL.cpp:474] [Rank 0] Watchdog caught collective operation timeout") is None
    assert as_structured("plain text, with a comma\nand more\n") is None


def test_a_real_torchelastic_sigkill_with_no_cause_says_so_in_one_line() -> None:
    # github.com/AkariAsai/self-rag/issues/83: host memory ran out; the excerpt shows only the exit codes
    [c] = classify_paths([REAL / "host-oom-sigkill-selfrag-83.log"])
    assert c.category == "Unknown"
    assert c.explanation.startswith("local ranks 0, 1 killed by SIGKILL from outside the job; no cause in their logs")


def test_a_real_shell_killed_line_is_a_kill_from_outside() -> None:
    # github.com/danijar/dreamerv3/issues/203: the shell's "Killed" (in a Chinese locale) after the OOM killer
    [c] = classify_paths([REAL / "host-oom-replay-buffer-dreamerv3-203.log"])
    assert c.category == "Unknown"
    assert c.explanation.startswith("the process killed by SIGKILL from outside the job")


def test_a_kill_with_its_cause_in_the_log_is_that_cause() -> None:
    text = ("[1234.5] Out of memory: Killed process 14447 (python) total-vm:90000000kB\n"
            "torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) local_rank: 1 (pid: 14447)\n")
    c = classify_text(text, "x.log")
    assert c.category == "Software Bug"
    assert "killed by" not in c.explanation


def test_sigterm_is_a_stop_and_torchelastics_closing_signal_is_no_kill() -> None:
    c = classify_text("Signal 15 (SIGTERM) received by PID 321\n", "x.log")
    assert c.explanation.startswith("the process stopped by SIGTERM from outside the job")
    c = classify_text("Sending process 321 closing signal SIGTERM\n", "x.log")
    assert "from outside the job" not in c.explanation


def test_a_real_pasted_markdown_table_of_dcgm_fields_is_read_as_fields() -> None:
    # github.com/NVIDIA/DCGM/issues/313 (corpus batch 4): a GB200's DCGM fields pasted as a markdown table, grouped
    # digits and code marks as the reporter wrote them. Read as name=value records, one per row, line for line.
    text = (REAL / "dcgm-fields-sbe-ecc-storm-dcgm-313.log").read_text()
    data = as_structured(text)
    assert data is not None
    lines = data.split("\n")
    assert len(lines) == len(text.split("\n"))
    assert "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL=54731746511" in lines
    assert "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS=8" in lines
    assert "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS=0" in lines
    # Its uncorrectable counters are 0: no rule may read them as an uncorrectable error. The thread's cause, a
    # storm of correctable errors, is read from the two single-bit rows only, as weak evidence (batch 7's rules).
    c = classify_paths([REAL / "dcgm-fields-sbe-ecc-storm-dcgm-313.log"])[0]
    assert (c.category, c.confidence) == ("GPU HBM3 Memory", 0.45)
    assert [e.line for e in c.evidence] == [3, 4], c.evidence


def test_a_markdown_table_with_a_nonzero_uncorrectable_field_is_hbm() -> None:
    text = ("GPU 3 after the job died:\n\n| Field | Value |\n|---|---|\n| `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL` | 0 |\n"
            "| `DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS` | 2 |\n")
    c = classify_text(text, "pasted.md")
    assert c.category == "GPU HBM3 Memory"
    assert [e.line for e in c.evidence] == [6]  # the pasted text's own line
    # a table with more columns: one record per row under the header's names
    rows = as_structured("| gpu | field | value |\n| --- | --- | ---: |\n| 0 | temp | 61 |\n| 1 | temp | 1,024 |\n")
    assert rows is not None and rows.split("\n")[2:4] == ["gpu=0 field=temp value=61", "gpu=1 field=temp value=1024"]


def test_nvidia_smi_boxes_and_prose_with_pipes_are_no_markdown_table() -> None:
    smi = ("+-----------------------------------------------------------------------------+\n"
           "| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |\n"
           "|-------------------------------+----------------------+----------------------+\n"
           "| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |\n"
           "|===============================+======================+======================|\n"
           "|   0  NVIDIA H100 80G...  On   | 00000000:18:00.0 Off |                    0 |\n")
    assert as_structured(smi) is None
    assert as_structured("a | b\nc | d\n") is None
