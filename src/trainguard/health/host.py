"""Host checks: injected faults, run/checkpoint directories, memory, clock, rendezvous reachability."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path

from trainguard.core.protocol import RunLayout
from trainguard.health.base import HIGH, LOW, CheckResult, HealthConfig, failed, passed, skipped


def check_injected(config: HealthConfig) -> list[CheckResult]:
    """Fails (high) when chaos marked this node unhealthy: ``<run_dir>/chaos/unhealthy-<node>`` exists."""
    if config.run_dir is None:
        return [skipped("injected", HIGH, "no run directory given")]
    flag = RunLayout(Path(config.run_dir)).unhealthy_flag(config.node)
    if flag.exists():
        return [failed("injected", HIGH, f"node marked unhealthy by fault injection ({flag})")]
    return [passed("injected", HIGH, "no injected fault")]


def _existing(path: Path) -> Path:
    p = path
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def _probe_write(directory: Path, timeout: float) -> str | None:
    """Write, fsync and delete a small file in ``directory``; the error text, or None when it worked."""
    outcome: list[str | None] = []

    def probe() -> None:
        try:
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".trainguard-health-") as f:
                f.write(b"\0" * 4096)
                f.flush()
                os.fsync(f.fileno())
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc.strerror or str(exc))

    t = threading.Thread(target=probe, name="health-write-probe", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return f"write did not finish within {timeout:g} s (hung file system?)"
    return outcome[0] if outcome else "probe ended without a result"


def _dir_checks(label: str, path: Path | None, config: HealthConfig) -> list[CheckResult]:
    writable, space = f"{label}_writable", f"{label}_space"
    if path is None:
        return [skipped(writable, HIGH, f"no {label.replace('_', ' ')} given"),
                skipped(space, HIGH, f"no {label.replace('_', ' ')} given")]
    path = Path(path)
    if path.exists() and not path.is_dir():
        return [failed(writable, HIGH, f"{path} is not a directory"),
                skipped(space, HIGH, f"{path} is not a directory")]
    probe_dir = _existing(path)
    note = "" if probe_dir == path else f" (not created yet; probed {probe_dir})"
    error = _probe_write(probe_dir, config.timeout_seconds)
    out = [failed(writable, HIGH, f"cannot write to {probe_dir}: {error}") if error
           else passed(writable, HIGH, f"{path} writable{note}")]
    try:
        free = shutil.disk_usage(probe_dir).free
    except OSError as exc:
        out.append(failed(space, HIGH, f"cannot stat {probe_dir}: {exc.strerror}"))
        return out
    gib = free / 2**30
    if free < config.min_free_bytes:
        out.append(failed(space, HIGH, f"{gib:.2f} GiB free in {probe_dir}, "
                                       f"need {config.min_free_bytes / 2**30:.2f} GiB"))
    else:
        out.append(passed(space, HIGH, f"{gib:.1f} GiB free"))
    return out


def check_run_dir(config: HealthConfig) -> list[CheckResult]:
    """The run directory is writable and has free space (events, diagnostics, logs go there)."""
    return _dir_checks("run_dir", config.run_dir, config)


def check_checkpoint_dir(config: HealthConfig) -> list[CheckResult]:
    """The checkpoint directory is writable and has free space."""
    return _dir_checks("checkpoint_dir", config.checkpoint_dir, config)


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes (None when it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return None


def usable_cpus(cgroup_cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """CPUs this process may run on: its affinity set, capped by a cgroup v2 CPU quota (a container's CPU
    limit) when one is set; None when neither can be read."""
    try:
        cpus: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    try:
        quota, period = cgroup_cpu_max.read_text().split()[:2]
        if quota != "max" and int(period) > 0:
            limit = max(1, -(-int(quota) // int(period)))
            cpus = limit if cpus is None else min(cpus, limit)
    except (OSError, ValueError):
        pass
    return cpus


def cpu_ticks(stat: Path = Path("/proc/stat")) -> tuple[int, int] | None:
    """(idle, total) clock ticks of the host's CPUs so far (the ``cpu`` line of /proc/stat; idle counts
    iowait); None when it cannot be read. Two samples give how idle the CPUs were in between (`idle_cpus`)."""
    try:
        with open(stat) as f:
            fields = f.readline().split()
        if fields[0] != "cpu":
            return None
        ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError, IndexError):
        return None
    return ticks[3] + ticks[4], sum(ticks)


def idle_cpus(since: tuple[int, int] | None, now: tuple[int, int] | None = None, own_seconds: float = 0.0,
              cgroup_cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> float | None:
    """How many of the `usable_cpus` were idle on average since the ``since`` sample (`cpu_ticks`), the
    caller's ``own_seconds`` of CPU in that interval counted as idle (its own work is no competitor); where the
    interval is too short to tell (under 20 ticks) or unknown, the usable CPUs less the 1-minute load average;
    None when neither can be read."""
    cpus = usable_cpus(cgroup_cpu_max)
    if cpus is None:
        return None
    now = now if now is not None else cpu_ticks()
    if since is not None and now is not None and now[1] - since[1] >= 20:
        idle = now[0] - since[0] + own_seconds * os.sysconf("SC_CLK_TCK")
        return cpus * max(0.0, min(1.0, idle / (now[1] - since[1])))
    try:
        return max(0.0, cpus - os.getloadavg()[0])
    except OSError:
        return None


def check_memory(config: HealthConfig) -> list[CheckResult]:
    """Enough host memory is available (low: a node short of memory is degraded, not broken)."""
    avail = available_memory_bytes()
    if avail is None:
        return [skipped("memory", LOW, "available memory not measurable here")]
    gib = avail / 2**30
    if avail < config.min_available_memory_bytes:
        return [failed("memory", LOW, f"{gib:.2f} GiB available, "
                                      f"want {config.min_available_memory_bytes / 2**30:.2f} GiB")]
    return [passed("memory", LOW, f"{gib:.1f} GiB available")]


class _Timex(ctypes.Structure):
    _fields_ = [
        ("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
        ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
        ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long), ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long), ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
        ("padding", ctypes.c_int * 11),
    ]


_TIME_ERROR = 5
_STA_UNSYNC = 0x40


def clock_state() -> tuple[bool, float] | None:
    """(synchronized, max error in seconds) of this host's clock from the kernel (ntp_adjtime), or None."""
    name = ctypes.util.find_library("c")
    if not name or not hasattr(os, "uname") or os.uname().sysname != "Linux":
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        tx = _Timex()
        state = libc.ntp_adjtime(ctypes.byref(tx))  # modes=0: read only
    except (OSError, AttributeError):
        return None
    if state < 0:
        return None
    synced = state != _TIME_ERROR and not tx.status & _STA_UNSYNC
    return synced, tx.maxerror / 1e6


def check_clock(config: HealthConfig) -> list[CheckResult]:
    """This host's clock is NTP-synchronized within a bound. Direct skew against the rendezvous host is
    not measurable over a c10d store (it has no time service); two synchronized hosts differ by at
    most the sum of their error bounds, which is what this check bounds."""
    return [judge_clock(clock_state(), config.max_clock_error_seconds)]


def judge_clock(state: tuple[bool, float] | None, max_error_seconds: float) -> CheckResult:
    """The ``clock_sync`` result for a clock state (`clock_state`: synchronized, error bound in seconds)."""
    if state is None:
        return skipped("clock_sync", LOW, "clock synchronization state not readable here")
    synced, maxerror = state
    if not synced:
        return failed("clock_sync", LOW, f"clock not NTP-synchronized (kernel error bound {maxerror:.1f} s); "
                                         "event times from this host may be skewed")
    if maxerror > max_error_seconds:
        return failed("clock_sync", LOW, f"clock error bound {maxerror:.3f} s exceeds {max_error_seconds:g} s")
    return passed("clock_sync", LOW, f"synchronized, error bound {maxerror * 1000:.0f} ms")


def parse_endpoint(endpoint: str, default_port: int = 29400) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``host`` (torchrun's default port 29400). Raises ValueError."""
    text = endpoint.strip()
    if not text:
        raise ValueError("empty rendezvous endpoint")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise ValueError(f"bad rendezvous endpoint {endpoint!r}")
        port_text = rest.removeprefix(":") if rest else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"bad rendezvous endpoint {endpoint!r}: no host")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad rendezvous endpoint {endpoint!r}: port must be 1-65535")
    return host, int(port_text)


def check_rdzv(config: HealthConfig) -> list[CheckResult]:
    """The rendezvous endpoint accepts a TCP connection (high: a node that cannot reach it cannot join)."""
    if not config.rdzv_endpoint:
        return [skipped("rdzv_reachable", HIGH, "no rendezvous endpoint given")]
    try:
        host, port = parse_endpoint(config.rdzv_endpoint)
    except ValueError as exc:
        return [failed("rdzv_reachable", HIGH, str(exc))]
    try:
        with socket.create_connection((host, port), timeout=config.timeout_seconds):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        return [failed("rdzv_reachable", HIGH, f"cannot connect to {host}:{port}: {reason}")]
    return [passed("rdzv_reachable", HIGH, f"{host}:{port} accepts connections")]
