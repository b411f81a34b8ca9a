"""Seeded fuzzing of `trainguard diagnose`: damaged dumps give exit 0, 1 or 3, never 70 or a traceback."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path
from typing import Any

import pytest

from trainguard.cli import main
from trainguard.localize.synth import FAULTS, SynthConfig, rank_dump, to_json_form

_WEIRD: list[Any] = [
    None, True, -1, 0, 2**63, -(2**70), 10**30, 1.5, float("nan"), "", "x" * 5000, "12", b"\x00\xff",
    [], [[]], [[1, "a"]], {}, {"a": [1]}, ("0", "default_pg"), [None], [[2**64]], ["Float", 3],
]


def _swap_types(raw: dict[str, Any], rng: random.Random) -> None:
    """Replace a few fields (entry fields, top-level fields, pg_status, pg_config) with wrong-typed values."""
    entries = raw.get("entries") or []
    for _ in range(rng.randint(1, 4)):
        where = rng.random()
        value = rng.choice(_WEIRD)
        if entries and where < 0.6:
            e = rng.choice(entries)
            e[rng.choice(sorted(e))] = value
        elif where < 0.75:
            raw[rng.choice(["version", "pg_config", "pg_status", "entries", "comm_lib_version"])] = value
        elif where < 0.9 and isinstance(raw.get("pg_status"), dict) and raw["pg_status"]:
            st = raw["pg_status"][rng.choice(sorted(raw["pg_status"]))]
            if isinstance(st, dict):
                st[rng.choice(["last_enqueued_collective", "last_completed_collective", 7])] = value
        elif isinstance(raw.get("pg_config"), dict) and raw["pg_config"]:
            cfg = raw["pg_config"][rng.choice(sorted(raw["pg_config"]))]
            if isinstance(cfg, dict):
                cfg[rng.choice(["ranks", "name", "desc"])] = value


def _mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    kind = rng.randrange(5)
    b = bytearray(data)
    if kind == 0:  # truncated
        return bytes(b[: rng.randrange(len(b))])
    if kind == 1:  # bit flips
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b)
    if kind == 2:  # a run of random bytes overwritten
        i = rng.randrange(len(b))
        n = rng.randint(1, 16)
        b[i:i + n] = rng.randbytes(n)
        return bytes(b)
    if kind == 3:  # bytes inserted or deleted
        i = rng.randrange(len(b))
        if rng.random() < 0.5:
            return bytes(b[:i] + rng.randbytes(rng.randint(1, 8)) + b[i:])
        return bytes(b[:i] + b[i + rng.randint(1, 8):])
    return rng.randbytes(rng.randint(1, 200))  # random garbage, sometimes with a pickle header
    # (kept last: the other mutations start from a valid dump)


def _case(rng: random.Random, d: Path) -> None:
    fault = rng.choice([f for f in FAULTS if f not in ("p2p-hang", "no-send")])  # both need pipelines
    backend = rng.choice(["nccl", "gloo"])
    cfg = SynthConfig(ranks=4, entries_per_rank=rng.randint(1, 8), fault=fault, culprit=rng.randrange(4),
                      backend=backend, version=rng.choice(["1.0", "2.4", "2.10"]))
    as_json = rng.random() < 0.25
    victims = set(rng.sample(range(4), rng.randint(1, 3)))
    for rank in range(4):
        raw = rank_dump(cfg, rank)
        if raw is None:
            continue
        if rank in victims and rng.random() < 0.5:
            _swap_types(raw, rng)
        try:
            data = json.dumps(to_json_form(raw)).encode() if as_json else pickle.dumps(raw, protocol=2)
        except (TypeError, ValueError, AttributeError):  # a swapped-in value JSON cannot write
            data = pickle.dumps(raw, protocol=2)
        if rank in victims and rng.random() < 0.6:
            data = _mutate_bytes(data, rng)
        (d / (f"fr_trace_rank_{rank}" + (".json" if as_json else ""))).write_bytes(data)


@pytest.mark.parametrize("seed", range(4))
def test_fuzzed_dumps_never_crash_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: int) -> None:
    rng = random.Random(seed)
    for i in range(60):
        d = tmp_path / f"case{i}"
        d.mkdir()
        _case(rng, d)
        rc = main(["diagnose", str(d), "--json"])
        out, err = capsys.readouterr()
        assert rc in (0, 1, 3), f"case {i} (seed {seed}): exit {rc}: {err}"
        assert "Traceback" not in err and "internal error" not in err, err
        if rc == 3:
            assert len(err.strip().splitlines()) == 1, err
        else:
            doc = json.loads(out)
            if doc["unreadable_ranks"]:
                assert doc["verdict"] != "healthy" and rc == 1


def _pipeline_case(rng: random.Random, d: Path) -> None:
    """Like `_case`, on pipelines (send/recv recorded on NCCL, only counted in op ids on gloo)."""
    pp = rng.choice([2, 4])
    fault = rng.choice(FAULTS)
    last_stage = 4 - 4 // pp  # first rank of the last stage: it never sends
    culprit = rng.randrange(last_stage if fault in ("p2p-hang", "no-send") else 4)
    cfg = SynthConfig(ranks=4, pp=pp, entries_per_rank=rng.randint(1, 12), fault=fault, culprit=culprit,
                      backend=rng.choice(["nccl", "gloo"]), recent=rng.choice([None, 2]))
    victims = set(rng.sample(range(4), rng.randint(1, 2)))
    for rank in range(4):
        raw = rank_dump(cfg, rank)
        if raw is None:
            continue
        if rank in victims and rng.random() < 0.5:
            _swap_types(raw, rng)
        data = pickle.dumps(raw, protocol=2)
        if rank in victims and rng.random() < 0.5:
            data = _mutate_bytes(data, rng)
        (d / f"fr_trace_rank_{rank}").write_bytes(data)


@pytest.mark.parametrize("seed", range(2))
def test_fuzzed_pipeline_dumps_never_crash_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   seed: int) -> None:
    rng = random.Random(1000 + seed)
    for i in range(40):
        d = tmp_path / f"case{i}"
        d.mkdir()
        _pipeline_case(rng, d)
        rc = main(["diagnose", str(d), "--json"])
        out, err = capsys.readouterr()
        assert rc in (0, 1, 3), f"case {i} (seed {seed}): exit {rc}: {err}"
        assert "Traceback" not in err and "internal error" not in err, err
        if rc != 3:
            doc = json.loads(out)
            if doc["unreadable_ranks"] or doc["verdict"] == "insufficient-evidence":
                assert rc == 1
