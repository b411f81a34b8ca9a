"""Failure models as data: per-category rates, detection, repair paths, loaded from TOML files.

Built-in models live in ``sim/models/<name>.toml`` (``llama3``, ``rsc1``, ``rsc2``); a user file uses
the same schema (docs/simulation.md). Every value is validated; a bad file raises `ModelFileError`
(unreadable, malformed TOML) or `ModelError` (a wrong value), each with a one-line message.
"""

from __future__ import annotations

import logging
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.core.numeric import is_number
from trainguard.core.taxonomy import TABLE5_GROUPS
from trainguard.sim.errors import ModelError, ModelFileError

log = logging.getLogger(__name__)

MODELS_DIR = Path(__file__).parent / "models"

SCOPES = ("gpu", "host", "network")
DISTRIBUTIONS = ("exponential", "weibull")
DETECTIONS = ("crash", "hang", "sdc")
REPAIRS = ("restart", "replace", "wait")
_RATE_KEYS = ("rate_per_gpu_hour", "rate_per_node_day", "count", "share")
_FAILURE_KEYS = frozenset(
    {"category", "group", "scope", "distribution", "shape", "detection", "detection_seconds",
     "repair", "repair_hours", "recurrence", *_RATE_KEYS}
)
_TOP_KEYS = frozenset(
    {"name", "description", "source", "gpus_per_node", "planned_per_day", "observed",
     "total_per_node_day", "total_per_gpu_hour", "failure", "notes"}
)


@dataclass(frozen=True)
class FailureCategory:
    """One root-cause category of unexpected interruptions."""

    category: str
    """Table 5 category name, verbatim."""
    group: str
    """Table 5 group (GPU, Host, Network, Dependency, Unplanned Maintenance, Unknown)."""
    rate_per_gpu_hour: float
    """Mean failures of this category per GPU per hour (the job's rate is N times this)."""
    scope: str = "gpu"
    """What fails: one GPU (its host is blamed), a whole host, or a network domain of several hosts."""
    distribution: str = "exponential"
    """Times between failures across the job: ``exponential`` or ``weibull`` (with ``shape``)."""
    shape: float = 1.0
    """Weibull shape (below 1: failures cluster; 1: exponential)."""
    detection: str = "crash"
    """How it is seen: ``crash`` (process exits), ``hang`` (the hang timeout), ``sdc`` (next check)."""
    detection_seconds: float | None = None
    """Fixed detection latency overriding the policy's default for the detection kind."""
    repair: str = "replace"
    """``restart`` in place, ``replace`` the node from spares, or ``wait`` for repair."""
    repair_hours: float = 48.0
    """Time until the failed node (or part) is repaired and usable again."""
    recurrence: float = 0.0
    """Probability that a failure of this category hits a node it hit before (lemon behaviour)."""

    def __post_init__(self) -> None:
        for name, allowed in (("scope", SCOPES), ("distribution", DISTRIBUTIONS), ("detection", DETECTIONS),
                              ("repair", REPAIRS)):
            if getattr(self, name) not in allowed:
                raise ModelError(f"{self.category}: {name} must be one of {', '.join(allowed)}, "
                                 f"not {getattr(self, name)!r}")
        for name in ("rate_per_gpu_hour", "shape", "repair_hours", "recurrence"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ModelError(f"{self.category}: {name} must be a finite non-negative number, not {value!r}")
        if self.shape == 0 or self.recurrence > 1:
            raise ModelError(f"{self.category}: shape must be positive and recurrence at most 1")
        if self.detection_seconds is not None and not (
                math.isfinite(self.detection_seconds) and self.detection_seconds >= 0):
            raise ModelError(f"{self.category}: detection_seconds must be non-negative, not {self.detection_seconds!r}")


@dataclass(frozen=True)
class FailureModel:
    """A cluster's failure behaviour: categories with rates plus planned interruptions."""

    name: str
    categories: tuple[FailureCategory, ...]
    gpus_per_node: int = 8
    planned_per_day: float = 0.0
    """Planned interruptions (maintenance, upgrades) per day, for the whole job, independent of size."""
    description: str = ""
    source: str = ""

    @property
    def rate_per_gpu_hour(self) -> float:
        """Unexpected failures per GPU-hour, all categories."""
        return sum(c.rate_per_gpu_hour for c in self.categories)

    def job_mttf_hours(self, gpus: int) -> float:
        """Mean time between unexpected failures of a job on ``gpus`` GPUs: 1 / (N r)."""
        rate = gpus * self.rate_per_gpu_hour
        return math.inf if rate <= 0 else 1.0 / rate

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpus_per_node": self.gpus_per_node,
            "planned_per_day": self.planned_per_day,
            "rate_per_gpu_hour": self.rate_per_gpu_hour,
            "categories": {c.category: c.rate_per_gpu_hour for c in self.categories},
        }


def builtin_models() -> list[str]:
    """Names of the models shipped with trainguard."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.toml"))


def load_model(name_or_path: str | Path) -> FailureModel:
    """A built-in model by name, or a user TOML file by path."""
    text_name = str(name_or_path)
    builtin = MODELS_DIR / f"{text_name}.toml"
    if "/" not in text_name and not text_name.endswith(".toml") and builtin.is_file():
        path = builtin
    else:
        path = Path(name_or_path)
        if not path.exists():
            raise ModelError(
                f"unknown failure model {text_name!r} (built-in: {', '.join(builtin_models())}; "
                "or give the path of a .toml file)"
            )
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ModelFileError(f"{path}: malformed TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{path}: cannot read: {exc}") from None
    return parse_model(data, where=str(path), default_name=path.stem)


def _number(where: str, key: str, value: Any, *, positive: bool = False, integer: bool = False) -> float:
    if not is_number(value):
        raise ModelError(f"{where}: {key} must be a finite number, not {value!r}")
    if integer and not is_number(value, integer=True):
        raise ModelError(f"{where}: {key} must be an integer, not {value!r}")
    if value < 0 or (positive and value == 0):
        raise ModelError(f"{where}: {key} must be {'positive' if positive else 'non-negative'}, not {value!r}")
    return float(value)


def _choice(where: str, key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ModelError(f"{where}: {key} must be one of {', '.join(allowed)}, not {value!r}")
    return str(value)


@dataclass(frozen=True)
class _Basis:
    """What per-category counts and shares are relative to."""

    gpus_per_node: int
    observed_gpu_hours: float | None
    """GPU-hours of the ``[observed]`` table (for ``count``)."""
    total_per_gpu_hour: float | None
    """Total rate (for ``share``)."""


def _basis(data: dict[str, Any], where: str) -> _Basis:
    gpn = int(_number(where, "gpus_per_node", data.get("gpus_per_node", 8), positive=True, integer=True))
    observed = data.get("observed")
    obs_gpu_hours: float | None = None
    if observed is not None:
        if not isinstance(observed, dict) or set(observed) - {"gpus", "days"} or len(observed) != 2:
            raise ModelError(f"{where}: [observed] needs exactly gpus and days")
        obs_gpu_hours = _number(where, "observed.gpus", observed["gpus"], positive=True) * _number(
            where, "observed.days", observed["days"], positive=True) * 24.0
    total: float | None = None
    if "total_per_node_day" in data and "total_per_gpu_hour" in data:
        raise ModelError(f"{where}: give total_per_node_day or total_per_gpu_hour, not both")
    if "total_per_node_day" in data:
        total = _number(where, "total_per_node_day", data["total_per_node_day"]) / gpn / 24.0
    elif "total_per_gpu_hour" in data:
        total = _number(where, "total_per_gpu_hour", data["total_per_gpu_hour"])
    return _Basis(gpn, obs_gpu_hours, total)


def _raw_rates(failures: Any, basis: _Basis, where: str) -> list[tuple[dict[str, Any], str, float]]:
    """Each [[failure]] table with its one rate key and value, checked against the basis."""
    if not isinstance(failures, list) or not failures:
        raise ModelError(f"{where}: needs at least one [[failure]] table")
    raw: list[tuple[dict[str, Any], str, float]] = []
    for i, entry in enumerate(failures):
        here = f"{where}: failure #{i + 1}"
        if not isinstance(entry, dict):
            raise ModelError(f"{here}: must be a table")
        bad = sorted(set(entry) - _FAILURE_KEYS)
        if bad:
            raise ModelError(f"{here}: unknown field {bad[0]!r}")
        rate_keys = [k for k in _RATE_KEYS if k in entry]
        if len(rate_keys) != 1:
            raise ModelError(f"{here}: give exactly one of {', '.join(_RATE_KEYS)}")
        key = rate_keys[0]
        if key == "count" and basis.observed_gpu_hours is None:
            raise ModelError(f"{here}: count needs an [observed] table (gpus, days)")
        if key == "share" and basis.total_per_gpu_hour is None:
            raise ModelError(f"{here}: share needs total_per_node_day or total_per_gpu_hour")
        raw.append((entry, key, _number(here, key, entry[key])))
    if basis.total_per_gpu_hour is not None and sum(v for _, k, v in raw if k == "share") <= 0:
        raise ModelError(f"{where}: shares must not all be zero")
    return raw


def _rate(key: str, value: float, basis: _Basis, share_sum: float) -> float:
    """A rate key's value as failures per GPU-hour."""
    if key == "rate_per_gpu_hour":
        return value
    if key == "rate_per_node_day":
        return value / basis.gpus_per_node / 24.0
    if key == "count":
        return value / (basis.observed_gpu_hours or 1.0)
    return (basis.total_per_gpu_hour or 0.0) * value / share_sum


def _category(entry: dict[str, Any], rate: float, here: str) -> FailureCategory:
    """One validated category from its [[failure]] table and its rate per GPU-hour."""
    cat = entry.get("category")
    if cat not in TABLE5_GROUPS:
        raise ModelError(f"{here}: unknown category {cat!r} (use a Llama 3 Table 5 category or 'Unknown')")
    group = entry.get("group", TABLE5_GROUPS[cat])
    if group != TABLE5_GROUPS[cat]:
        raise ModelError(f"{here}: {cat!r} belongs to group {TABLE5_GROUPS[cat]!r}, not {group!r}")
    dist = _choice(here, "distribution", entry.get("distribution", "exponential"), DISTRIBUTIONS)
    shape = _number(here, "shape", entry.get("shape", 1.0), positive=True)
    if dist == "exponential" and shape != 1.0:
        raise ModelError(f"{here}: shape applies only to distribution = \"weibull\"")
    det_s = entry.get("detection_seconds")
    recurrence = _number(here, "recurrence", entry.get("recurrence", 0.0))
    if recurrence > 1:
        raise ModelError(f"{here}: recurrence is a probability (0..1), not {recurrence!r}")
    return FailureCategory(
        category=cat, group=group, rate_per_gpu_hour=rate,
        scope=_choice(here, "scope", entry.get("scope", "gpu"), SCOPES),
        distribution=dist, shape=shape,
        detection=_choice(here, "detection", entry.get("detection", "crash"), DETECTIONS),
        detection_seconds=None if det_s is None else _number(here, "detection_seconds", det_s),
        repair=_choice(here, "repair", entry.get("repair", "replace"), REPAIRS),
        repair_hours=_number(here, "repair_hours", entry.get("repair_hours", 48.0)),
        recurrence=recurrence,
    )


def parse_model(data: dict[str, Any], *, where: str = "model", default_name: str = "custom") -> FailureModel:
    """Validate a model's TOML data and turn counts/shares into per-GPU-hour rates."""
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ModelError(f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(sorted(_TOP_KEYS))})")
    basis = _basis(data, where)
    planned = _number(where, "planned_per_day", data.get("planned_per_day", 0.0))
    raw = _raw_rates(data.get("failure", []), basis, where)
    share_sum = sum(v for _, k, v in raw if k == "share")
    cats: list[FailureCategory] = []
    for i, (entry, key, value) in enumerate(raw):
        here = f"{where}: failure #{i + 1}"
        cats.append(_category(entry, _rate(key, value, basis, share_sum), here))
        if cats[-1].category in {c.category for c in cats[:-1]}:
            raise ModelError(f"{here}: category {cats[-1].category!r} given twice")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ModelError(f"{where}: name must be a non-empty string")
    return FailureModel(
        name=name, categories=tuple(cats), gpus_per_node=basis.gpus_per_node, planned_per_day=planned,
        description=str(data.get("description", "")), source=str(data.get("source", "")),
    )
