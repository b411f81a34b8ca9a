"""The warm spare pool's sizing and a spare's fitness check (pure parts of `trainguard.launch.warm` and
`trainguard.worker.warm`; the spares themselves run in tests/e2e/test_warm_restart.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trainguard.health.host import available_memory_bytes as mem_available_bytes
from trainguard.launch.warm import AUTO, SPARE_BUDGET_BYTES, WarmSpares, auto_count
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
    auto = WarmSpares.build(AUTO, 1, True, args, tmp_path, 1.0, "n0")
    if auto_count(1, mem_available_bytes()):
        assert auto is not None and auto.count == 1 and not auto.eager  # filled once the attempt trains
    else:
        assert auto is None


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
