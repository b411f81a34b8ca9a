"""Matching collectives across ranks, one dump at a time, keeping only what the verdicts need.

Per process group and collective sequence number the first signature seen (op, sizes, dtypes) is the
reference; ranks that disagree are recorded with their own signature. Per (rank, group) only the last
entry and the unfinished ones are kept, so memory grows with ranks x groups, not with ring size.
"""

from __future__ import annotations

import ast
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from trainguard.localize.model import EntryView, RankGroupState
from trainguard.localize.reader import Dump

log = logging.getLogger(__name__)

HOLDER_CAP = 64
"""Ranks remembered per signature and sequence number; beyond that only a count is kept."""
MAX_FRAMES = 12
# Ops whose sizes legitimately differ between ranks (uneven splits, root-only buffers).
_RANK_DEPENDENT_SIZES = frozenset(
    {"all_to_all", "alltoall", "alltoall_base", "all_to_all_single", "gather", "scatter",
     "allgather_v", "reduce_scatter_v", "all_gather_into_tensor_coalesced", "coalesced"}
)
_P2P_NAME = re.compile(r"^(send|recv)\b")
_SEND = re.compile(r"send\s+(\d+)\s*->\s*(\d+)")
_RECV = re.compile(r"recv\s+(\d+)\s*<-\s*(\d+)")


@dataclass
class SeqRecord:
    """Who called what at one sequence number of one group."""

    ref: tuple[Any, ...]
    """Signature of the first rank seen: (op, input_sizes, output_sizes, input_dtypes, output_dtypes)."""
    ref_holders: list[int]
    ref_view: EntryView
    """The first rank's entry (evidence when this sequence number turns out to diverge)."""
    ref_count: int = 1
    deviants: dict[str, Variant] | None = None
    """repr(signature) -> the ranks that disagree with ``ref`` with that signature."""


@dataclass
class Variant:
    """One signature held by some ranks at one sequence number."""

    sig: tuple[Any, ...]
    holders: list[int]
    """Ranks holding it (the first `HOLDER_CAP`)."""
    count: int
    view: EntryView
    """The first holder's entry."""


@dataclass
class GroupAcc:
    """Everything known about one process group across the dumps read so far."""

    name: str
    desc: str = ""
    config_ranks: tuple[int, ...] | None = None
    """Members from a valid pg_config (NCCL dumps); None where it is absent or broken (gloo)."""
    seqs: dict[int, SeqRecord] = field(default_factory=dict)
    ranks: dict[int, RankGroupState] = field(default_factory=dict)
    pg_ids: dict[int, str] = field(default_factory=dict)
    """Rank -> its local pg_id for this group (to read that rank's pg_status)."""
    status: dict[int, dict[str, int]] = field(default_factory=dict)

    def members(self, world: set[int] | None = None) -> list[int]:
        if self.config_ranks:
            return sorted(self.config_ranks)
        if self.desc == "default_pg" and world:
            return sorted(world | set(self.ranks))
        return sorted(self.ranks)


def op_name(profiling_name: str) -> str:
    """'gloo:all_reduce' -> 'all_reduce'; 'nccl:send 0->1' -> 'send'."""
    name = profiling_name.split(":", 1)[1] if ":" in profiling_name else profiling_name
    return name.split(" ", 1)[0]


def _frames(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list):
        return ()
    out = []
    for f in raw[:MAX_FRAMES]:
        if isinstance(f, dict):
            out.append(f"{f.get('name', '?')} ({f.get('filename', '?')}:{f.get('line', '?')})")
    return tuple(out)


def _parse_ranks(raw: Any) -> tuple[int, ...] | None:
    if isinstance(raw, (list, tuple)):
        vals = raw
    elif isinstance(raw, str):
        try:
            vals = ast.literal_eval(raw.strip() or "[]")
        except (ValueError, SyntaxError):
            return None
    else:
        return None
    if not isinstance(vals, (list, tuple)) or not all(isinstance(v, int) for v in vals):
        return None
    return tuple(vals) or None


class Matcher:
    """Feed dumps with `add`; read `groups` afterwards. Dumps may come in any rank order."""

    def __init__(self) -> None:
        self.groups: dict[str, GroupAcc] = {}
        self.ranks: set[int] = set()
        self.backends: set[str] = set()
        self.versions: dict[str, int] = {}

    def _group(self, name: str, desc: str) -> GroupAcc:
        g = self.groups.get(name)
        if g is None:
            g = self.groups[name] = GroupAcc(name=name, desc=desc)
        elif desc and not g.desc:
            g.desc = desc
        return g

    def _view(self, rank: int, e: dict[str, Any], seq: int, is_p2p: bool, done: bool,
              gloo: bool, members: tuple[int, ...] | None) -> EntryView:
        prof = str(e.get("profiling_name", ""))
        peer = None
        if is_p2p:
            m = _SEND.search(prof) or _RECV.search(prof)
            if m:
                local = int(m.group(2))
                peer = members[local] if members and local < len(members) else local
        started = e.get("time_discovered_started_ns")
        state = str(e.get("state", ""))
        if not gloo and state == "scheduled" and started:
            state = "started"
        return EntryView(
            rank=rank,
            record_id=int(e.get("record_id", -1) or -1),
            seq=seq,
            op=op_name(prof),
            profiling_name=prof,
            is_p2p=is_p2p,
            state=state,
            completed=done,
            input_sizes=e.get("input_sizes"),
            output_sizes=e.get("output_sizes"),
            input_dtypes=e.get("input_dtypes"),
            output_dtypes=e.get("output_dtypes"),
            peer=peer,
            frames=_frames(e.get("frames")),
            time_created_ns=e.get("time_created_ns"),
            retired=bool(e.get("retired")),
        )

    def add(self, dump: Dump) -> None:
        """Match one rank's entries against what was read before; the dump can be dropped afterwards."""
        rank = dump.rank
        self.ranks.add(rank)
        self.versions[dump.fmt.version] = self.versions.get(dump.fmt.version, 0) + 1
        for key, cfg in dump.pg_config.items():
            if not key or not isinstance(cfg, dict) or not cfg.get("name", key):
                continue  # gloo writes one broken entry keyed '': ignore it
            ranks = _parse_ranks(cfg.get("ranks"))
            g = self._group(str(key), str(cfg.get("desc", "")))
            if ranks and g.config_ranks is None:
                g.config_ranks = ranks
        seq_key = dump.fmt.seq_key
        has_flag = dump.fmt.has_p2p_flag
        groups = self.groups
        last_raw: dict[str, tuple[dict[str, Any], int]] = {}
        for e in dump.entries:
            pg = e.get("process_group")
            gname = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(e.get("pg_id", "?"))
            found = groups.get(gname)
            if found is None:
                desc = str(pg[1]) if isinstance(pg, (list, tuple)) and len(pg) > 1 else ""
                found = self._group(gname, desc)
            g = found
            st = g.ranks.get(rank)
            if st is None:
                st = g.ranks[rank] = RankGroupState()
                g.pg_ids[rank] = str(e.get("pg_id", ""))
            st.entries += 1
            prof = e.get("profiling_name") or ""
            gloo = prof.startswith("gloo:")
            done = bool(e.get("retired")) if gloo else e.get("state") == "completed"
            is_p2p = bool(e.get("is_p2p")) if has_flag else bool(_P2P_NAME.match(op_name(prof)))
            if is_p2p:
                if not done:
                    p2p_seq = int(e.get("p2p_seq_id", e.get(seq_key, -1)) or 0)
                    st.active.append(self._view(rank, e, p2p_seq, True, done, gloo, g.config_ranks))
                continue
            seq = e.get(seq_key)
            if not isinstance(seq, int):
                continue
            if seq > st.last_seq:
                st.last_seq = seq
                last_raw[gname] = (e, seq)
            if st.first_seq < 0 or seq < st.first_seq:
                st.first_seq = seq
            if not done:
                st.active.append(self._view(rank, e, seq, False, done, gloo, g.config_ranks))
            self._match(g, rank, seq, e, prof, done, gloo)
        for gname, (e, seq) in last_raw.items():
            g = groups[gname]
            prof = str(e.get("profiling_name", ""))
            gloo = prof.startswith("gloo:")
            done = bool(e.get("retired")) if gloo else e.get("state") == "completed"
            g.ranks[rank].last = self._view(rank, e, seq, False, done, gloo, g.config_ranks)
        for g in groups.values():
            pg_id = g.pg_ids.get(rank)
            if pg_id is not None and pg_id in dump.pg_status and rank in g.ranks:
                g.status[rank] = dump.pg_status[pg_id]
        for e in dump.entries[:1]:
            prof = str(e.get("profiling_name", ""))
            if ":" in prof:
                self.backends.add(prof.split(":", 1)[0])

    def _match(self, g: GroupAcc, rank: int, seq: int, e: dict[str, Any], prof: str, done: bool,
               gloo: bool) -> None:
        name = op_name(prof)
        if name in _RANK_DEPENDENT_SIZES:
            sig: tuple[Any, ...] = (name, None, None, e.get("input_dtypes"), e.get("output_dtypes"))
        else:
            sig = (name, e.get("input_sizes"), e.get("output_sizes"),
                   e.get("input_dtypes"), e.get("output_dtypes"))
        rec = g.seqs.get(seq)
        if rec is None:
            view = self._view(rank, e, seq, False, done, gloo, g.config_ranks)
            g.seqs[seq] = SeqRecord(ref=sig, ref_holders=[rank], ref_view=view)
            return
        if rec.ref == sig:
            rec.ref_count += 1
            if len(rec.ref_holders) < HOLDER_CAP:
                rec.ref_holders.append(rank)
            return
        if rec.deviants is None:
            rec.deviants = {}
        key = repr(sig)
        var = rec.deviants.get(key)
        if var is None:
            view = self._view(rank, e, seq, False, done, gloo, g.config_ranks)
            rec.deviants[key] = Variant(sig=sig, holders=[rank], count=1, view=view)
        else:
            var.count += 1
            if len(var.holders) < HOLDER_CAP:
                var.holders.append(rank)
