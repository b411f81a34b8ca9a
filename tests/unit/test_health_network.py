"""NIC and InfiniBand checks: on this machine's real /sys, and on recorded sysfs trees with every port state."""

from __future__ import annotations

from pathlib import Path

from trainguard.health import HIGH, LOW, HealthConfig
from trainguard.health.nic import check_ib, check_nics

COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors", "port_xmit_discards")


def by_name(results: list) -> dict:  # type: ignore[type-arg]
    return {r.name: r for r in results}


def ib_port(root: Path, dev: str, port: int, state: str, phys: str, **counters: int) -> None:
    p = root / "class" / "infiniband" / dev / "ports" / str(port)
    (p / "counters").mkdir(parents=True)
    (p / "state").write_text(state + "\n")
    (p / "phys_state").write_text(phys + "\n")
    (p / "link_layer").write_text("InfiniBand\n")
    for name in COUNTERS:
        (p / "counters" / name).write_text(f"{counters.get(name, 0)}\n")


def net(root: Path, name: str, operstate: str, *, flags: int = 0x1003, carrier_changes: int = 2,
        physical: bool = True) -> None:
    p = root / "class" / "net" / name
    p.mkdir(parents=True)
    (p / "operstate").write_text(operstate + "\n")
    (p / "flags").write_text(f"{flags:#x}\n")
    (p / "carrier_changes").write_text(f"{carrier_changes}\n")
    if physical:
        (p / "device").mkdir()


def test_this_machines_sysfs() -> None:
    """Whatever this host has: the checks run, never raise, and agree with /sys."""
    ib = by_name(check_ib(HealthConfig(node="n")))
    has_ib = any(Path("/sys/class/infiniband").glob("*/ports/*"))
    assert ib["ib_port_state"].skipped == (not has_ib) and ib["ib_port_state"].severity == LOW  # none named
    nics = by_name(check_nics(HealthConfig(node="n")))
    physical_up = [i.name for i in Path("/sys/class/net").iterdir()
                   if (i / "device").exists() and int((i / "flags").read_text(), 16) & 1]
    assert nics["nic_link"].skipped == (not physical_up)
    for name in physical_up:  # each physical interface that is up is named with its state
        assert name in nics["nic_link"].detail
    assert nics["nic_flaps"].severity == LOW


def test_healthy_infiniband_ports(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "5: LinkUp", symbol_error=3)
    ib_port(tmp_path, "mlx5_1", 1, "4: ACTIVE", "5: LinkUp")
    res = by_name(check_ib(HealthConfig(node="n", sysfs_root=tmp_path, ib_devices=("mlx5_0", "mlx5_1"))))
    assert res["ib_port_state"].ok and not res["ib_port_state"].skipped and "2 port(s)" in res["ib_port_state"].detail
    assert res["ib_port_errors"].ok


def test_a_down_port_fails_high_and_erring_ports_fail_low(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "5: LinkUp", symbol_error=5000)
    ib_port(tmp_path, "mlx5_1", 1, "1: DOWN", "3: Disabled")
    ib_port(tmp_path, "mlx5_2", 1, "2: INIT", "5: LinkUp", link_downed=6)
    res = by_name(check_ib(HealthConfig(node="n", sysfs_root=tmp_path, ib_devices=("mlx5_0", "mlx5_1", "mlx5_2",
                                                                                   "mlx5_3"))))
    state = res["ib_port_state"]
    assert not state.ok and state.severity == HIGH
    assert "mlx5_1 port 1 (InfiniBand): state '1: DOWN', physical '3: Disabled'" in state.detail
    assert "mlx5_2 port 1" in state.detail and "mlx5_3: device missing" in state.detail
    assert "mlx5_0" not in state.detail
    errors = res["ib_port_errors"]
    assert not errors.ok and errors.severity == LOW
    assert "mlx5_0 port 1: symbol_error 5000 (limit 100)" in errors.detail
    assert "mlx5_2 port 1: link_downed 6 (limit 5)" in errors.detail


def test_no_infiniband_is_skipped(tmp_path: Path) -> None:
    res = by_name(check_ib(HealthConfig(node="n", sysfs_root=tmp_path)))
    assert res["ib_port_state"].skipped and res["ib_port_state"].ok and "no InfiniBand" in res["ib_port_state"].detail


def test_found_ports_are_low_named_ones_high(tmp_path: Path) -> None:
    ib_port(tmp_path, "mlx5_0", 1, "4: ACTIVE", "5: LinkUp")
    ib_port(tmp_path, "mlx5_0", 2, "1: DOWN", "2: Polling")  # the uncabled second port of a dual-port adapter
    found = by_name(check_ib(HealthConfig(node="n", sysfs_root=tmp_path)))["ib_port_state"]
    assert not found.ok and found.severity == LOW and "mlx5_0 port 2" in found.detail
    named = by_name(check_ib(HealthConfig(node="n", sysfs_root=tmp_path, ib_devices=("mlx5_0",))))["ib_port_state"]
    assert not named.ok and named.severity == HIGH


def test_links_down_and_flapping(tmp_path: Path) -> None:
    net(tmp_path, "eth0", "up")
    net(tmp_path, "eth1", "down")  # administratively up, no carrier: unplugged
    net(tmp_path, "eth2", "down", flags=0x1002)  # administratively down: not in use, not checked
    net(tmp_path, "ib0", "up", carrier_changes=57)
    net(tmp_path, "veth9", "lowerlayerdown", physical=False)  # virtual: not checked
    res = by_name(check_nics(HealthConfig(node="n", sysfs_root=tmp_path)))
    link = res["nic_link"]
    assert not link.ok and link.severity == LOW  # found, not named: maybe a spare port without a cable
    assert link.detail == "eth1: down (administratively up, no link)"
    flaps = res["nic_flaps"]
    assert not flaps.ok and flaps.severity == LOW and flaps.detail == "ib0: carrier changed 57 times (limit 20)"
    named = by_name(check_nics(HealthConfig(node="n", sysfs_root=tmp_path, nics=("eth0", "eth1", "eth3"))))
    assert named["nic_link"].severity == HIGH  # the job's own interfaces
    assert named["nic_link"].detail == "eth1: down (administratively up, no link); eth3: no such interface"
    good = by_name(check_nics(HealthConfig(node="n", sysfs_root=tmp_path, nics=("eth0",))))
    assert good["nic_link"].ok and good["nic_flaps"].ok
