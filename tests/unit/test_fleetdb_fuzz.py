"""Seeded fuzzing of ``index`` and ``classify`` through the command line, in process: mutated event
files, logs and rules files must give an answer or a one-line error, never exit 70 or a traceback."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from trainguard.cli import main
from trainguard.errors import EXIT_INTERNAL
from trainguard.samples import SAMPLE_RUN

SEED = 20261130
BUDGET_SECONDS = 8.0  # per verb; the loops stop early rather than slow the suite down
_ODD_VALUES: list[Any] = ["", "x", "../../etc", "\ud800", -1, 0, 2**70, 1e308, -0.0, True, None, [], [1, "a"],
                          {}, {"k": [None]}, "7", 3.5]


def _sample_records() -> list[dict[str, Any]]:
    out = []
    for path in sorted((SAMPLE_RUN / "events").glob("*.jsonl")):
        with path.open() as f:
            for i, line in enumerate(f):
                if i >= 40:
                    break
                out.append(json.loads(line))
    return out


def _mutate_record(rng: random.Random, rec: dict[str, Any]) -> str:
    rec = dict(rec)
    for _ in range(rng.randint(0, 3)):
        key = rng.choice([*rec.keys(), "extra"])
        action = rng.random()
        if action < 0.6:
            rec[key] = rng.choice(_ODD_VALUES)
        elif action < 0.8:
            rec.pop(key, None)
        else:
            rec["type"] = rng.choice(["run_started", "diagnosis", "attempt_started", "node_excluded",
                                      "health_check", "failure_detected", "attempt_ended", "nope"])
    text = json.dumps(rec)
    roll = rng.random()
    if roll < 0.1:
        cut = rng.randint(0, len(text))
        text = text[:cut]
    elif roll < 0.15:
        text = "".join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(0, 40)))
    return text


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


def test_fuzz_index(tmp_path: Path, capsys: pytest.CaptureFixture[str], fleet_db: str) -> None:
    rng = random.Random(SEED)
    records = _sample_records()
    db = fleet_db
    deadline = time.monotonic() + BUDGET_SECONDS
    runs = 0
    for i in range(300):
        if time.monotonic() > deadline:
            break
        run = tmp_path / f"r{i % 7}"  # reused folder names on purpose
        events = run / "events"
        events.mkdir(parents=True, exist_ok=True)
        for old in events.iterdir():
            old.unlink()
        for w in range(rng.randint(1, 3)):
            # mostly one damaged record among good ones: a run full of damage is refused by the reader
            # before the index sees anything, which would hide the index's own handling
            lines = [json.dumps(rng.choice(records)) for _ in range(rng.randint(0, 12))]
            if lines and rng.random() < 0.8:
                lines[rng.randrange(len(lines))] = _mutate_record(rng, rng.choice(records))
            ending = "\n" if rng.random() < 0.9 else ""
            name = f"{rng.choice(['agent-a', 'rank-0', 'rank-1', 'x'])}{w}.jsonl"
            (events / name).write_bytes(("\n".join(lines) + ending).encode("utf-8", "surrogatepass"))
        code, err = _run(capsys, ["index", str(run), "--db", str(db), "--json"])
        assert code != EXIT_INTERNAL and "Traceback" not in err, err
        assert code in (0, 3), err
        runs += 1
    assert runs >= 20
    code, err = _run(capsys, ["hosts", "--db", str(db), "--json"])
    assert code == 0, err


_LOG_LINES = [
    "[  123.4] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
    "Nov 30 09:00:01 node-7 kernel: NVRM: Xid (PCI:0000:18:00): 48, pid=0, DBE (0x1) 172",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "  host      : gpu-node-0001",
    "[rank3]:[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7)",
    "mlx5_core 0000:5e:00.0: health compromised - reached miss count",
    "EDAC MC0: 1 UE memory read error on CPU_SrcID#0",
    "Traceback (most recent call last):",
]


def test_fuzz_classify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(SEED + 1)
    deadline = time.monotonic() + BUDGET_SECONDS
    done = 0
    for i in range(300):
        if time.monotonic() > deadline:
            break
        lines = []
        for _ in range(rng.randint(0, 30)):
            line = rng.choice(_LOG_LINES)
            if rng.random() < 0.4:
                pos = rng.randint(0, len(line))
                line = line[:pos] + "".join(chr(rng.randint(0, 0x10FF)) for _ in range(rng.randint(0, 5))) + line[pos:]
            if rng.random() < 0.1:
                line = line * rng.randint(2, 50)
            lines.append(line)
        data = "\n".join(lines).encode("utf-8", "surrogatepass")
        if rng.random() < 0.1:
            data = bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 200)))
        name = rng.choice(["x.log", "error.json", "y.gz", "k.txt"])
        path = tmp_path / f"{i}-{name}"
        path.write_bytes(data)
        argv = ["classify", "--json", str(path)]
        if rng.random() < 0.2:
            rules = tmp_path / f"{i}.toml"
            pattern = rng.choice(["^(a+)+$", "(a)\\\\1", "x(?=y)", "(", "Xid", "(?P<host>\\\\S+) x", "[[:alpha:]]+"])
            kw = rng.choice(["", "keywords = ['a']\n"])
            rules.write_text(f"[[rule]]\nid = 'f{i}'\ncategory = '{rng.choice(['CPU', 'Bogus', 'Unknown'])}'\n"
                             f"confidence = {rng.choice(['0.5', '2', 'true'])}\n{kw}pattern = '{pattern}'\n")
            argv[1:1] = ["--rules", str(rules)]
        if rng.random() < 0.1:
            argv.append("--combine")
        code, err = _run(capsys, argv)
        assert code != EXIT_INTERNAL and "Traceback" not in err, (argv, err)
        assert code in (0, 3), (argv, err)
        done += 1
    assert done >= 20
