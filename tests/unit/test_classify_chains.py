"""Cause before consequence: an upstream failure explains its downstream devices' errors only when it comes first
(by time stamps, else by order), within the time window, and above them in the PCI topology (or on their host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.classify import classify_paths, classify_text, load_rules
from trainguard.classify.context import is_below, line_time, normalize_pci, parse_pci
from trainguard.errors import InputError

SWITCH = [
    "[ 8812.301455] pcieport 0000:15:01.0: AER: Uncorrected (Fatal) error received: 0000:16:00.0",
    "[ 8812.301470] pcieport 0000:16:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, "
    "(Requester ID)",
]
GPUS_OFF = [
    "[ 8813.104220] NVRM: Xid (PCI:0000:18:00): 79, pid=88123, name=python, GPU has fallen off the bus.",
    "[ 8813.104311] NVRM: Xid (PCI:0000:1a:00): 79, pid=88124, name=python, GPU has fallen off the bus.",
]


def test_switch_failure_explains_the_gpus_below_it() -> None:
    c = classify_text("\n".join(SWITCH + GPUS_OFF), "kern.log")
    assert c.category == "IO Expansion Board" and c.device == "0000:16:00"
    assert (c.evidence[0].line, c.evidence[0].explained_by) == (1, None)
    victims = [e for e in c.evidence if e.rule == "xid-79"]
    assert [(e.line, e.category, e.explained_by) for e in victims] == [
        (3, "Faulty GPU", "kern.log:1"), (4, "Faulty GPU", "kern.log:1")]
    assert c.gpu is None  # the GPUs are victims, not suspects
    assert "2 device(s) below it (0000:18:00, 0000:1a:00)" in c.explanation


def test_gpus_that_fell_off_before_the_port_error_are_not_its_consequences() -> None:
    # the same lines, the port's error last (its time stamps later): the GPUs failed first
    late = [line.replace("[ 8812.", "[ 8814.") for line in SWITCH]
    c = classify_text("\n".join(GPUS_OFF + late), "kern.log")
    assert c.category == "Faulty GPU" and c.evidence[0].line == 1
    assert all(e.explained_by is None for e in c.evidence)


def test_time_stamps_order_lines_from_different_files(tmp_path: Path) -> None:
    kern = tmp_path / "a-kern.log"  # given (and read) first, but its errors happened later
    kern.write_text("".join(f"2026-06-21T03:05:42+0000 hgx-7 kernel: NVRM: Xid (PCI:0000:{b}:00): 79, pid=1, "
                            "GPU has fallen off the bus.\n" for b in ("18", "2a")))
    sel = tmp_path / "b-sel.log"
    sel.write_text("2026-06-21T03:05:40Z hgx-7 bmc: Power Supply PSU4 | Power Supply AC lost | Asserted\n")
    [c] = classify_paths([kern, sel], combine=True)
    assert c.category == "Power Supply" and c.evidence[0].file == str(sel)
    assert {e.explained_by for e in c.evidence if e.rule == "xid-79"} == {f"{sel}:1"}
    # two hours later the same GPU errors are a failure of their own, not the power supply's
    sel.write_text("2026-06-21T01:05:40Z hgx-7 bmc: Power Supply PSU4 | Power Supply AC lost | Asserted\n")
    [c] = classify_paths([kern, sel], combine=True)
    assert c.category == "Faulty GPU"


def test_another_hosts_power_supply_explains_nothing() -> None:
    lines = ["2026-06-21T03:05:40Z hgx-8 bmc: Power Supply PSU4 | Power Supply AC lost | Asserted"] + [
        f"2026-06-21T03:05:42Z hgx-7 kernel: NVRM: Xid (PCI:0000:{b}:00): 79, pid=1, GPU has fallen off the bus."
        for b in ("18", "2a")]
    c = classify_text("\n".join(lines), "fleet.log")
    assert c.category == "Faulty GPU" and c.host == "hgx-7"


def test_a_port_in_another_subtree_explains_nothing() -> None:
    other = [line.replace("0000:15:01.0", "0000:c0:01.1").replace("0000:16:00.0", "0000:c1:00.0") for line in SWITCH]
    c = classify_text("\n".join(other + GPUS_OFF), "kern.log")
    assert c.category == "Faulty GPU"  # 0000:18:00 and 0000:1a:00 have lower bus numbers: not below 0000:c1:00


def test_bridge_ranges_from_the_log_decide_what_is_below() -> None:
    boot = ["[    2.114201] pci 0000:16:00.0: PCI bridge to [bus 17-18]"]
    c = classify_text("\n".join(boot + SWITCH + GPUS_OFF), "kern.log")
    # only 0000:18:00 is below the switch port; one GPU is not enough to blame the port
    assert c.category == "Faulty GPU"
    boot = ["[    2.114201] pci 0000:16:00.0: PCI bridge to [bus 17-1c]"]
    assert classify_text("\n".join(boot + SWITCH + GPUS_OFF), "kern.log").category == "IO Expansion Board"


def test_a_gpus_own_fatal_error_does_not_make_it_upstream_of_its_neighbours() -> None:
    own = ["[ 8812.301455] pcieport 0000:15:01.0: AER: Uncorrected (Fatal) error received: 0000:18:00.0"]
    c = classify_text("\n".join(own + GPUS_OFF), "kern.log")
    assert c.category == "Faulty GPU"  # 0000:18:00 is an endpoint (a GPU): nothing is below it


def test_one_gpu_under_a_port_is_the_gpus_own_failure() -> None:
    c = classify_text("\n".join(SWITCH + GPUS_OFF[:1]), "kern.log")
    assert c.category == "Faulty GPU" and c.gpu == "0000:18:00"


def test_an_adapter_explains_its_own_link_not_another_adapters() -> None:
    lines = [
        "[412337.918203] mlx5_core 0000:4b:00.0: poll_health:955:(pid 0): Fatal error 1 detected",
        "[412339.611870] mlx5_core 0000:4b:00.0 ibp75s0: Link down",
        "[412339.611990] mlx5_core 0000:0c:00.0 ibp12s0: Link down",
    ]
    c = classify_text("\n".join(lines), "kern.log")
    assert c.category == "NIC"
    by_line = {e.line: e for e in c.evidence}
    assert by_line[2].explained_by == "kern.log:1" and by_line[3].explained_by is None


def test_a_file_server_outage_explains_the_jobs_io_errors() -> None:
    lines = [
        "Sep 05 00:14:27 n-31 kernel: nfs: server fs-ckpt-02 not responding, timed out",
        "Sep 05 00:14:28 n-31 python[44120]: OSError: [Errno 5] Input/output error: '/nfs/ckpt/x'",
    ]
    c = classify_text("\n".join(lines), "j")
    assert c.category == "Dependency" and c.evidence[1].explained_by == "j:1"
    # without the outage the same EIO is still the file system, weakly: no disk error is beside it (decisions C4)
    alone = classify_text(lines[1], "j")
    assert (alone.category, alone.confidence) == ("Dependency", 0.5) and alone.evidence[0].explained_by is None
    # an NVMe controller's own errors are not explained by the file server (explains.rules)
    nvme = "Sep 05 00:14:29 n-31 kernel: nvme nvme0: I/O 412 QID 17 timeout, reset controller"
    c = classify_text("\n".join([*lines, nvme]), "j")
    assert c.category == "SSD" and c.evidence[0].line == 3


def test_a_server_error_is_a_dependency_not_also_a_software_bug() -> None:
    line = ("botocore.exceptions.ClientError: An error occurred (SlowDown) when calling the PutObject operation "
            "(reached max retries: 4): Please reduce your request rate.")
    c = classify_text(line, "t")
    assert c.category == "Dependency" and [e.rule for e in c.evidence] == ["service-http-error"]
    assert c.alternatives == ()
    # a 404 is the job asking for something that is not there: not a failed service
    assert classify_text(line.replace("(SlowDown)", "(NoSuchKey)"), "t").category == "Software Bug"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("explains = {categories = ['Faulty GPU'], scope = 'sideways'}", "explains.scope"),
        ("explains = {categories = ['Faulty GPU'], min_devices = 0}", "min_devices"),
        ("explains = {categories = []}", "explains.categories"),
        ("explains = {categories = ['Flux']}", "unknown category"),
        ("explains = {categories = ['NIC'], rule = ['x']}", "unknown key"),
        ("supersedes = ['no-such-rule']", "supersedes unknown rule"),
    ],
)
def test_bad_explains_and_supersedes_are_input_errors(tmp_path: Path, body: str, message: str) -> None:
    f = tmp_path / "r.toml"
    f.write_text(f"[[rule]]\nid = 'a'\ncategory = 'CPU'\nconfidence = 0.5\nkeywords = ['a']\npattern = 'a'\n{body}\n")
    with pytest.raises(InputError, match=message) as info:
        load_rules(f)
    assert str(f) in str(info.value) and "\n" not in str(info.value)


def test_user_rule_can_declare_an_upstream_cause(tmp_path: Path) -> None:
    f = tmp_path / "site.toml"
    f.write_text("[[rule]]\nid = 'pdu'\ncategory = 'Power Supply'\nconfidence = 0.6\nkeywords = ['PDU']\n"
                 "pattern = 'PDU \\d+ breaker tripped'\n"
                 "explains = {categories = ['Faulty GPU'], scope = 'source', min_devices = 2}\n")
    text = "\n".join(["rack 7: PDU 3 breaker tripped", *GPUS_OFF])
    assert classify_text(text, "x", rules=load_rules(f)).category == "Power Supply"
    assert classify_text(text, "x").category == "Faulty GPU"


def test_nvidia_smi_sections_name_the_gpu_of_their_lines() -> None:
    text = "\n".join(["GPU 00000000:18:00.0", "    SRAM Uncorrectable SEC-DED    : 0",
                      "GPU 00000008:5D:00.0", "    SRAM Uncorrectable SEC-DED    : 4"])
    c = classify_text(text, "smi.txt")
    assert (c.category, c.gpu, c.evidence[0].line) == ("GPU SRAM Memory", "0008:5d:00", 4)


def test_pci_addresses_and_topology() -> None:
    assert parse_pci("00000000:5D:00.0") == parse_pci("0000:5d:00") == parse_pci("PCI:0000:5d:00") == (0, 0x5D, 0)
    assert normalize_pci("00000008:06:00.1") == "0008:06:00" and normalize_pci("GPU 3") == "GPU 3"
    assert parse_pci("not-a-bus") is None
    assert is_below("0000:18:00", "0000:16:00", {})
    assert not is_below("0000:16:00", "0000:18:00", {})
    assert not is_below("0001:18:00", "0000:16:00", {})  # another PCI domain
    assert not is_below("0000:16:00", "0000:16:00", {}) and is_below("0000:16:00", "0000:16:00", {}, same_counts=True)
    assert not is_below("0000:1a:00", "0000:16:00", {"0000:16:00": (0x17, 0x18)})


def test_line_times_compare_on_one_clock_only() -> None:
    assert line_time("2026-06-21T03:05:40Z h x", "f") == line_time("2026-06-21T05:05:40+02:00 h x", "f")
    assert line_time("2026-06-21 03:05:40,118 train INFO", "f") == ("local", pytest.approx(1782011140.118))
    assert line_time("Jun 21 03:05:40 h kernel: x", "f")[0] == "syslog"  # type: ignore[index]
    assert line_time("[ 8812.301455] pcieport x", "a.log") == ("boot:a.log", pytest.approx(8812.301455))
    assert line_time("  42 | 09/17/2026 | 18:20:11 | Processor CPU2 | IERR | Asserted", "f")[0] == "local"  # type: ignore[index]
    assert line_time("no time here", "f") is None
