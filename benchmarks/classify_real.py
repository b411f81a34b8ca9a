"""Benchmark: `trainguard classify` on real log excerpts from public threads (tests/unit/corpus/real).

Each case of the corpus's manifest names the category its thread established, its split (``dev`` or
``heldout``, fixed by a hash of the id before any rule was written for it) and its collection batch (1: before
the issue-32 rules were written, 2: after). Prints one JSON object: accuracy on each half, per batch and in
all, the confusion table (expected -> answered -> count), the confidence bands (answers at >= 0.9, 0.7-0.9,
0.5-0.7, < 0.5: how many, how many right), the ceiling (how many cases of each half are reachable from their text
at all, by ``audit.toml``: a reader's verdict, per missed case, on whether its excerpt shows the labelled cause)
and every case's answer.
Usage: ``python benchmarks/classify_real.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

from trainguard.classify import classify_paths

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "unit" / "corpus" / "real"
BANDS: tuple[tuple[str, float, float], ...] = (
    (">=0.9", 0.9, 2.0), ("0.7-0.9", 0.7, 0.9), ("0.5-0.7", 0.5, 0.7), ("<0.5", -1.0, 0.5))


def load_manifest(corpus: Path = CORPUS) -> list[dict[str, Any]]:
    """The manifest's cases, in file order."""
    with (corpus / "manifest.toml").open("rb") as f:
        cases: list[dict[str, Any]] = tomllib.load(f)["case"]
    return cases


def evaluate(corpus: Path = CORPUS) -> dict[str, Any]:
    """Classifies every case and returns the figures printed by the benchmark."""
    cases = load_manifest(corpus)
    results = []
    for case in cases:
        [c] = classify_paths([corpus / case["file"]])
        results.append({"id": case["id"], "split": case["split"], "batch": case.get("batch", 1), "kind": case["kind"],
                        "expected": case["category"], "answer": c.category,
                        "confidence": round(c.confidence, 3), "right": c.category == case["category"]})
    doc: dict[str, Any] = {"benchmark": "classify_real", "cases": len(results)}
    for split in ("dev", "heldout"):
        part = [r for r in results if r["split"] == split]
        doc[split] = {"right": sum(r["right"] for r in part), "total": len(part),
                      "accuracy": round(sum(r["right"] for r in part) / len(part), 3) if part else None}
    for batch in sorted({r["batch"] for r in results}):
        part = [r for r in results if r["batch"] == batch]
        doc[f"batch_{batch}"] = {split: {"right": sum(r["right"] for r in part if r["split"] == split),
                                         "total": sum(r["split"] == split for r in part)}
                                 for split in ("dev", "heldout")}
    doc["all"] = {"right": sum(r["right"] for r in results), "total": len(results),
                  "accuracy": round(sum(r["right"] for r in results) / len(results), 3) if results else None}
    confusion: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in results:
        confusion[r["expected"]][r["answer"]] += 1
    doc["confusion"] = {k: dict(sorted(v.items())) for k, v in sorted(confusion.items())}
    bands = {}
    for name, low, high in BANDS:
        part = [r for r in results if low <= r["confidence"] < high]
        bands[name] = {"answers": len(part), "right": sum(r["right"] for r in part)}
    doc["confidence_bands"] = bands
    doc["ceiling"] = ceiling(results, load_audit(corpus))
    doc["results"] = results
    return doc


UNREACHABLE = ("not-in-text", "contradicts")
"""Audit verdicts of a case whose labelled cause cannot be read from its excerpt alone."""


def load_audit(corpus: Path = CORPUS) -> dict[str, str]:
    """The audit's verdict per case id (``audit.toml``), empty when there is none."""
    path = corpus / "audit.toml"
    if not path.is_file():
        return {}
    with path.open("rb") as f:
        return {a["id"]: a["verdict"] for a in tomllib.load(f)["audit"]}


def ceiling(results: list[dict[str, Any]], audit: dict[str, str]) -> dict[str, Any]:
    """Per split, the most a reading of the text alone could get right: every case but the misses whose cause the
    audit found absent from (or contradicted by) the excerpt; misses nobody audited count as reachable."""
    out: dict[str, Any] = {}
    for split in ("dev", "heldout"):
        part = [r for r in results if r["split"] == split]
        misses = [r for r in part if not r["right"]]
        unreachable = [r["id"] for r in misses if audit.get(r["id"]) in UNREACHABLE]
        reach = len(part) - len(unreachable)
        out[split] = {"reachable": reach, "total": len(part),
                      "accuracy": round(reach / len(part), 3) if part else None,
                      "misses_unaudited": sum(r["id"] not in audit for r in misses),
                      "misses_not_in_text": sorted(unreachable)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", help="also write the JSON to this file")
    args = ap.parse_args()
    text = json.dumps(evaluate(), indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
