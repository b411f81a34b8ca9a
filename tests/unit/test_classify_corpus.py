"""Every excerpt of the log corpus gets the category, evidence line and suspect its manifest names, and where an
upstream failure explains later errors, those come after it and are attributed to it (cause before consequence)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from trainguard.classify import classify_paths, default_rules
from trainguard.classify.engine import explainers
from trainguard.core.taxonomy import TABLE5_CATEGORIES, group_of

CORPUS = Path(__file__).with_name("corpus")
CASES: list[dict[str, Any]] = tomllib.loads((CORPUS / "manifest.toml").read_text())["case"]


def _key_file(case: dict[str, Any]) -> Path:
    """The file the key line is in: the case itself, or ``key_file`` inside a case that is a directory."""
    return CORPUS / case["file"] / case["key_file"] if "key_file" in case else CORPUS / case["file"]


def _where(case: dict[str, Any], ref: int | str) -> tuple[str, int]:
    """A consequence as (file, line): an int is a line of the key file, ``name:line`` a file of the case dir."""
    if isinstance(ref, int):
        return str(_key_file(case)), ref
    name, line = ref.rsplit(":", 1)
    return str(CORPUS / case["file"] / name), int(line)


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_corpus_case(case: dict[str, Any]) -> None:
    [c] = classify_paths([CORPUS / case["file"]], verdict=case.get("verdict"))
    assert c.category == case["category"], c.explanation
    assert c.group == group_of(case["category"])
    if case["line"]:
        assert c.evidence, "expected an evidence line"
        key = c.evidence[0]
        assert (key.file, key.line) == (str(_key_file(case)), case["line"]), key
        assert key.text and key.explained_by is None
    else:
        assert not [e for e in c.evidence if e.category == case["category"]]
    for k in ("gpu", "host", "device"):
        if k in case:
            assert getattr(c, k) == case[k], k
    if case["category"] == "Unknown":
        assert c.confidence <= 0.2
    else:
        assert 0.0 < c.confidence <= 0.99


_EXPLAINS = explainers(default_rules())


@pytest.mark.parametrize("case", [c for c in CASES if "consequences" in c],
                         ids=[c["file"] for c in CASES if "consequences" in c])
def test_corpus_consequences_follow_their_cause(case: dict[str, Any]) -> None:
    """The lines the manifest names as consequences are in the evidence, explained by the key line, and come
    after it in the log; the key line itself is explained by nothing."""
    [c] = classify_paths([CORPUS / case["file"]])
    key = c.evidence[0]
    cause = f"{key.file}:{key.line}"
    by_place = {(e.file, e.line): e for e in c.evidence}
    for ref in case["consequences"]:
        file, line = _where(case, ref)
        assert (file, line) in by_place, f"{file}:{line} not in the evidence"
        e = by_place[(file, line)]
        assert e.explained_by == cause, e
        # a consequence keeps what it alone points to; one of its cause's own category only where the cause's rule
        # names the consequence's rule (an NFS outage, then the job's EIO)
        assert e.category != c.category or e.rule in _EXPLAINS[key.rule].rules, e
        if file == key.file:
            assert line > key.line
    assert "explains" in c.explanation


def test_corpus_size_and_coverage() -> None:
    assert len(CASES) >= 100
    assert {c["category"] for c in CASES} >= set(TABLE5_CATEGORIES)
    files = {c["file"] for c in CASES}
    on_disk = {p.name for p in CORPUS.iterdir() if p.name not in ("manifest.toml", "causes", "real")}
    on_disk |= {f"causes/{p.name}" for p in (CORPUS / "causes").iterdir()}
    assert files == on_disk
    app_xids: set[int] = set()
    for case in CASES:
        [c] = classify_paths([CORPUS / case["file"]])
        app_xids |= set(c.xids) & {13, 31, 43, 45, 68}
    assert app_xids == {13, 31, 43, 45, 68}
    families = {  # the formats issue 12 names, each with several excerpts
        "mlx5/ConnectX and IB": ("mlx5", "ib", "devlink", "nccl_ib", "switch_port", "ufm", "perfquery"),
        "PCIe AER chains": ("aer", "pcie", "retimer", "ipmi_sel_bus"),
        "nvidia-smi -q and DCGM": ("nvidia_smi", "dcgm"),
        "storage and network services": ("s3", "gcs", "hf_hub", "azure", "mountpoint", "lustre", "nfs", "dns",
                                         "image_pull", "quota", "requests", "urllib3"),
        "BMC/Redfish/IPMI": ("redfish", "openbmc", "ipmi_sel", "bmc", "hpe_iml", "psu"),
    }
    for family, prefixes in families.items():
        n = sum(1 for f in files if f.startswith(prefixes))
        assert n >= 6, f"{family}: only {n} excerpts"
    assert sum(1 for c in CASES if "consequences" in c) >= 8


def test_causes_corpus_covers_each_class_of_issue_26() -> None:
    """The excerpts of causes behind consequences: at least 40, half of them with the cause behind louder
    consequences or a red herring, and at least two of each class."""
    causes = [c for c in CASES if c["file"].startswith("causes/")]
    assert len(causes) >= 40
    assert sum(1 for c in causes if c["behind"]) * 2 >= len(causes)
    classes = {
        "host-wide loss": ("power_", "chassis_", "all_gpus_"),
        "firmware before driver": ("gsp_",),
        "implausible sensor jump": ("sensor_jump_",),
        "orchestrator before signals": ("kured_drain", "kubectl_", "gce_", "aws_", "azure_", "node_not_"),
        "replica divergence": ("sdc_",),
    }
    for name, prefixes in classes.items():
        cases = [c for c in causes if c["file"].removeprefix("causes/").startswith(prefixes)]
        assert len({c["category"] for c in cases} - {"Unknown"}) >= 1 and len(cases) >= 2, name
