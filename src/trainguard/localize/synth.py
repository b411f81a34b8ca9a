"""Synthetic flight-recorder dumps at any scale, in torch's schema, with one planted fault.

Every rank runs the same schedule of steps (a few tensor-parallel all-reduces, then a data-parallel
all-reduce over the default group); the ring holds the last ``entries_per_rank`` entries. The fault
is planted in the schedule's final operation. NCCL-format dumps carry states, start/complete times and
a complete ``pg_config`` (what torch's own ``fr_trace`` needs); gloo-format dumps mimic what gloo
writes (state stays ``scheduled``, completion only via ``retired``, broken ``pg_config``, no p2p).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.localize.reader import parse_version

FAULTS = ("none", "hang", "desync", "mismatch", "crash", "p2p-hang")


@dataclass(frozen=True)
class SynthConfig:
    """What to generate."""

    ranks: int = 8
    entries_per_rank: int = 2000
    """Ring size: entries kept per rank (torch's default is 2,000)."""
    tp: int = 1
    """Tensor-parallel group size; 1 means the default group only."""
    fault: str = "none"
    """One of `FAULTS`."""
    culprit: int = 1
    fault_group: str = "default"
    """``default`` or ``tp`` (the culprit's tensor-parallel group)."""
    backend: str = "nccl"
    """``nccl`` or ``gloo``."""
    version: str = "2.10"
    """Format version to write; older versions drop or rename fields as those torch releases did."""
    frames: int = 12
    """Stack depth recorded per entry."""
    recent: int | None = None
    """Supervisor-evidence mode: keep only the last ``recent`` entries plus unfinished ones, frames only
    on unfinished ones, and in ``pg_config`` only the rank's own groups (the default group's member
    list left empty: the world is known from the run)."""
    start_step: int = 1000
    """Steps done before the ring's window (sequence numbers start high, as after a long run)."""

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; choose from {', '.join(FAULTS)}")
        if self.ranks < 2 or self.entries_per_rank < 1 or self.tp < 1 or self.ranks % self.tp:
            raise ValueError("need ranks >= 2, entries_per_rank >= 1 and tp dividing ranks")
        if not 0 <= self.culprit < self.ranks:
            raise ValueError(f"culprit {self.culprit} is not a rank of {self.ranks}")
        if self.backend not in ("nccl", "gloo"):
            raise ValueError("backend must be nccl or gloo")
        if self.fault == "p2p-hang" and self.backend == "gloo":
            raise ValueError("gloo records no point-to-point operations")
        if self.fault_group == "tp" and self.tp == 1:
            raise ValueError("fault_group 'tp' needs tp > 1")


def _frames(op: str, depth: int, file: str) -> list[dict[str, Any]]:
    base = [
        {"name": op, "filename": "/opt/torch/distributed/distributed_c10d.py", "line": 2501},
        {"name": "wrapper", "filename": "/opt/torch/distributed/c10d_logger.py", "line": 83},
    ]
    user = [{"name": f"layer_{i}", "filename": file, "line": 100 + i} for i in range(max(depth - 3, 0))]
    return (base + user + [{"name": "train_step", "filename": file, "line": 42}])[:depth]


class _Gen:
    def __init__(self, cfg: SynthConfig) -> None:
        self.cfg = cfg
        self.v = parse_version(cfg.version) or (2, 10)
        self.tp_groups = cfg.ranks // cfg.tp if cfg.tp > 1 else 0
        ops_per_step = (2 if cfg.tp > 1 else 0) + 1
        self.steps = -(-cfg.entries_per_rank // ops_per_step) + 1
        self.frames = {op: _frames(op, cfg.frames, "/job/train.py") for op in
                       ("all_reduce", "all_gather", "broadcast", "send", "recv")}
        default_ranks = str(list(range(cfg.ranks)))
        if cfg.backend == "gloo":
            self.pg_config: dict[str, Any] = {"": {"name": "", "desc": "", "ranks": "[]"}}
        else:
            self.pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": default_ranks}}
            for i in range(self.tp_groups):
                ranks = str(list(range(i * cfg.tp, (i + 1) * cfg.tp)))
                self.pg_config[str(i + 1)] = {"name": str(i + 1), "desc": "tp", "ranks": ranks}

    def schedule(self, rank: int) -> list[tuple[str, str, int, str, int]]:
        """(group name, desc, pg_id, op, collective seq) of every op of the window, oldest first."""
        cfg = self.cfg
        tp_name = str(rank // cfg.tp + 1) if self.tp_groups else ""
        out = []
        first = cfg.start_step
        for step in range(first, first + self.steps):
            if self.tp_groups:
                out.append((tp_name, "tp", 1, "all_reduce", 2 * step + 1))
                out.append((tp_name, "tp", 1, "all_reduce", 2 * step + 2))
            out.append(("0", "default_pg", 0, "all_reduce", step + 1))
        if cfg.fault_group == "tp":
            out.pop()  # the final op is then a tensor-parallel one
        return out

    def entry(self, rank: int, idx: int, group: str, desc: str, pg_id: int, op: str, seq: int,
              done: bool, size: int = 1024, p2p_seq: int = 0, peer: int | None = None) -> dict[str, Any]:
        cfg = self.cfg
        gloo = cfg.backend == "gloo"
        is_p2p = op in ("send", "recv")
        name = f"{cfg.backend}:{op}"
        if is_p2p:
            name += f" {rank}->{peer}" if op == "send" else f" {rank}<-{peer}"
        t = 1_700_000_000_000_000_000 + idx * 1_000_000
        e: dict[str, Any] = {
            "frames": self.frames[op],
            "record_id": idx,
            "pg_id": pg_id,
            "process_group": (group, desc),
            "collective_seq_id": seq,
            "p2p_seq_id": p2p_seq,
            "op_id": idx + 1,
            "profiling_name": name,
            "time_created_ns": t,
            "input_sizes": [[size]],
            "input_dtypes": ["Float"],
            "output_sizes": [[size * (cfg.ranks if op == "all_gather" else 1)]],
            "output_dtypes": ["Float"],
            "state": "scheduled" if gloo else ("completed" if done else "started"),
            "time_discovered_started_ns": None if gloo else t + 1000,
            "time_discovered_completed_ns": None if gloo or not done else t + 50_000,
            "retired": done,
            "timeout_ms": 600_000,
            "is_p2p": is_p2p,
            "thread_id": "140000000000000",
            "thread_name": "pt_main_thread",
        }
        if self.v < (2, 8):
            del e["thread_id"], e["thread_name"]
        if self.v < (2, 3):
            del e["input_dtypes"], e["output_dtypes"]
        if self.v < (2, 0):
            e["seq_id"] = p2p_seq if is_p2p else seq
            del e["collective_seq_id"], e["p2p_seq_id"], e["is_p2p"]
        return e

    def dump(self, rank: int) -> dict[str, Any] | None:
        cfg = self.cfg
        if cfg.fault == "crash" and rank == cfg.culprit:
            return None
        sched = self.schedule(rank)
        last_group = sched[-1][0]
        culprit_group = self.schedule(cfg.culprit)[-1][0]
        in_fault = cfg.fault in ("hang", "desync", "mismatch", "crash") and last_group == culprit_group
        if cfg.fault == "hang" and rank == cfg.culprit:
            sched = sched[:-1]
        entries = []
        base = cfg.start_step * 3
        # the evidence mode only needs the tail (the unfinished entries are the newest ones)
        window = sched[-(min(cfg.recent + 1, cfg.entries_per_rank) if cfg.recent is not None
                         else cfg.entries_per_rank):]
        offset = len(sched) - len(window)
        for i, (group, desc, pg_id, op, seq) in enumerate(window):
            final = i == len(window) - 1
            stuck = final and in_fault and not (cfg.fault == "hang" and rank == cfg.culprit)
            if final and rank == cfg.culprit and cfg.fault == "desync":
                op = "all_gather"
            size = 1000 if final and rank == cfg.culprit and cfg.fault == "mismatch" else 1024
            entries.append(self.entry(rank, base + offset + i, group, desc, pg_id, op, seq, not stuck, size))
        if cfg.fault == "p2p-hang":
            entries.extend(self._p2p(rank, base + len(sched)))
        if cfg.recent is not None:
            keep = entries[-cfg.recent:] if cfg.recent > 0 else []
            older = entries[: len(entries) - len(keep)]
            # older unfinished entries stay; finished ones keep no frames in the evidence mode
            entries = [e for e in older if not e["retired"]] + [
                e if not e["retired"] else dict(e, frames=[]) for e in keep]
        return self.top(rank, entries, sched)

    def _p2p(self, rank: int, idx: int) -> list[dict[str, Any]]:
        """Pairs (2i, 2i+1): the even rank sends, the odd one receives; the culprit never posts."""
        cfg = self.cfg
        pair_even = rank - rank % 2
        peer = rank + 1 if rank % 2 == 0 else rank - 1
        if peer >= cfg.ranks or rank == cfg.culprit:
            return []
        stuck = cfg.culprit in (pair_even, pair_even + 1)
        op = "send" if rank % 2 == 0 else "recv"
        return [self.entry(rank, idx, "0", "default_pg", 0, op, 0, not stuck, p2p_seq=1, peer=peer)]

    def top(self, rank: int, entries: list[dict[str, Any]], sched: list[Any]) -> dict[str, Any]:
        status: dict[str, dict[str, int]] = {}
        for _group, _desc, pg_id, _op, seq in sched:
            st = status.setdefault(str(pg_id), {"last_enqueued_collective": -1,
                                                "last_started_collective": -1,
                                                "last_completed_collective": -1})
            st["last_enqueued_collective"] = seq
        lib_key = "comm_lib_version" if self.v >= (2, 9) else "nccl_version"
        pg_config = self.pg_config
        if self.cfg.recent is not None and self.cfg.backend == "nccl":
            # evidence mode: only the rank's own groups; the default group's members are the world
            own = {str(g) for g, *_ in sched}
            pg_config = {k: (dict(v, ranks="[]") if v["desc"] == "default_pg" else v)
                         for k, v in self.pg_config.items() if k in own}
        top: dict[str, Any] = {"version": self.cfg.version, "pg_config": pg_config, lib_key: "2.21.5",
                               "pg_status": status, "entries": entries}
        if self.v < (2, 0):
            del top["pg_status"]
        return top


def rank_dump(cfg: SynthConfig, rank: int) -> dict[str, Any] | None:
    """One rank's dump as torch's pickle holds it, or None for a crashed rank."""
    return _Gen(cfg).dump(rank)


def to_json_form(dump: dict[str, Any]) -> dict[str, Any]:
    """The JSON variant torch writes: no frames, 0 instead of None times, string pg_status values."""
    out = {k: v for k, v in dump.items() if k != "entries"}
    out["pg_status"] = {k: {kk: str(vv) for kk, vv in v.items()} for k, v in dump.get("pg_status", {}).items()}
    out["entries"] = [
        {k: (0 if v is None and k.startswith("time_") else list(v) if isinstance(v, tuple) else v)
         for k, v in e.items() if k != "frames"}
        for e in dump.get("entries", [])
    ]
    return out


def iter_dumps(cfg: SynthConfig, fmt: str = "pickle") -> Iterator[tuple[int, bytes]]:
    """(rank, encoded dump) for every rank that leaves one, generated one at a time."""
    gen = _Gen(cfg)
    for rank in range(cfg.ranks):
        d = gen.dump(rank)
        if d is None:
            continue
        if fmt == "json":
            yield rank, json.dumps(to_json_form(d)).encode()
        else:
            yield rank, pickle.dumps(d, protocol=2)


def write_dumps(cfg: SynthConfig, directory: str | Path, *, prefix: str = "nccl_trace_rank_",
                fmt: str = "pickle") -> list[Path]:
    """Write one file per rank (``<prefix><rank>``, plus ``.json`` for JSON) and return the paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, data in iter_dumps(cfg, fmt):
        p = d / (f"{prefix}{rank}" + (".json" if fmt == "json" else ""))
        p.write_bytes(data)
        paths.append(p)
    return paths
