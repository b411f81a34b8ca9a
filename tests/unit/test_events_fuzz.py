"""Seeded fuzzing of event files through the command line: `report --json` and `plan --from-run` on
valid runs that were truncated, bit-flipped, type-swapped, given huge numbers or deep JSON.

Whatever the damage, the verbs must end with a documented exit code (never 70, the internal-error
code), print no traceback, and a produced report must still account for every second of wall time.
Deterministic: one seed, a fixed number of cases (about 15-20 s on one core).
"""

from __future__ import annotations

import io
import json
import math
import random
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from tests.unit.streams import CASES
from trainguard.cli import main
from trainguard.core.eventlog import EventWriter
from trainguard.samples import SAMPLE_RUN

SEED = 20_251_111
REPORT_CASES = 260
PLAN_EVERY = 8  # `plan` runs a (tiny) simulation: check it on every 8th damaged run
SAMPLE_EVERY = 10  # the bundled sample is large: damage it on every 10th case, a small stream otherwise
EXPECTED = {0, 3}  # report produced, or bad input named (docs/goodput.md); never 70

_SWAPS: list[bytes] = [
    b'"x"', b"[1]", b'{"a":1}', b"true", b"false", b"null", b"1e308", b"-1e308", b"1e999", b"-1e9", b"1e9",
    b"0", b"-1", b"9223372036854775807", b"9223372036854775808", b"1000000000", b"NaN", b"-Infinity",
    b"9" * 5000, b"[" * 50_000 + b"]" * 50_000, b'"\\ud800"', b"[]", b"{}", b'""', b"0.0", b"1e-320",
]


def _stream_run(root: Path, rng: random.Random) -> None:
    case = rng.choice(CASES)()
    for name, records in case.writers.items():
        with EventWriter(root / "events" / f"{name}.jsonl") as w:
            w.write_all(records)


def _swap_value(line: bytes, rng: random.Random) -> bytes:
    """Replace the value of one top-level key of a JSON record with something of another kind."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return line
    if not isinstance(data, dict) or not data:
        return line
    key = rng.choice(sorted(data))
    marker = "\u0000swap\u0000"
    data[key] = marker
    return json.dumps(data).encode().replace(json.dumps(marker).encode(), rng.choice(_SWAPS), 1)


def _mutate(data: bytes, rng: random.Random) -> bytes:
    lines = data.splitlines(keepends=True)
    if not lines:
        return rng.choice(_SWAPS) + b"\n"
    kind = rng.randrange(8)
    i = rng.randrange(len(lines))
    if kind == 0:  # truncated anywhere (a full disk, a killed writer, a copy cut short)
        return data[: rng.randrange(len(data) + 1)]
    if kind == 1:  # flipped bits
        buf = bytearray(data)
        for _ in range(rng.randint(1, 6)):
            j = rng.randrange(len(buf))
            buf[j] ^= 1 << rng.randrange(8)
        return bytes(buf)
    if kind in (2, 3):  # a field of the wrong type or an absurd value
        lines[i] = _swap_value(lines[i], rng).rstrip(b"\n") + b"\n"
    elif kind == 4:  # a torn record glued onto the next
        lines[i] = lines[i][: rng.randrange(1, max(2, len(lines[i])))]
    elif kind == 5:  # a garbage line: deep JSON, a huge number, a bare value
        lines.insert(i, rng.choice(_SWAPS) + b"\n")
    elif kind == 6:  # a record repeated or lost
        if rng.random() < 0.5:
            lines.insert(i, lines[i])
        else:
            del lines[i]
    else:  # many small type swaps at once
        for _ in range(rng.randint(2, 10)):
            j = rng.randrange(len(lines))
            lines[j] = _swap_value(lines[j], rng).rstrip(b"\n") + b"\n"
    return b"".join(lines)


def _damaged_run(root: Path, rng: random.Random, use_sample: bool) -> None:
    if use_sample:
        shutil.copytree(SAMPLE_RUN, root)
    else:
        _stream_run(root, rng)
    files = sorted((root / "events").glob("*.jsonl"))
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(files)
        path.write_bytes(_mutate(path.read_bytes(), rng))


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def _check_report(doc: dict[str, Any]) -> None:
    wall = doc["wall_seconds"]
    parts = [doc["productive_seconds"], *doc["badput_seconds"].values()]
    assert all(math.isfinite(x) and x >= -1e-9 for x in [wall, *parts]), doc
    assert sum(parts) == pytest.approx(wall, rel=1e-3, abs=1e-6)
    assert 0.0 <= doc["ettr"] <= 1.0 + 1e-9


def test_damaged_event_files_never_crash_report_or_plan(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    outcomes: dict[int, int] = {}
    for n in range(REPORT_CASES):
        root = tmp_path / f"run-{n}"
        _damaged_run(root, rng, use_sample=n % SAMPLE_EVERY == 0)
        code, out, err = _cli("report", str(root), "--json")
        where = f"case {n} (seed {SEED}): {root}"
        assert code in EXPECTED, f"{where}: exit {code}: {err}"
        assert "Traceback" not in err and "internal error" not in err, where
        outcomes[code] = outcomes.get(code, 0) + 1
        if code == 0:
            _check_report(json.loads(out))
        else:
            assert out == "" and len(err.strip().splitlines()) == 1, f"{where}: {err}"
        if n % PLAN_EVERY == 0:
            code, out, err = _cli("plan", "--from-run", str(root), "--trials", "1", "--days", "1", "--gpus", "64",
                                  "--json")
            assert code in EXPECTED, f"{where}: plan exit {code}: {err}"
            assert "Traceback" not in err and "internal error" not in err, where
        shutil.rmtree(root)
    # The damage must be varied enough to reach both outcomes.
    assert outcomes.get(0, 0) > REPORT_CASES // 2 and outcomes.get(3, 0) > 0, outcomes
