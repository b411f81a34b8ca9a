"""Network checks from sysfs: InfiniBand (and RoCE) port state and error counters, Ethernet link state and flaps.

Read from ``<sysfs_root>/class/infiniband/<device>/ports/<n>/{state,phys_state,counters/*}`` and
``<sysfs_root>/class/net/<interface>/{operstate,carrier_changes,flags}`` (``sysfs_root`` is ``/sys``; tests point
it at recorded trees). Nothing is written and nothing blocks: sysfs reads answer from the kernel.

* ``ib_port_state`` (high for the devices named in ``ib_devices``, low for those found): a port is not ``ACTIVE``
  or not ``LinkUp``, or a named device is missing;
* ``ib_port_errors`` (low): an error counter (symbol errors, link recoveries, link downs, ...) is over its limit;
* ``nic_link`` (high for the interfaces named in ``nics``, low for those found): an interface that is
  administratively up has no link;
* ``nic_flaps`` (low): a physical interface's carrier changed more than ``max_carrier_changes`` times since boot.
"""

from __future__ import annotations

from pathlib import Path

from trainguard.health.base import HIGH, LOW, CheckResult, HealthConfig, failed, passed, skipped

IB_ERROR_COUNTERS: tuple[str, ...] = (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors", "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors", "port_xmit_discards", "port_xmit_constraint_errors",
    "port_rcv_constraint_errors", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
)
"""InfiniBand port counters that count errors (``counters/`` of a port; absent ones are ignored)."""
LINK_DOWNED_LIMIT = 5
"""``link_downed`` above this fails ``ib_port_errors`` whatever ``max_ib_errors`` says (each is a lost link)."""
_IFF_UP = 0x1
_DOWN_STATES = ("down", "lowerlayerdown", "dormant", "notpresent")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def _ports(root: Path) -> list[tuple[str, str, Path]]:
    """(device, port number, port folder) of every InfiniBand/RoCE port under ``root/class/infiniband``."""
    base = root / "class" / "infiniband"
    out = []
    for dev in sorted(base.iterdir()) if base.is_dir() else []:
        ports = dev / "ports"
        for port in sorted(ports.iterdir(), key=lambda p: p.name) if ports.is_dir() else []:
            out.append((dev.name, port.name, port))
    return out


def check_ib(config: HealthConfig) -> list[CheckResult]:
    """InfiniBand/RoCE ports: state (high) and error counters (low); skipped where the host has none."""
    root = Path(config.sysfs_root)
    ports = _ports(root)
    missing = [d for d in config.ib_devices if not (root / "class" / "infiniband" / d).is_dir()]
    if not ports and not missing:
        why = "no InfiniBand or RoCE devices on this host (/sys/class/infiniband is empty or absent)"
        return [skipped("ib_port_state", HIGH if config.ib_devices else LOW, why), skipped("ib_port_errors", LOW, why)]
    bad_state = [f"{d}: device missing" for d in missing]
    bad_counters: list[str] = []
    for dev, num, port in ports:
        if config.ib_devices and dev not in config.ib_devices:
            continue
        state, phys = _read(port / "state") or "?", _read(port / "phys_state") or "?"
        layer = _read(port / "link_layer") or "InfiniBand"
        if "ACTIVE" not in state.upper() or "LINKUP" not in phys.upper().replace(" ", ""):
            bad_state.append(f"{dev} port {num} ({layer}): state {state!r}, physical {phys!r}")
        for name in IB_ERROR_COUNTERS:
            value = _int(port / "counters" / name)
            limit = min(config.max_ib_errors, LINK_DOWNED_LIMIT) if name == "link_downed" else config.max_ib_errors
            if value is not None and value > limit:
                bad_counters.append(f"{dev} port {num}: {name} {value} (limit {limit})")
    n = len(ports)
    # Ports of devices named in the config are the job's: high. Found ones may include an uncabled second port
    # of a dual-port adapter, which must not exclude a healthy node: low.
    severity = HIGH if config.ib_devices else LOW
    out = [failed("ib_port_state", severity, "; ".join(bad_state)) if bad_state
           else passed("ib_port_state", severity, f"{n} port(s) ACTIVE, LinkUp")]
    out.append(failed("ib_port_errors", LOW, "; ".join(bad_counters)) if bad_counters
               else passed("ib_port_errors", LOW, f"error counters of {n} port(s) within {config.max_ib_errors}"))
    return out


def _physical(root: Path) -> list[Path]:
    """Interfaces backed by a device (``device`` link): not lo, bridges, veth, tunnels, ifb."""
    base = root / "class" / "net"
    return [i for i in sorted(base.iterdir()) if (i / "device").exists()] if base.is_dir() else []


def check_nics(config: HealthConfig) -> list[CheckResult]:
    """Ethernet/IPoIB links: administratively up but no link (high when named in ``nics``, else low), carrier
    flapping (low)."""
    root = Path(config.sysfs_root)
    base = root / "class" / "net"
    if config.nics:
        interfaces = [base / name for name in config.nics]
    else:
        interfaces = [i for i in _physical(root) if (_int(i / "flags") or 0) & _IFF_UP]
    if not interfaces:
        why = "no physical network interface that is up (nothing to check)" if base.is_dir() else \
            "no /sys/class/net here"
        return [skipped("nic_link", HIGH if config.nics else LOW, why), skipped("nic_flaps", LOW, why)]
    down, flapping, good = [], [], []
    for iface in interfaces:
        state = _read(iface / "operstate")
        if state is None:
            down.append(f"{iface.name}: no such interface")
            continue
        if state in _DOWN_STATES:
            down.append(f"{iface.name}: {state} (administratively up, no link)")
        else:
            good.append(f"{iface.name} {state}")
        changes = _int(iface / "carrier_changes")
        if changes is not None and changes > config.max_carrier_changes:
            flapping.append(f"{iface.name}: carrier changed {changes} times (limit {config.max_carrier_changes})")
    # Interfaces named in the config are the job's: no link there is high. Found ones may include a spare port
    # left up without a cable, which must not exclude a healthy node: low (drain later, someone looks at it).
    severity = HIGH if config.nics else LOW
    return [
        failed("nic_link", severity, "; ".join(down)) if down else passed("nic_link", severity, ", ".join(good)),
        failed("nic_flaps", LOW, "; ".join(flapping)) if flapping
        else passed("nic_flaps", LOW, f"carrier changes within {config.max_carrier_changes}"),
    ]
