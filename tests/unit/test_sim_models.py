"""Failure models: built-in calibration from the published data, and validation of user files."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.sim.errors import ModelError, ModelFileError
from trainguard.sim.models import TABLE5_GROUPS, builtin_models, load_model, parse_model

TABLE5 = {
    "Faulty GPU": 148, "GPU HBM3 Memory": 72, "Software Bug": 54, "Network Switch/Cable": 35,
    "Host Maintenance": 32, "GPU SRAM Memory": 19, "GPU System Processor": 17, "NIC": 7,
    "NCCL Watchdog Timeouts": 7, "Silent Data Corruption": 6, "GPU Thermal Interface + Sensor": 6, "SSD": 3,
    "Power Supply": 3, "Server Chassis": 2, "IO Expansion Board": 2, "Dependency": 2, "CPU": 2, "System Memory": 2,
}
GPU_HOURS = 16384 * 54 * 24


def test_builtin_models_are_listed() -> None:
    assert {"llama3", "rsc1", "rsc2"} <= set(builtin_models())


def test_llama3_rates_are_table5_counts_per_gpu_hour() -> None:
    m = load_model("llama3")
    rates = {c.category: c.rate_per_gpu_hour for c in m.categories}
    assert set(rates) == set(TABLE5)
    for cat, count in TABLE5.items():
        assert rates[cat] == pytest.approx(count / GPU_HOURS, rel=1e-12)
    assert sum(TABLE5.values()) == 419
    assert m.job_mttf_hours(16384) == pytest.approx(54 * 24 / 419)
    assert m.planned_per_day == pytest.approx(47 / 54)
    for c in m.categories:
        assert c.group == TABLE5_GROUPS[c.category]


@pytest.mark.parametrize(("name", "per_1000_node_days"), [("rsc1", 6.50), ("rsc2", 2.34)])
def test_rsc_rates_per_node_day(name: str, per_1000_node_days: float) -> None:
    m = load_model(name)
    assert m.gpus_per_node == 8
    assert m.rate_per_gpu_hour * 8 * 24 * 1000 == pytest.approx(per_1000_node_days)


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "m.toml"
    p.write_text(text)
    return p


GOOD = 'name = "x"\n[[failure]]\ncategory = "Faulty GPU"\nrate_per_node_day = 0.01\n'


def test_user_file_loads(tmp_path: Path) -> None:
    m = load_model(_write(tmp_path, GOOD + 'distribution = "weibull"\nshape = 0.7\ndetection = "hang"\n'))
    assert m.categories[0].rate_per_gpu_hour == pytest.approx(0.01 / 8 / 24)
    assert m.categories[0].shape == 0.7 and m.categories[0].detection == "hang"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[[failure]]\ncategory = "Faulty GPU"\nrate_per_gpu_hour = -1e-5\n', "non-negative"),
        ('[[failure]]\ncategory = "Cosmic Rays"\nrate_per_gpu_hour = 1e-5\n', "unknown category"),
        (GOOD + "colour = 3\n", "unknown field 'colour'"),
        ("speed = 1\n" + GOOD, "unknown field 'speed'"),
        ('[[failure]]\ncategory = "Faulty GPU"\ncount = 3\n', "needs an [observed]"),
        ('[[failure]]\ncategory = "Faulty GPU"\n', "exactly one of"),
        (GOOD + 'group = "Host"\n', "belongs to group"),
        (GOOD + "shape = 2.0\n", "only to distribution"),
        (GOOD + 'detection = "telepathy"\n', "detection must be one of"),
        (GOOD + "recurrence = 1.5\n", "probability"),
        ("gpus_per_node = 0\n" + GOOD, "positive"),
        (GOOD + GOOD.replace('name = "x"\n', ""), "given twice"),
        ('name = "x"\n', "at least one"),
    ],
)
def test_bad_values_are_model_errors(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ModelError) as exc:
        load_model(_write(tmp_path, text))
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_malformed_toml_is_a_model_file_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError) as exc:
        load_model(_write(tmp_path, "[[failure]\ncategory = \n"))
    assert "malformed TOML" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_unknown_model_name() -> None:
    with pytest.raises(ModelError, match="unknown failure model"):
        load_model("nosuchmodel")


def test_parse_model_direct() -> None:
    m = parse_model({"total_per_gpu_hour": 1e-5, "failure": [
        {"category": "Faulty GPU", "share": 3}, {"category": "NIC", "share": 1}]})
    assert [c.rate_per_gpu_hour for c in m.categories] == pytest.approx([0.75e-5, 0.25e-5])
