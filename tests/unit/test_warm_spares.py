"""The warm spare pool's sizing and a spare's fitness check (pure parts of `trainguard.launch.warm` and
`trainguard.worker.warm`; the spares themselves run in tests/e2e/test_warm_restart.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.health.host import available_memory_bytes as mem_available_bytes
from trainguard.health.host import cpu_ticks, idle_cpus, usable_cpus
from trainguard.launch import warm
from trainguard.launch.warm import AUTO, SPARE_BUDGET_BYTES, WarmSpares, auto_count, starts_with_the_job
from trainguard.torch_api.elastic import can_adopt
from trainguard.worker.warm import preload_watched

GIB = 1 << 30


def test_the_pool_is_one_spare_per_local_rank_within_a_quarter_of_free_memory() -> None:
    assert auto_count(8, 512 * GIB) == 8
    assert auto_count(8, 16 * GIB) == 4  # a quarter of 16 GiB at 1 GiB each
    assert auto_count(2, 3 * GIB) == 0  # not even one fits in a quarter
    assert auto_count(4, None) == 0  # unknown memory: no spares rather than a guess
    assert auto_count(0, 512 * GIB) == 0
    assert SPARE_BUDGET_BYTES == GIB


def test_memavailable_is_read_from_proc() -> None:
    available = mem_available_bytes()
    assert available is not None and available > 0


def test_build_sizes_the_pool_or_turns_it_off(tmp_path: Path) -> None:
    args = ("-u", "train.py")
    assert WarmSpares.build(0, 8, True, args, tmp_path, 1.0, "n0") is None  # --warm-spares 0: off
    assert WarmSpares.build(3, 8, False, args, tmp_path, 1.0, "n0") is None  # --no-python: nothing to load ahead
    asked = WarmSpares.build(3, 8, True, args, tmp_path, 1.0, "n0")
    assert asked is not None and asked.count == 3 and asked.eager  # a count asked for fills at once
    assert asked.start_with_job()
    auto = WarmSpares.build(AUTO, 1, True, args, tmp_path, 1.0, "n0")
    if auto_count(1, mem_available_bytes()):
        # decided before the first workers start, from how idle the CPUs were since the pool was built
        assert auto is not None and auto.count == 1 and not auto.eager and auto.since is not None
    else:
        assert auto is None


def test_an_automatic_pool_starts_with_the_job_only_with_an_idle_cpu_for_every_worker_and_spare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert starts_with_the_job(8, 8, 111.5)  # a GPU node
    assert starts_with_the_job(1, 1, 2.0)
    assert starts_with_the_job(1, 1, 1.96)  # a quiet node's daemons
    assert not starts_with_the_job(1, 1, 1.3)  # 2 CPUs at 35% busy
    assert not starts_with_the_job(2, 2, 2.0)  # this project's CI machine, 2 ranks: after the first step
    assert not starts_with_the_job(8, 8, 15.0)
    assert not starts_with_the_job(1, 1, None)
    for idle, eager in ((2.0, True), (1.2, False)):
        pool = WarmSpares(1, ("-u", "train.py"), tmp_path, 1.0, eager=False, local_ranks=1)
        pool.since = (0, 0)
        monkeypatch.setattr(warm, "idle_cpus", lambda since, own_seconds, idle=idle: idle)
        assert pool.start_with_job() is eager and pool.eager is eager
        assert pool.since is None  # asked once


def test_idle_cpus_from_two_samples_of_the_cpu_ticks(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n")
    assert cpu_ticks(stat) == (850, 1000)
    absent = tmp_path / "no-cgroup"
    cpus = usable_cpus(absent)
    assert cpus is not None
    assert idle_cpus((850, 1000), (850 + 75, 1000 + 100), cgroup_cpu_max=absent) == pytest.approx(0.75 * cpus)
    assert idle_cpus((850, 1000), (850, 1000 + 100), cgroup_cpu_max=absent) == 0.0
    # the caller's own CPU in the interval counts as idle (the agent's start-up is no competitor of its workers)
    own = 25 / os.sysconf("SC_CLK_TCK")
    assert idle_cpus((850, 1000), (850 + 50, 1000 + 100), own, absent) == pytest.approx(0.75 * cpus)
    # too short an interval to tell: the load average's complement
    by_load = max(0.0, cpus - os.getloadavg()[0])
    assert idle_cpus((850, 1000), (851, 1005), cgroup_cpu_max=absent) == pytest.approx(by_load, abs=0.5)
    stat.write_text("intr 1 2 3\n")
    assert cpu_ticks(stat) is None


def test_usable_cpus_is_capped_by_a_cgroup_quota(tmp_path: Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("max 100000\n")
    assert usable_cpus(cpu_max) == affinity
    cpu_max.write_text("150000 100000\n")  # a limit of 1.5 CPUs: 2 can run at once
    assert usable_cpus(cpu_max) == min(affinity, 2)
    cpu_max.write_text("50000 100000\n")
    assert usable_cpus(cpu_max) == 1
    assert usable_cpus(tmp_path / "absent") == affinity


def test_torch_builds_worker_handles_through_the_factory_warm_starts_use() -> None:
    assert can_adopt()


def _run_preload(tmp_path: Path, module_text: str, extra_env: dict[str, str] | None = None) -> str:
    """`preload_watched` of one module in a fresh interpreter (imports are process-wide)."""
    (tmp_path / "usermod.py").write_text(module_text)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from trainguard.worker.warm import preload_watched; "
            "p = preload_watched(['json', 'usermod', 'not_a_module_anywhere']); "
            "print(p.count, p.unfit, ','.join(p.culprits) or '-')")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")} | (extra_env or {})
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=120, check=True)
    return out.stdout.strip()


def test_a_module_reading_its_rank_at_import_makes_the_spare_unfit(tmp_path: Path) -> None:
    assert _run_preload(tmp_path, "import os\nRANK = int(os.environ.get('RANK', '0'))\n") == \
        "2 a module read RANK while loaded ahead usermod"
    assert _run_preload(tmp_path, "from os import getenv\nW = getenv('LOCAL_RANK')\n") == \
        "2 a module read LOCAL_RANK while loaded ahead usermod"
    assert _run_preload(tmp_path, "import os\n'RANK' in os.environ\n") == \
        "2 a module read RANK while loaded ahead usermod"


def test_lightning_loaded_ahead_keeps_the_spare_fit_and_each_rank_gets_its_own_rank_zero_gate() -> None:
    pytest.importorskip("lightning")
    code = ("import os; from trainguard.worker.warm import preload_watched; "
            "from trainguard.worker import import_ranks; p = preload_watched(['lightning']); "
            "os.environ.update(RANK='1', LOCAL_RANK='1'); done = import_ranks.refresh_loaded(os.environ); "
            "from lightning.pytorch.utilities.rank_zero import rank_zero_only as a; "
            "from lightning.fabric.utilities.rank_zero import rank_zero_only as b; "
            "from torchmetrics.utilities.prints import rank_zero_only as c; "
            "print(p.unfit, ','.join(p.culprits) or '-', a.rank, b.rank, c.rank, ','.join(done))")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         check=True)
    assert out.stdout.split() == ["None", "-", "1", "1", "1",
                                  "lightning.fabric.utilities.rank_zero,torchmetrics.utilities.prints"]


def _run_preload_known(tmp_path: Path, module_text: str) -> str:
    """`preload_watched` of ``usermod`` with `import_ranks.KNOWN` naming it as a module whose ``rank_zero_only.rank``
    can be set again after the fork."""
    (tmp_path / "usermod.py").write_text(module_text)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from trainguard.worker import import_ranks; "
            "from trainguard.worker.warm import preload_watched; "
            "import_ranks.KNOWN['usermod'] = import_ranks.ImportTimeRead('usermod', import_ranks._torchmetrics_rank); "
            "p = preload_watched(['usermod']); print(p.unfit, ','.join(p.culprits) or '-')")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    return subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=120, check=True).stdout.strip()


def test_a_known_reader_counts_only_while_its_kept_value_can_be_set_again(tmp_path: Path) -> None:
    kept = "import os\ndef rank_zero_only(): pass\nrank_zero_only.rank = int(os.environ.get('LOCAL_RANK', 0))\n"
    assert _run_preload_known(tmp_path, kept) == "None -"
    # A release that renamed the attribute: the refresh fails, so the read makes the module load after the fork.
    assert _run_preload_known(tmp_path, "import os\nRANK = int(os.environ.get('LOCAL_RANK', 0))\n") == \
        "a module read LOCAL_RANK while loaded ahead usermod"
    # A read by the known module's caller, not by the module itself, still counts.
    (tmp_path / "helper.py").write_text("import os\ndef rank():\n    return os.environ.get('RANK')\n")
    assert _run_preload_known(tmp_path, kept + "import helper\nR = helper.rank()\n") == \
        "a module read RANK while loaded ahead usermod"


def test_a_module_reading_other_variables_keeps_the_spare_fit(tmp_path: Path) -> None:
    assert _run_preload(tmp_path, "import os\nHOME = os.environ.get('HOME')\nP = dict(os.environ.copy())\n") == \
        "2 None -"


def test_listing_the_environment_whole_is_no_read_of_a_rank(tmp_path: Path) -> None:
    # What tqdm (its envwrap over os.environ.items()) and fsspec (dict(os.environ)) do at import: a Lightning
    # Fabric script's spares were all unfit for it ("a module read ... TRAINGUARD_ATTEMPT").
    env = {"RANK": "1", "TRAINGUARD_ATTEMPT": "0"}
    text = ("import os\nD = dict(os.environ)\nT = {k: v for k, v in os.environ.items() if k.startswith('TQDM_')}\n"
            "V = list(os.environ.values())\n")
    assert _run_preload(tmp_path, text, env) == "2 None -"


def test_the_environment_is_the_real_one_again_after_preloading() -> None:
    real = os.environ
    found = preload_watched(["json"])
    assert os.environ is real and found.count == 1 and found.unfit is None


def test_trainguards_own_scripts_are_fit_for_a_warm_start() -> None:
    # The demo's workload read TORCHELASTIC_RESTART_COUNT in a class body: every spare of it started cold while the
    # agent counted it warm.
    code = ("from trainguard.worker.warm import preload_watched; "
            "p = preload_watched(['trainguard.examples.train_gpt', 'trainguard.examples.train_gpt_inprocess']); "
            "print(p.count, p.unfit)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "2 None", out.stdout + out.stderr[-2000:]


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _settles(pid: int, stopped: bool) -> bool:
    """Whether ``pid`` reaches the stopped state (or leaves it): a signal takes effect once the kernel delivers it."""
    deadline = time.monotonic() + 60
    while (_state(pid) == "T") != stopped:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_spares_still_importing_are_held_while_a_restart_starts_cold(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # A spare still importing competed with the cold ranks of a restart for the CPUs (Lightning Fabric at load 12:
    # 21 s cold against torchrun's 14 s); it is stopped until the restarted ranks have stepped.
    pool = WarmSpares(2, ("-u", "train.py"), tmp_path, 1.0, eager=False, local_ranks=2)
    ready_log, loading_log = tmp_path / "ready.log", tmp_path / "loading.log"
    ready_log.write_text("warm spare 1: 12 modules loaded in 2.00s; waiting\n")
    loading_log.write_text("")  # no "waiting" line yet: importing
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
             for _ in range(2)]  # in their own sessions, as spares are (held by their process group)
    try:
        ready, loading = procs
        pool.spares = [ready, loading]
        pool._logs = {ready.pid: ready_log, loading.pid: loading_log}
        monkeypatch.setattr(warm, "can_adopt", lambda: True)
        assert pool.claim([0, 1]) == [0]  # one rank warm, the other cold
        assert pool.held == [loading] and _settles(loading.pid, stopped=True) and _state(ready.pid) != "T"
        pool.top_up(False, 1.0)  # the restarted ranks have not stepped yet
        assert _state(loading.pid) == "T"
        pool.top_up(True, 1.0)
        assert pool.held == [] and _settles(loading.pid, stopped=False)
        pool.claim([0])  # every rank warm: nothing held
        assert pool.held == []
    finally:
        pool.close()
        for p in procs:
            p.kill()
            p.wait(timeout=30)


def test_a_fork_server_still_importing_is_held_while_a_restart_starts_cold(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # A second server (the first found the script's import reads its rank) still importing when a fault came early
    # competed with the cold ranks (Lightning Fabric, fault 2 s after the first step: 1.15x torchrun).
    pool = WarmSpares(0, ("-u", "train.py"), tmp_path, 1.0, eager=False, local_ranks=2, forks=True)
    assert pool.forks is not None
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        pool.forks.proc = server  # started, alive, and no report yet: importing
        monkeypatch.setattr(warm, "can_adopt", lambda: True)
        assert pool.forks.starting() and pool.ready() == 0
        assert pool.claim([0, 1]) == []  # both ranks cold: nothing waits for the server
        assert pool.held == [server] and _settles(server.pid, stopped=True)
        pool.top_up(True, 1.0)  # the restarted ranks stepped: it goes on importing
        assert pool.held == [] and _settles(server.pid, stopped=False)
    finally:
        pool.close()
        server.kill()
        server.wait(timeout=30)


def test_a_known_module_whose_value_cannot_be_set_is_said_and_skipped(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    import types

    from trainguard.worker import import_ranks

    renamed = types.ModuleType("torchmetrics.utilities.prints")  # a release without `rank_zero_only`
    monkeypatch.setitem(sys.modules, "torchmetrics.utilities.prints", renamed)
    for name in ("lightning.fabric.utilities.rank_zero", "lightning_fabric.utilities.rank_zero"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert import_ranks.refresh_loaded({"LOCAL_RANK": "1"}) == []
    assert not import_ranks.covered("torchmetrics.utilities.prints", {"LOCAL_RANK": "1"})
    assert "torchmetrics.utilities.prints keeps the rank it saw while loaded ahead" in caplog.text
