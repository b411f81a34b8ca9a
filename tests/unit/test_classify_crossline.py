"""Evidence across lines (docs/classify.md): simultaneity on one host, implausible sensor jumps, replica
divergence, firmware before driver and orchestrator actions before signals; and the [[crossline]] format."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.classify import classify_text, load_rules
from trainguard.errors import InputError

BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]


def _xid79(host: str, bus: str, second: int) -> str:
    return (f"Mar 04 11:02:{second:02d} {host} kernel: NVRM: Xid (PCI:0000:{bus}:00): 79, pid=1, name=python, "
            "GPU has fallen off the bus.")


def test_four_gpus_of_a_host_in_the_same_second_are_the_host_not_the_gpus() -> None:
    c = classify_text("\n".join(_xid79("n1", b, 17) for b in BUSES[:4]), "k")
    assert c.category == "Power Supply", c.explanation
    assert c.gpu is None  # the GPUs are victims
    assert all(e.explained_by for e in c.evidence[1:])
    assert "4 devices within 2 s" in c.explanation


@pytest.mark.parametrize("lines", [
    [_xid79("n1", b, 17) for b in BUSES[:3]],                        # three: below the minimum
    [_xid79("n1", b, 10 + 5 * i) for i, b in enumerate(BUSES[:4])],  # four, 5 s apart: one after the other
    [_xid79(h, b, 17) for h in ("n1", "n2") for b in BUSES[:2]],     # four, but two per host
])
def test_gpus_lost_apart_or_few_stay_faulty_gpus(lines: list[str]) -> None:
    c = classify_text("\n".join(lines), "k")
    assert c.category == "Faulty GPU", c.explanation


def test_a_host_component_with_its_own_evidence_is_named_instead_of_power() -> None:
    fans = "Mar 04 11:00:01 n1 ipmievd[9]: Fan sensor Fan Board, Device Absent was asserted"
    c = classify_text("\n".join([fans, *(_xid79("n1", b, 17) for b in BUSES)]), "k")
    assert c.category == "Server Chassis", c.explanation
    assert c.evidence[0].line == 1


def _reading(t: int, sensor: str, value: float) -> str:
    return f"2026-09-14T03:20:{t:02d}Z n1 bmc-poll: {sensor} | {value:.3f} | degrees C | ok"


def test_a_sensor_that_jumps_while_its_neighbours_stay_is_the_sensor() -> None:
    lines = [_reading(11, "GPU3_Temp", 61), _reading(11, "GPU3_HBM_Temp", 58), _reading(12, "GPU3_Temp", 127),
             _reading(12, "GPU3_HBM_Temp", 58),
             "2026-09-14T03:20:13Z n1 kernel: NVRM: Xid (PCI:0000:5d:00): 79, pid=1, name=x, "
             "GPU has fallen off the bus."]
    c = classify_text("\n".join(lines), "k")
    assert c.category == "GPU Thermal Interface + Sensor", c.explanation
    assert c.evidence[0].line == 3 and "GPU3_Temp 61 -> 127 in 1 s" in c.explanation
    assert c.evidence[1].explained_by == "k:3"  # the XID 79 is its consequence


@pytest.mark.parametrize("lines", [
    # a slow climb: heat, not a broken sensor
    [_reading(0, "GPU3_Temp", 61), _reading(30, "GPU3_Temp", 127)],
    # every sensor rose together: the airflow, not one sensor
    [_reading(1, "GPU3_Temp", 61), _reading(1, "GPU2_Temp", 60), _reading(2, "GPU3_Temp", 127),
     _reading(2, "GPU2_Temp", 110)],
    # a rise of 20: plausible
    [_reading(1, "GPU3_Temp", 61), _reading(2, "GPU3_Temp", 81)],
])
def test_plausible_temperature_changes_are_no_evidence(lines: list[str]) -> None:
    c = classify_text("\n".join(lines), "k")
    assert c.category == "Unknown" and not c.evidence, c.explanation  # readings alone are never evidence


def _row(step: int, rank: int, value: str) -> str:
    return f"sdc-check: step={step} rank={rank} crc32={value}"


def test_one_replica_whose_checksum_differs_is_silent_data_corruption() -> None:
    rows = [_row(7, r, "0xdeadbeef" if r != 2 else "0xdeadbeee") for r in range(4)]
    c = classify_text("\n".join(rows), "k")
    assert c.category == "Silent Data Corruption", c.explanation
    assert c.evidence[0].line == 3 and "replica 2 reads 0xdeadbeee" in c.explanation


@pytest.mark.parametrize("rows", [
    [_row(7, r, "0xaaaaaaaa") for r in range(4)],                                     # all agree
    [_row(7, r, v) for r, v in enumerate(["0xaaaaaaaa", "0xaaaaaaaa", "0xbbbbbbbb", "0xcccccccc"])],
    [_row(7, 0, "0xaaaaaaaa"), _row(7, 1, "0xbbbbbbbb")],                              # two: who is odd?
    [_row(s, 0, v) for s, v in ((1, "0xaaaaaaaa"), (2, "0xaaaaaaaa"), (3, "0xbbbbbbbb"))],  # one replica, three steps
])
def test_tables_without_a_single_odd_replica_are_no_evidence(rows: list[str]) -> None:
    c = classify_text("\n".join(rows), "k")
    assert c.category == "Unknown", c.explanation


def test_gsp_timeouts_explain_the_same_gpus_later_loss_only() -> None:
    gsp = ("[100.0] NVRM: Xid (PCI:0000:c1:00): 119, pid=1, name=p, Timeout after 6s of waiting for RPC "
           "response from GPU2 GSP! Expected function 76 (GSP_RM_CONTROL) (0x0 0x4).")
    same = "[130.0] NVRM: GPU 0000:c1:00.0: RmInitAdapter failed! (0x62:0x65:2109)"
    other = "[130.0] NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=p, GPU has fallen off the bus."
    c = classify_text("\n".join([gsp, same]), "k")
    assert c.category == "GPU System Processor" and c.evidence[1].explained_by == "k:1", c.explanation
    c = classify_text("\n".join([gsp, other]), "k")
    assert c.category == "Faulty GPU", c.explanation  # another GPU: not explained, and XID 79 is surer


def test_orchestrator_actions_explain_the_signals_after_them_and_their_negations_do_not_count() -> None:
    timeout = ("[rank4]:[E305 03:41:02.001 ProcessGroupNCCL.cpp:616] [Rank 4] Watchdog caught collective "
               "operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
               "Timeout(ms)=600000) ran for 600061 milliseconds before timing out.")
    drain = "node/gpu-node-22 cordoned"
    c = classify_text("\n".join([drain, timeout]), "k")
    assert c.category == "Host Maintenance" and c.evidence[1].explained_by == "k:1", c.explanation
    for noise in ('time="x" level=info msg="Reboot not required"', "node/gpu-node-22 uncordoned",
                  "Uncordoning node gpu-node-22"):
        assert classify_text("\n".join([noise, timeout]), "k").category == "NCCL Watchdog Timeouts", noise


@pytest.mark.parametrize(("body", "message"), [
    ('kind = "sideways"\ncategory = "Power Supply"', "kind must be one of"),
    ('kind = "jump"\nreadings = "no-such-rule"\ncategory = "GPU Thermal Interface + Sensor"', "readings must name"),
    ('kind = "simultaneous"\ncategory = "Power Cord"', "unknown category"),
    ('kind = "divergence"\nreadings = "reading-replica-checksum"\ncategory = "Silent Data Corruption"\n'
     "min_replicas = 2", "min_replicas must be"),
])
def test_a_bad_crossline_is_an_input_error_naming_it(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "site.toml"
    f.write_text(f'[[crossline]]\nid = "mine"\n{body}\n')
    with pytest.raises(InputError, match=message) as exc:
        load_rules(f)
    assert "crossline 'mine'" in str(exc.value)


def test_a_user_crossline_and_readings_rule_work_like_the_built_in_ones(tmp_path: Path) -> None:
    f = tmp_path / "site.toml"
    f.write_text('[[rule]]\nid = "psu-volts"\ncategory = "Unknown"\nconfidence = 0.0\nkeep = 64\n'
                 'keywords = ["Volts"]\n'
                 'pattern = \'(?P<sensor>\\w+_V)\\s*\\|\\s*(?P<value>\\d+(?:\\.\\d+)?)\\s*\\| Volts\'\n'
                 '[[crossline]]\nid = "volt-jump"\nkind = "jump"\nreadings = "psu-volts"\nmin_rise = 5\n'
                 'category = "Power Supply"\nconfidence = 0.7\nexplain = "a rail jumped"\n')
    rules = load_rules(f)
    text = "\n".join(["P12_V | 12.0 | Volts", "P5_V | 5.0 | Volts", "P12_V | 19.0 | Volts", "P5_V | 5.0 | Volts"])
    c = classify_text(text, "k", rules=rules)
    assert c.category == "Power Supply" and c.evidence[0].line == 3, c.explanation


@pytest.mark.parametrize("fmt", [
    "2026-04-18T12:00:{t:02d}Z n1 monitor: {gpu} temperature: {v} C",
    '2026-04-18T12:00:{t:02d}Z n1 exporter: DCGM_FI_DEV_{metric}_TEMP{{gpu="{idx}",UUID="GPU-1"}} {v}',
])
def test_jumps_read_free_text_and_dcgm_exporter_readings(fmt: str) -> None:
    def line(t: int, idx: int, v: int, memory: bool = False) -> str:
        gpu = f"GPU{idx}" + (" HBM" if memory else "")
        return fmt.format(t=t, gpu=gpu, idx=idx, metric="MEMORY" if memory else "GPU", v=v)
    lines = [line(1, 3, 61), line(1, 3, 58, memory=True), line(1, 2, 60),
             line(2, 3, 127), line(2, 3, 58, memory=True), line(2, 2, 61)]
    c = classify_text("\n".join(lines), "k")
    assert c.category == "GPU Thermal Interface + Sensor" and c.evidence[0].line == 4, c.explanation
    # the same readings rising together on every GPU: no sensor fault
    together = [line(1, 3, 61), line(1, 2, 60), line(2, 3, 127), line(2, 2, 120)]
    assert classify_text("\n".join(together), "k").category == "Unknown"


@pytest.mark.parametrize("action", [
    "I1203 04:12:09 scale_down.go:1102] Successfully added ToBeDeletedByClusterAutoscaler on node gpu-node-7",
    'karpenter: {"level":"INFO","message":"disrupting node(s)","reason":"drifted","node":"gpu-node-7"}',
    'GET /latest/meta-data/spot/instance-action -> {"action": "terminate", "time": "2026-12-03T04:14:09Z"}',
])
def test_autoscaler_and_spot_actions_are_orchestrator_actions(action: str) -> None:
    timeout = ("[rank4]:[E305 03:41:02.001 ProcessGroupNCCL.cpp:616] [Rank 4] Watchdog caught collective "
               "operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
               "Timeout(ms)=600000) ran for 600061 milliseconds before timing out.")
    c = classify_text("\n".join([action, timeout]), "k")
    assert c.category == "Host Maintenance" and c.evidence[1].explained_by == "k:1", c.explanation
