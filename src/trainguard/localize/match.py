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


@dataclass(slots=True)
class SeqRecord:
    """Who called what at one sequence number of one group. The first rank seen sets the reference."""

    op: str
    in_sizes: Any
    out_sizes: Any
    in_dtypes: Any
    out_dtypes: Any
    ref_holders: list[int]
    """Ranks that hold the reference signature (the first `HOLDER_CAP`)."""
    ref_view: EntryView
    """The first rank's entry (evidence when this sequence number turns out to diverge)."""
    ref_count: int = 1
    deviants: dict[str, Variant] | None = None
    """repr(signature) -> the ranks that disagree with the reference with that signature."""

    @property
    def ref(self) -> tuple[Any, ...]:
        return (self.op, self.in_sizes, self.out_sizes, self.in_dtypes, self.out_dtypes)


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


def _name_info(profiling_name: str) -> tuple[str, bool, bool, bool]:
    """(op, sizes differ by rank legitimately, gloo, point-to-point by name) for one profiling name."""
    op = op_name(profiling_name)
    return (op, op in _RANK_DEPENDENT_SIZES, profiling_name.startswith("gloo:"), bool(_P2P_NAME.match(op)))


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
        self._names: dict[str, tuple[str, bool, bool, bool]] = {}
        self._config_read = False

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
        if dump.pg_config and not self._config_read:
            # Every rank lists every group (groups are created collectively): read it once.
            self._config_read = True
            for key, cfg in dump.pg_config.items():
                if not key or not isinstance(cfg, dict) or not cfg.get("name", key):
                    continue  # gloo writes one broken entry keyed '': ignore it
                ranks = _parse_ranks(cfg.get("ranks"))
                g = self._group(str(key), str(cfg.get("desc", "")))
                if ranks and g.config_ranks is None:
                    g.config_ranks = ranks
        seq_key = dump.fmt.seq_key
        has_flag = dump.fmt.has_p2p_flag
        names = self._names
        local: dict[Any, tuple[GroupAcc, RankGroupState]] = {}
        last_raw: dict[str, tuple[dict[str, Any], int]] = {}
        cap = HOLDER_CAP
        for e in dump.entries:
            pg = e.get("process_group")
            key = pg[0] if pg.__class__ in (tuple, list) and pg else e.get("pg_id", "?")
            cached = local.get(key)
            if cached is None:
                cached = local[key] = self._rank_group(rank, e, pg, dump.pg_config)
            g, st = cached
            prof = e.get("profiling_name") or ""
            info = names.get(prof)
            if info is None:
                info = names[prof] = _name_info(prof)
            op, rank_dependent, gloo, p2p_by_name = info
            done = e.get("retired") is True if gloo else e.get("state") == "completed"
            if e.get("is_p2p") if has_flag else p2p_by_name:
                if not done:
                    p2p_seq = e.get("p2p_seq_id", e.get(seq_key))
                    p2p_seq = p2p_seq if isinstance(p2p_seq, int) else -1
                    st.active.append(self._view(rank, e, p2p_seq, True, done, gloo, g.config_ranks))
                continue
            seq = e.get(seq_key)
            if seq.__class__ is not int:
                continue
            if seq > st.last_seq:
                st.last_seq = seq
                last_raw[g.name] = (e, seq)
            if not done:
                st.active.append(self._view(rank, e, seq, False, done, gloo, g.config_ranks))
            if rank_dependent:
                in_sizes = out_sizes = None
            else:
                in_sizes = e.get("input_sizes")
                out_sizes = e.get("output_sizes")
            in_dtypes = e.get("input_dtypes")
            out_dtypes = e.get("output_dtypes")
            rec = g.seqs.get(seq)
            if (rec is not None and rec.op == op and rec.in_sizes == in_sizes and rec.out_sizes == out_sizes
                    and rec.in_dtypes == in_dtypes and rec.out_dtypes == out_dtypes):
                rec.ref_count += 1
                if len(rec.ref_holders) < cap:
                    rec.ref_holders.append(rank)
                continue
            sig = (op, in_sizes, out_sizes, in_dtypes, out_dtypes)
            self._match_slow(g, rec, rank, seq, e, sig, done, gloo)
        groups = self.groups
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

    def _rank_group(self, rank: int, e: dict[str, Any], pg: Any,
                    pg_config: dict[str, Any]) -> tuple[GroupAcc, RankGroupState]:
        has_pair = isinstance(pg, (list, tuple)) and len(pg) > 0
        gname = str(pg[0]) if has_pair else str(e.get("pg_id", "?"))
        desc = str(pg[1]) if has_pair and len(pg) > 1 else ""
        g = self._group(gname, desc)
        if g.config_ranks is None and gname:
            cfg = pg_config.get(gname)
            if isinstance(cfg, dict):
                g.config_ranks = _parse_ranks(cfg.get("ranks"))
        st = g.ranks.get(rank)
        if st is None:
            st = g.ranks[rank] = RankGroupState()
            g.pg_ids[rank] = str(e.get("pg_id", ""))
        return g, st

    def _match_slow(self, g: GroupAcc, rec: SeqRecord | None, rank: int, seq: int, e: dict[str, Any],
                    sig: tuple[Any, ...], done: bool, gloo: bool) -> None:
        """First rank at this sequence number, or a rank that disagrees with the reference."""
        if rec is None:
            view = self._view(rank, e, seq, False, done, gloo, g.config_ranks)
            g.seqs[seq] = SeqRecord(op=sig[0], in_sizes=sig[1], out_sizes=sig[2], in_dtypes=sig[3],
                                    out_dtypes=sig[4], ref_holders=[rank], ref_view=view)
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
