"""Failure models as data: per-category rates, detection, repair paths, loaded from TOML files.

Built-in models live in ``sim/models/<name>.toml`` (``llama3``, ``rsc1``, ``rsc2``); a user file uses
the same schema (docs/simulation.md). Every value is validated; a bad file raises `InputError`
(unreadable, malformed TOML) or `UsageError` (a wrong value), each with a one-line message.
"""

from __future__ import annotations

import logging
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.errors import InputError, UsageError
from trainguard.taxonomy import TABLE5_CATEGORIES, UNKNOWN

log = logging.getLogger(__name__)

MODELS_DIR = Path(__file__).parent / "models"

TABLE5_GROUPS: dict[str, str] = {**TABLE5_CATEGORIES, UNKNOWN: UNKNOWN}
"""Llama 3 Table 5 root-cause categories (verbatim) and their groups; ``Unknown`` for the rest."""

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
            raise UsageError(
                f"unknown failure model {text_name!r} (built-in: {', '.join(builtin_models())}; "
                "or give the path of a .toml file)"
            )
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: malformed TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from None
    return parse_model(data, where=str(path), default_name=path.stem)


def _number(where: str, key: str, value: Any, *, positive: bool = False, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UsageError(f"{where}: {key} must be a finite number, not {value!r}")
    if integer and not isinstance(value, int):
        raise UsageError(f"{where}: {key} must be an integer, not {value!r}")
    if value < 0 or (positive and value == 0):
        raise UsageError(f"{where}: {key} must be {'positive' if positive else 'non-negative'}, not {value!r}")
    return float(value)


def _choice(where: str, key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise UsageError(f"{where}: {key} must be one of {', '.join(allowed)}, not {value!r}")
    return str(value)


def parse_model(data: dict[str, Any], *, where: str = "model", default_name: str = "custom") -> FailureModel:
    """Validate a model's TOML data and turn counts/shares into per-GPU-hour rates."""
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(sorted(_TOP_KEYS))})")
    gpn = int(_number(where, "gpus_per_node", data.get("gpus_per_node", 8), positive=True, integer=True))
    planned = _number(where, "planned_per_day", data.get("planned_per_day", 0.0))
    observed = data.get("observed")
    obs_gpu_hours: float | None = None
    if observed is not None:
        if not isinstance(observed, dict) or set(observed) - {"gpus", "days"} or len(observed) != 2:
            raise UsageError(f"{where}: [observed] needs exactly gpus and days")
        obs_gpu_hours = _number(where, "observed.gpus", observed["gpus"], positive=True) * _number(
            where, "observed.days", observed["days"], positive=True) * 24.0
    total: float | None = None
    if "total_per_node_day" in data and "total_per_gpu_hour" in data:
        raise UsageError(f"{where}: give total_per_node_day or total_per_gpu_hour, not both")
    if "total_per_node_day" in data:
        total = _number(where, "total_per_node_day", data["total_per_node_day"]) / gpn / 24.0
    elif "total_per_gpu_hour" in data:
        total = _number(where, "total_per_gpu_hour", data["total_per_gpu_hour"])
    failures = data.get("failure", [])
    if not isinstance(failures, list) or not failures:
        raise UsageError(f"{where}: needs at least one [[failure]] table")
    raw: list[tuple[dict[str, Any], str, float]] = []
    for i, entry in enumerate(failures):
        here = f"{where}: failure #{i + 1}"
        if not isinstance(entry, dict):
            raise UsageError(f"{here}: must be a table")
        bad = sorted(set(entry) - _FAILURE_KEYS)
        if bad:
            raise UsageError(f"{here}: unknown field {bad[0]!r}")
        rate_keys = [k for k in _RATE_KEYS if k in entry]
        if len(rate_keys) != 1:
            raise UsageError(f"{here}: give exactly one of {', '.join(_RATE_KEYS)}")
        key = rate_keys[0]
        if key == "count" and obs_gpu_hours is None:
            raise UsageError(f"{here}: count needs an [observed] table (gpus, days)")
        if key == "share" and total is None:
            raise UsageError(f"{here}: share needs total_per_node_day or total_per_gpu_hour")
        raw.append((entry, key, _number(here, key, entry[key])))
    share_sum = sum(v for _, k, v in raw if k == "share")
    if total is not None and share_sum <= 0:
        raise UsageError(f"{where}: shares must not all be zero")
    cats: list[FailureCategory] = []
    seen: set[str] = set()
    for i, (entry, key, value) in enumerate(raw):
        here = f"{where}: failure #{i + 1}"
        cat = entry.get("category")
        if cat not in TABLE5_GROUPS:
            raise UsageError(f"{here}: unknown category {cat!r} (use a Llama 3 Table 5 category or 'Unknown')")
        if cat in seen:
            raise UsageError(f"{here}: category {cat!r} given twice")
        seen.add(cat)
        group = entry.get("group", TABLE5_GROUPS[cat])
        if group != TABLE5_GROUPS[cat]:
            raise UsageError(f"{here}: {cat!r} belongs to group {TABLE5_GROUPS[cat]!r}, not {group!r}")
        if key == "rate_per_gpu_hour":
            rate = value
        elif key == "rate_per_node_day":
            rate = value / gpn / 24.0
        elif key == "count":
            rate = value / (obs_gpu_hours or 1.0)
        else:
            rate = (total or 0.0) * value / share_sum
        dist = _choice(here, "distribution", entry.get("distribution", "exponential"), DISTRIBUTIONS)
        shape = _number(here, "shape", entry.get("shape", 1.0), positive=True)
        if dist == "exponential" and shape != 1.0:
            raise UsageError(f"{here}: shape applies only to distribution = \"weibull\"")
        det_s = entry.get("detection_seconds")
        recurrence = _number(here, "recurrence", entry.get("recurrence", 0.0))
        if recurrence > 1:
            raise UsageError(f"{here}: recurrence is a probability (0..1), not {recurrence!r}")
        cats.append(FailureCategory(
            category=cat, group=group, rate_per_gpu_hour=rate,
            scope=_choice(here, "scope", entry.get("scope", "gpu"), SCOPES),
            distribution=dist, shape=shape,
            detection=_choice(here, "detection", entry.get("detection", "crash"), DETECTIONS),
            detection_seconds=None if det_s is None else _number(here, "detection_seconds", det_s),
            repair=_choice(here, "repair", entry.get("repair", "replace"), REPAIRS),
            repair_hours=_number(here, "repair_hours", entry.get("repair_hours", 48.0)),
            recurrence=recurrence,
        ))
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise UsageError(f"{where}: name must be a non-empty string")
    return FailureModel(
        name=name, categories=tuple(cats), gpus_per_node=gpn, planned_per_day=planned,
        description=str(data.get("description", "")), source=str(data.get("source", "")),
    )
