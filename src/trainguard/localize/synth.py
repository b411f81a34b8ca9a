"""Synthetic flight-recorder dumps at any scale, in torch's schema, with one planted fault.

Every rank runs the same schedule of steps (a pipeline receive, a few tensor-parallel all-reduces, a
pipeline send, then a data-parallel all-reduce over the default group); the ring holds the last
``entries_per_rank`` entries. The fault is planted in the final step, and which ops then finish follows
from who waits for whom. NCCL-format dumps carry states, start/complete times and a complete
``pg_config`` (what torch's own ``fr_trace`` needs); gloo-format dumps mimic what gloo writes (state
stays ``scheduled``, completion only via ``retired``, broken ``pg_config``, no send/recv entries but
op ids and ``pg_status`` that count them).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from trainguard.localize.reader import parse_version

FAULTS = ("none", "hang", "desync", "mismatch", "crash", "p2p-hang", "no-send")


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
    pp: int = 1
    """Pipeline stages. Rank r is stage ``r // (ranks // pp)``; every step it receives from the rank
    ``ranks // pp`` below (stages > 0), runs its tensor-parallel all-reduces, sends to the rank
    ``ranks // pp`` above (stages < pp - 1), then all-reduces over the default group. send/recv are
    in the default group: recorded on NCCL, only counted in op ids on gloo."""

    def __post_init__(self) -> None:
        if self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; choose from {', '.join(FAULTS)}")
        if self.ranks < 2 or self.entries_per_rank < 1 or self.tp < 1 or self.pp < 1 or self.ranks % self.tp:
            raise ValueError("need ranks >= 2, entries_per_rank >= 1 and tp dividing ranks")
        if self.ranks % self.pp or (self.ranks // self.pp) % self.tp:
            raise ValueError("pp must divide ranks, and tp the ranks of one stage")
        if not 0 <= self.culprit < self.ranks:
            raise ValueError(f"culprit {self.culprit} is not a rank of {self.ranks}")
        if self.backend not in ("nccl", "gloo"):
            raise ValueError("backend must be nccl or gloo")
        if self.fault == "p2p-hang" and self.backend == "gloo" and self.pp == 1:
            raise ValueError("gloo records no point-to-point operations (use pp > 1 to model them in op ids)")
        if self.fault == "no-send" and self.pp == 1:
            raise ValueError("fault 'no-send' needs pipeline stages (pp > 1)")
        last_stage = self.culprit // (self.ranks // self.pp) >= self.pp - 1
        if self.fault in ("no-send", "p2p-hang") and self.pp > 1 and last_stage:
            raise ValueError(f"fault {self.fault!r}: the culprit must be in a stage that sends (not the last)")
        if self.fault_group == "tp" and self.tp == 1:
            raise ValueError("fault_group 'tp' needs tp > 1")


def _frames(op: str, depth: int, file: str) -> list[dict[str, Any]]:
    base = [
        {"name": op, "filename": "/opt/torch/distributed/distributed_c10d.py", "line": 2501},
        {"name": "wrapper", "filename": "/opt/torch/distributed/c10d_logger.py", "line": 83},
    ]
    user = [{"name": f"layer_{i}", "filename": file, "line": 100 + i} for i in range(max(depth - 3, 0))]
    return (base + user + [{"name": "train_step", "filename": file, "line": 42}])[:depth]


class _Op(NamedTuple):
    """One operation of a rank's schedule, with the counters torch gives it."""

    group: str
    desc: str
    pg_id: int
    op: str
    seq: int
    """Collective sequence number (for send/recv: the group's current one, as torch records it)."""
    p2p_seq: int
    op_id: int
    """Counts every op of the group, send/recv included."""
    peer: int | None = None
    size: int = 1024


class _Gen:
    def __init__(self, cfg: SynthConfig) -> None:
        self.cfg = cfg
        self.v = parse_version(cfg.version) or (2, 10)
        self.gloo = cfg.backend == "gloo"
        self.tp_groups = cfg.ranks // cfg.tp if cfg.tp > 1 else 0
        self.width = cfg.ranks // cfg.pp
        recorded = (2 if cfg.tp > 1 else 0) + 1  # entries per step (at least)
        self.steps = -(-cfg.entries_per_rank // recorded) + 1
        self.frames = {op: _frames(op, cfg.frames, "/job/train.py") for op in
                       ("all_reduce", "all_gather", "broadcast", "send", "recv")}
        default_ranks = str(list(range(cfg.ranks)))
        if self.gloo:
            self.pg_config: dict[str, Any] = {"": {"name": "", "desc": "", "ranks": "[]"}}
        else:
            self.pg_config = {"0": {"name": "0", "desc": "default_pg", "ranks": default_ranks}}
            for i in range(self.tp_groups):
                ranks = str(list(range(i * cfg.tp, (i + 1) * cfg.tp)))
                self.pg_config[str(i + 1)] = {"name": str(i + 1), "desc": "tp", "ranks": ranks}
        self._final: dict[int, tuple[list[_Op], int]] | None = None

    def step_ops(self, rank: int, step: int) -> list[_Op]:
        """The ops of one healthy step, in order."""
        cfg = self.cfg
        stage = rank // self.width
        recv = cfg.pp > 1 and stage > 0
        send = cfg.pp > 1 and stage < cfg.pp - 1
        per_step = int(recv) + int(send)  # send/recv per step in the default group
        ops0 = step * (1 + per_step)  # default-group ops of the steps before
        p2p0 = step * per_step
        out: list[_Op] = []
        k = 0
        if recv:
            k += 1
            out.append(_Op("0", "default_pg", 0, "recv", step, p2p0 + k, ops0 + k, rank - self.width))
        if self.tp_groups:
            tp_name = str(rank // cfg.tp + 1)
            out.append(_Op(tp_name, "tp", 1, "all_reduce", 2 * step + 1, 0, 2 * step + 1))
            out.append(_Op(tp_name, "tp", 1, "all_reduce", 2 * step + 2, 0, 2 * step + 2))
        if send:
            k += 1
            out.append(_Op("0", "default_pg", 0, "send", step, p2p0 + k, ops0 + k, rank + self.width))
        out.append(_Op("0", "default_pg", 0, "all_reduce", step + 1, 0, ops0 + k + 1))
        return out

    def final_ops(self, rank: int) -> list[_Op]:
        """The last step's ops as the rank calls them, fault included (a crashed rank's up to its death)."""
        cfg = self.cfg
        step = self.step_ops(rank, cfg.start_step + self.steps - 1)
        ops = list(step)
        if cfg.fault_group == "tp":
            # the final collective is then a tensor-parallel one (pipeline sends stay)
            ops = [o for o in ops if o.group != "0" or o.peer is not None]
        if rank != cfg.culprit:
            return ops
        want = "tp" if cfg.fault_group == "tp" else "default_pg"
        t = max(i for i, o in enumerate(ops) if o.desc == want and o.peer is None)
        if cfg.fault in ("hang", "crash"):
            del ops[t]
        elif cfg.fault == "desync":
            ops[t] = ops[t]._replace(op="all_gather")
        elif cfg.fault == "mismatch":
            ops[t] = ops[t]._replace(size=1000)
        elif cfg.fault == "p2p-hang" and cfg.pp > 1:
            ops = [o for o in ops if o.op != "send"]  # skips its send, carries on
        elif cfg.fault == "no-send":
            ops = ops[: next((i + 1 for i, o in enumerate(ops) if o.op == "recv"), 0)]  # stops after receiving
        return _renumber(ops, step)

    def final_state(self) -> dict[int, tuple[list[_Op], int]]:
        """Per rank: its final-step ops and how many of them finished.

        Every rank calls its ops in order and stays in the first one that cannot finish: a collective
        finishes when every member is in it with the same op and size, a send/recv when the peer is in
        the matching recv/send. Computed once for all ranks."""
        if self._final is not None:
            return self._final
        cfg = self.cfg
        ops = {r: self.final_ops(r) for r in range(cfg.ranks)}
        pos = dict.fromkeys(ops, 0)
        members: dict[str, int] = {"0": cfg.ranks}
        moved = True
        while moved:
            moved = False
            at: dict[tuple[str, int], list[int]] = {}
            for r, rops in ops.items():
                if pos[r] < len(rops) and rops[pos[r]].peer is None:
                    o = rops[pos[r]]
                    at.setdefault((o.group, o.seq), []).append(r)
            for (group, _seq), rs in at.items():
                first = ops[rs[0]][pos[rs[0]]]
                if (len(rs) == members.get(group, cfg.tp)
                        and all((ops[r][pos[r]].op, ops[r][pos[r]].size) == (first.op, first.size) for r in rs)):
                    for r in rs:
                        pos[r] += 1
                    moved = True
            for r, rops in ops.items():
                if pos[r] < len(rops) and rops[pos[r]].op == "send":
                    q = rops[pos[r]].peer
                    assert q is not None
                    if pos[q] < len(ops[q]) and ops[q][pos[q]].op == "recv" and ops[q][pos[q]].peer == r:
                        pos[r] += 1
                        pos[q] += 1
                        moved = True
        self._final = {r: (ops[r], pos[r]) for r in ops}
        return self._final

    def entry(self, rank: int, rid: int, o: _Op, done: bool) -> dict[str, Any]:
        cfg = self.cfg
        is_p2p = o.peer is not None
        name = f"{cfg.backend}:{o.op}"
        if is_p2p:
            name += f" {rank}->{o.peer}" if o.op == "send" else f" {rank}<-{o.peer}"
        t = 1_700_000_000_000_000_000 + rid * 1_000_000
        e: dict[str, Any] = {
            "frames": self.frames[o.op],
            "record_id": rid,
            "pg_id": o.pg_id,
            "process_group": (o.group, o.desc),
            "collective_seq_id": o.seq,
            "p2p_seq_id": o.p2p_seq,
            "op_id": o.op_id,
            "profiling_name": name,
            "time_created_ns": t,
            "input_sizes": [[o.size]],
            "input_dtypes": ["Float"],
            "output_sizes": [[o.size * (cfg.ranks if o.op == "all_gather" else 1)]],
            "output_dtypes": ["Float"],
            "state": "scheduled" if self.gloo else ("completed" if done else "started"),
            "time_discovered_started_ns": None if self.gloo else t + 1000,
            "time_discovered_completed_ns": None if self.gloo or not done else t + 50_000,
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
            e["seq_id"] = o.p2p_seq if is_p2p else o.seq
            del e["collective_seq_id"], e["p2p_seq_id"], e["is_p2p"]
        return e

    def dump(self, rank: int) -> dict[str, Any] | None:
        cfg = self.cfg
        if cfg.fault == "crash" and rank == cfg.culprit:
            return None
        final, finished = self.final_state()[rank]
        # (op, finished) of everything the rank called, oldest first; the last step as far as it got
        called = [(o, True) for step in range(cfg.start_step, cfg.start_step + self.steps - 1)
                  for o in self.step_ops(rank, step)]
        called += [(o, i < finished) for i, o in enumerate(final[: finished + 1])]
        status = self.status(called)
        recorded = [(o, done) for o, done in called if not (self.gloo and o.peer is not None)]  # gloo: no p2p
        base = cfg.start_step * 3
        # the evidence mode only needs the tail (the unfinished entries are the newest ones)
        keep = (min(cfg.recent + 1, cfg.entries_per_rank) if cfg.recent is not None else cfg.entries_per_rank)
        offset = max(len(recorded) - keep, 0)
        entries = [self.entry(rank, base + offset + i, o, done) for i, (o, done) in enumerate(recorded[offset:])]
        if cfg.fault == "p2p-hang" and cfg.pp == 1:
            entries.extend(self._pairs(rank, base + len(recorded), called[-1][0]))
        if cfg.recent is not None:
            tail = entries[-cfg.recent:] if cfg.recent > 0 else []
            older = entries[: len(entries) - len(tail)]
            # older unfinished entries stay; finished ones keep no frames in the evidence mode
            entries = [e for e in older if not e["retired"]] + [
                e if not e["retired"] else dict(e, frames=[]) for e in tail]
        return self.top(rank, entries, status, {o.group for o, _ in called})

    def status(self, called: list[tuple[_Op, bool]]) -> dict[str, dict[str, int]]:
        """pg_status as torch keeps it: NCCL names the work's sequence number (a p2p one after a send/recv),
        gloo the op id of its last recorded collective (send/recv never move it)."""
        out: dict[str, dict[str, int]] = {}
        for o, done in called:
            if self.gloo and o.peer is not None:
                continue
            st = out.setdefault(str(o.pg_id), {"last_enqueued_collective": -1, "last_started_collective": -1,
                                               "last_completed_collective": -1})
            n = o.op_id if self.gloo else (o.p2p_seq if o.peer is not None else o.seq)
            st["last_enqueued_collective"] = n
            if not self.gloo:
                st["last_started_collective"] = n
            if done:
                st["last_completed_collective"] = n
        return out

    def _pairs(self, rank: int, rid: int, last: _Op) -> list[dict[str, Any]]:
        """pp == 1: pairs (2i, 2i+1) after the schedule: the even rank sends, the odd one receives; the
        culprit never posts."""
        cfg = self.cfg
        pair_even = rank - rank % 2
        peer = rank + 1 if rank % 2 == 0 else rank - 1
        if peer >= cfg.ranks or rank == cfg.culprit:
            return []
        stuck = cfg.culprit in (pair_even, pair_even + 1)
        op = "send" if rank % 2 == 0 else "recv"
        o = _Op("0", "default_pg", 0, op, last.seq, 1, last.op_id + 1, peer)
        return [self.entry(rank, rid, o, not stuck)]

    def top(self, rank: int, entries: list[dict[str, Any]], status: dict[str, dict[str, int]],
            groups: set[str]) -> dict[str, Any]:
        lib_key = "comm_lib_version" if self.v >= (2, 9) else "nccl_version"
        pg_config = self.pg_config
        if self.cfg.recent is not None and not self.gloo:
            # evidence mode: only the rank's own groups; the default group's members are the world
            pg_config = {k: (dict(v, ranks="[]") if v["desc"] == "default_pg" else v)
                         for k, v in self.pg_config.items() if k in groups}
        top: dict[str, Any] = {"version": self.cfg.version, "pg_config": pg_config, lib_key: "2.21.5",
                               "pg_status": status, "entries": entries}
        if self.v < (2, 0):
            del top["pg_status"]
        return top


def _renumber(ops: list[_Op], step: list[_Op]) -> list[_Op]:
    """Counters as torch assigns them when only ``ops`` of the healthy ``step`` are called: an op never
    called takes no number (a skipped send leaves no gap in op ids or p2p sequence numbers)."""
    counters: dict[str, list[int]] = {}
    for o in step:
        c = counters.setdefault(o.group, [o.op_id - 1, -1, -1])
        c[0] = min(c[0], o.op_id - 1)
        if o.peer is None:
            c[1] = o.seq - 1 if c[1] < 0 else min(c[1], o.seq - 1)
        else:
            c[2] = o.p2p_seq - 1 if c[2] < 0 else min(c[2], o.p2p_seq - 1)
    out = []
    for o in ops:
        c = counters[o.group]
        c[0] += 1
        if o.peer is None:
            c[1] += 1
            out.append(o._replace(op_id=c[0], seq=c[1]))
        else:
            c[2] += 1
            # a send/recv records the group's current collective number: the last one called
            out.append(o._replace(op_id=c[0], p2p_seq=c[2], seq=c[1] if c[1] >= 0 else o.seq))
    return out


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
