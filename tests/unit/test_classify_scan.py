"""The C pre-filter loses nothing: every line a rule matches is found, whatever the block boundaries and the
line lengths."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainguard.classify import classify_paths, default_rules
from trainguard.classify import scan as scan_mod
from trainguard.classify.scan import Accumulator, Scanner

CORPUS = Path(__file__).with_name("corpus")
RULES = default_rules()


def _direct_counts(text: str) -> tuple[dict[str, int], dict[int, int]]:
    """Per rule, the lines it matches when tried on every line in Python, with no pre-filter at all."""
    counts: dict[str, int] = {}
    xids: dict[int, int] = {}
    by_id = {r.id: r for r in RULES.rules}
    for line in text.splitlines():
        matched = set()
        for r in RULES.rules:
            if r.keywords and not any(k in line for k in r.keywords):
                continue
            if r.pattern.search(line) and not (r.unless is not None and r.unless.search(line)):
                matched.add(r.id)
        superseded = {x for rid in matched for x in by_id[rid].supersedes}
        for rid in matched - superseded:
            counts[rid] = counts.get(rid, 0) + 1
        m = RULES.xid_pattern.search(line)
        if m:
            code = int(m.group("code"))
            xids[code] = xids.get(code, 0) + 1
    return counts, xids


def _corpus_texts() -> list[Path]:
    return sorted(p for p in CORPUS.rglob("*") if p.is_file() and p.name != "manifest.toml" and p.suffix != ".json")


@pytest.mark.parametrize("path", _corpus_texts(), ids=lambda p: str(p.relative_to(CORPUS)))
def test_prefilter_finds_every_line_a_rule_matches(path: Path) -> None:
    text = path.read_text()
    acc = Accumulator()
    Scanner(RULES).scan_stream(io.BytesIO(text.encode()), path.name, acc)
    expected_counts, expected_xids = _direct_counts(text)
    xid_rules = {k: v for k, v in acc.counts.items() if k.startswith("xid-")}
    assert {k: v for k, v in acc.counts.items() if k not in xid_rules} == expected_counts
    assert acc.xids == expected_xids
    assert acc.lines == len(text.splitlines())


def test_trigger_words_cover_every_keyword() -> None:
    scanner = Scanner(RULES)
    words = set(scanner.trigger_words)
    assert all(k in words for r in RULES.rules for k in r.keywords)
    assert "Xid" in words and scanner.trigger_patterns == ()


# Lines made of pieces that trigger rules, pieces that do not, and long runs that cross block boundaries.
PIECES = [
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
    "KeyError: 'lr'", "ModuleNotFoundError: No module named 'apex'",
    "pcieport 0000:15:01.0: AER: Uncorrected (Fatal) error received: 0000:16:00.0",
    "mlx5_core 0000:4b:00.0: poll_health:955:(pid 0): Fatal error 1 detected",
    "    SRAM Uncorrectable SEC-DED    : 3", "GPU 00000000:5D:00.0",
    "step 12 loss 2.31 tokens/s 81234", "NCCL INFO Channel 02/0 : 27[3] -> 35[3] via NET/IB/3/GDRDMA",
    "x" * 50, "é∂ unicode ☃", "\r", "", " ", "Xi", "d", "error", "AER",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(st.lists(st.sampled_from(PIECES), max_size=4).map("".join), max_size=40),
    chunk=st.integers(min_value=1, max_value=300),
    max_line=st.integers(min_value=8, max_value=200),
    trailing_newline=st.booleans(),
    workers=st.sampled_from([1, 3]),
)
def test_streaming_equals_line_by_line(monkeypatch: pytest.MonkeyPatch, lines: list[str], chunk: int,
                                       max_line: int, trailing_newline: bool, workers: int) -> None:
    monkeypatch.setattr(scan_mod, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(scan_mod, "WORKERS", workers)  # searched ahead in threads, or all in this one
    data = "\n".join(lines).encode() + (b"\n" if trailing_newline and lines else b"")
    scanner = Scanner(RULES, max_line_bytes=max_line)
    streamed = Accumulator()
    scanner.scan_stream(io.BytesIO(data), "f", streamed)
    reference = Accumulator()
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    for n, raw in enumerate(raw_lines, start=1):
        scanner.match_line(raw[:max_line].decode("utf-8", "replace"), "f", n, reference)
    assert streamed.lines == len(raw_lines)
    assert streamed.counts == reference.counts and streamed.xids == reference.xids
    assert {r: [h.line for h in hs] for r, hs in streamed.hits.items()} == \
        {r: [h.line for h in hs] for r, hs in reference.hits.items()}


def test_same_verdicts_with_tiny_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = sorted(p for p in CORPUS.iterdir() if p.name != "manifest.toml")
    before = [c.to_json() for c in classify_paths(paths)]
    monkeypatch.setattr(scan_mod, "CHUNK_BYTES", 7)
    after = [c.to_json() for c in classify_paths(paths)]
    assert after == before
