"""Every excerpt of the log corpus gets the category, evidence line and suspect its manifest names."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from trainguard.classify import CATEGORIES, classify_paths

CORPUS = Path(__file__).with_name("corpus")
CASES: list[dict[str, Any]] = tomllib.loads((CORPUS / "manifest.toml").read_text())["case"]


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_corpus_case(case: dict[str, Any]) -> None:
    [c] = classify_paths([CORPUS / case["file"]], verdict=case.get("verdict"))
    assert c.category == case["category"], c.explanation
    assert c.group == CATEGORIES.get(case["category"], "Unknown")
    if case["line"]:
        assert c.evidence, "expected an evidence line"
        assert c.evidence[0].line == case["line"], c.evidence[0]
        assert c.evidence[0].file == str(CORPUS / case["file"])
        assert c.evidence[0].text
    else:
        assert not [e for e in c.evidence if e.category == case["category"]]
    if "gpu" in case:
        assert c.gpu == case["gpu"]
    if "host" in case:
        assert c.host == case["host"]
    if case["category"] == "Unknown":
        assert c.confidence <= 0.2
    else:
        assert 0.0 < c.confidence <= 0.99


def test_corpus_covers_every_table5_category_and_app_xids() -> None:
    assert len(CASES) >= 40
    assert {c["category"] for c in CASES} >= set(CATEGORIES)
    files = {c["file"] for c in CASES}
    assert files == {p.name for p in CORPUS.iterdir() if p.name != "manifest.toml"}
    app_xids: set[int] = set()
    for case in CASES:
        [c] = classify_paths([CORPUS / case["file"]])
        app_xids |= set(c.xids) & {13, 31, 43, 45, 68}
    assert app_xids == {13, 31, 43, 45, 68}
