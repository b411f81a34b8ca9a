"""Matching collectives across ranks, one dump at a time, keeping only what the verdicts need.

Per process group and collective sequence number the first signature seen (op, sizes, dtypes) is the
reference; ranks that disagree are recorded with their own signature and count. Per (rank, group) only
the last entry and the unfinished ones are kept.

Fast path: a rank's *relative trace* is its list of (pg_id, seq, op, sizes, dtypes, state, retired),
built in C with ``operator.itemgetter``. pg_id is the rank-local number of a group, so ranks of
different tensor-parallel groups usually have equal relative traces. A rank whose relative trace equals
a recent template rank's is recorded as a *virtual member* of its groups: nothing is matched entry by
entry. A group whose members all come from one source (one template's slot) cannot disagree with
itself; only a group fed by several sources is *materialized* (the template's entries replayed once,
weighted by its virtual members). A group whose members (pg_config) were all read is finalized: only
its first divergence and newest sequence number stay, so memory stays bounded.
"""

from __future__ import annotations

import itertools
import logging
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainguard.localize.entries import (
    as_int,
    compared_dtypes,
    entry_frames,
    finished,
    gloo_and_finished,
    make_view,
    name_info,
)
from trainguard.localize.fields import check_clone_entry, check_entry
from trainguard.localize.model import EntryView, RankGroupState
from trainguard.localize.reader import MAX_RANK, Dump

log = logging.getLogger(__name__)

HOLDER_CAP = 64
"""Ranks remembered per signature and sequence number; beyond that only a count is kept."""
_FAST_GET = operator.itemgetter("pg_id", "collective_seq_id", "profiling_name", "input_sizes", "output_sizes",
                                "input_dtypes", "output_dtypes", "state", "retired")
_TEMPLATES = 4
"""Recent templates a new rank is compared with."""
_PENDING_TEMPLATES = 32
"""Templates kept alive for later materialization; beyond that the oldest is materialized and freed."""
_RECENT_GAPS = 6
"""Intervals between collective entries whose unrecorded-op counts are kept per (rank, group) on gloo."""
_INT64 = 2**63


@dataclass(slots=True)
class Variant:
    """One signature held by some ranks at one sequence number."""

    sig: tuple[Any, ...]
    """(op, input_sizes, output_sizes, input_dtypes, output_dtypes); sizes None for uneven ops."""
    holders: list[int]
    """Ranks holding it (the first `HOLDER_CAP`)."""
    count: int
    entry: dict[str, Any]
    """A holder's raw entry, turned into evidence only when needed (see `view`)."""
    entry_rank: int
    """The rank that entry came from."""
    seq: int
    gloo: bool
    members: tuple[int, ...] | None

    @property
    def view(self) -> EntryView:
        """The entry as evidence."""
        done = finished(self.entry, self.gloo)
        return make_view(self.entry_rank, self.entry, self.seq, False, done, self.gloo, self.members)

    def add(self, ranks: list[int]) -> None:
        self.count += len(ranks)
        room = HOLDER_CAP - len(self.holders)
        if room > 0:
            self.holders.extend(ranks[:room])


@dataclass(slots=True)
class SeqRecord:
    """Who called what at one sequence number of one group. The first rank seen sets the reference."""

    op: str
    in_sizes: Any
    out_sizes: Any
    in_dtypes: Any
    out_dtypes: Any
    ref: Variant
    deviants: dict[str, Variant] | None = None
    """repr(signature) -> the ranks that disagree with the reference with that signature."""

    def variants(self) -> list[Variant]:
        return [self.ref, *(self.deviants or {}).values()]


@dataclass(slots=True)
class _Slot:
    """Where one group's entries sit in a template's trace."""

    first_pos: int
    last_pos: int
    last_seq: int
    positions: list[int]
    """Entries with a collective sequence number (what replay walks)."""
    active: list[tuple[int, int, bool]]
    """(position, seq, is_p2p) of unfinished entries."""
    last_p2p_seq: int = -1
    """Highest p2p sequence number among the group's entries (to read NCCL's pg_status)."""


@dataclass(eq=False)
class _Template:
    """A rank read entry by entry, whose relative trace later ranks are compared with."""

    rank: int
    sigs: list[tuple[Any, ...]] | None
    entries: list[dict[str, Any]] | None
    slots: dict[Any, _Slot]
    """pg_id -> where that group's entries are."""
    own_groups: dict[Any, str]
    """pg_id -> the template rank's own group name."""
    virtual: dict[tuple[Any, str], list[int]] = field(default_factory=dict)
    """(pg_id, group name) -> ranks whose trace equals this one, not yet materialized."""
    views: dict[int, tuple[dict[str, Any], Any, tuple[str, ...]]] = field(default_factory=dict)
    """Position -> (the template's entry, its raw frames, those frames formatted), for evidence of clones."""

    def view_source(self, pos: int, e: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...] | None]:
        """What a clone's evidence for entry ``e`` at ``pos`` can share with the template: the template's
        entry (equal in every compared field) and its formatted frames when ``e``'s frames are equal."""
        cached = self.views.get(pos)
        if cached is None:
            te = self.entries[pos]  # type: ignore[index]  # a template that takes clones keeps its entries
            raw = te.get("frames")
            cached = self.views[pos] = (te, raw, entry_frames(raw))
        te, raw, frames = cached
        return te, (frames if e.get("frames") == raw else None)


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
    sources: dict[Any, tuple[_Template, Any] | None] = field(default_factory=dict)
    """Where members came from: (template, pg_id) for template ranks and their virtual members,
    None for ranks matched entry by entry without a template."""
    finalized: bool = False

    def members(self, world: frozenset[int] | set[int] | None = None) -> list[int]:
        if self.config_ranks:
            return sorted(self.config_ranks)
        if self.desc == "default_pg" and world:
            return sorted(world | set(self.ranks))
        return sorted(self.ranks)

    def first_divergence(self) -> int | None:
        bad = [s for s, rec in self.seqs.items() if rec.deviants]
        return min(bad) if bad else None


_RANK_LIST = re.compile(r"\s*\[\s*(?:\d{1,7}\s*(?:,\s*\d{1,7}\s*)*,?\s*)?\]\s*")


def _parse_ranks(raw: Any) -> tuple[int, ...] | None:
    """A group's member list from pg_config ('[0, 1]' or a list); None when absent, empty or implausible
    (more than MAX_RANK + 1 members, a member above MAX_RANK, anything but rank numbers)."""
    if isinstance(raw, str):
        if raw.count(",") > MAX_RANK or not _RANK_LIST.fullmatch(raw):
            return None
        body = raw.strip()[1:-1].strip().rstrip(",")
        vals: Any = [int(v) for v in body.split(",")] if body else []
    elif isinstance(raw, (list, tuple)):
        vals = raw
        if len(vals) > MAX_RANK + 1:
            return None
    else:
        return None
    if not all(v.__class__ is int and 0 <= v <= MAX_RANK for v in vals):
        return None
    return tuple(vals) or None


class Matcher:
    """Feed dumps with `add`, then call `finish`; read `groups` afterwards. Any rank order works."""

    def __init__(self) -> None:
        self.groups: dict[str, GroupAcc] = {}
        self.ranks: set[int] = set()
        self.backends: set[str] = set()
        self.versions: dict[str, int] = {}
        self.empty_ranks: set[int] = set()
        """Ranks whose dump holds no entry at all (recorder off, or counters only): state unknown."""
        self._names: dict[str, tuple[str, bool, bool, bool]] = {}
        self._config_read = False
        self._templates: list[_Template] = []
        self._pending: list[_Template] = []
        self._seen: dict[str, int] = {}
        self._pg_config: Mapping[str, Any] = {}

    def _group(self, name: str, desc: str) -> GroupAcc:
        g = self.groups.get(name)
        if g is None:
            g = self.groups[name] = GroupAcc(name=name, desc=desc)
            cfg = self._pg_config.get(name)
            if isinstance(cfg, dict):
                g.config_ranks = _parse_ranks(cfg.get("ranks"))
        elif desc and not g.desc:
            g.desc = desc
        return g

    # --- reading one dump ----------------------------------------------------------------------

    def add(self, dump: Dump) -> None:
        """Match one rank's entries against what was read before; the dump can be dropped afterwards."""
        rank = dump.rank
        entries = dump.entries
        template, fast = self._equal_template(dump)
        # Type checks come before any state changes, so a refused dump leaves no trace: equality with a
        # checked template covers the compared fields; what a clone turns into evidence is checked here.
        if template is None or not self._check_clone(rank, entries, template):
            template = None
            checked: set[int] = set()
            for i, e in enumerate(entries):
                if e.__class__ is dict:
                    check_entry(e, i, checked)
        self._note_dump(dump)
        touched = None
        if template is not None:
            touched = self._clone(rank, entries, dump.pg_config, template)
        if touched is None:
            sigs: list[tuple[Any, ...]] | None = None
            if fast:
                try:
                    sigs = list(map(_FAST_GET, entries))
                except (KeyError, TypeError, IndexError):
                    sigs = None
            touched = self._slow(rank, dump, sigs)
        for g in touched:
            pg_id = g.pg_ids.get(rank)
            if pg_id is not None and pg_id in dump.pg_status:
                g.status[rank] = dump.pg_status[pg_id]
            seen = self._seen[g.name] = self._seen.get(g.name, 0) + 1
            if g.config_ranks and not g.finalized and seen >= len(g.config_ranks):
                self._finalize(g)

    def _equal_template(self, dump: Dump) -> tuple[_Template | None, bool]:
        """A recent template whose relative trace equals the dump's, and whether the fast path applies."""
        entries = dump.entries
        if dump.fmt.seq_key != "collective_seq_id" or not entries:
            return None, False
        try:
            for t in self._templates:
                # Compared entry by entry as the relative trace is built: no list of the rank's own
                # signatures is made (or freed) when it equals a template, which is the common case.
                tsigs = t.sigs
                if (tsigs is not None and len(tsigs) == len(entries)
                        and all(map(operator.eq, map(_FAST_GET, entries), tsigs))):
                    return t, True
        except (KeyError, TypeError, IndexError):  # a field missing, or an entry that is not a dict
            return None, False
        return None, True

    def _note_dump(self, dump: Dump) -> None:
        """What a dump says beyond its entries: rank, format version, group configs, backend."""
        self.ranks.add(dump.rank)
        if not dump.entries:
            self.empty_ranks.add(dump.rank)
        self.versions[dump.fmt.version] = self.versions.get(dump.fmt.version, 0) + 1
        if dump.pg_config and not self._config_read:
            # Every rank lists every group (groups are created collectively): read it once.
            self._config_read = True
            self._pg_config = dump.pg_config
            for key, cfg in dump.pg_config.items():
                if not key or not isinstance(cfg, dict) or not cfg.get("name", key):
                    continue  # gloo writes one broken entry keyed '': ignore it
                ranks = _parse_ranks(cfg.get("ranks"))
                g = self._group(str(key), str(cfg.get("desc", "")))
                if ranks and g.config_ranks is None:
                    g.config_ranks = ranks
        for e in dump.entries[:1]:
            prof = e.get("profiling_name") if isinstance(e, dict) else None
            if isinstance(prof, str) and ":" in prof:
                self.backends.add(prof.split(":", 1)[0])

    def _check_clone(self, rank: int, entries: list[dict[str, Any]], t: _Template) -> bool:
        """Whether the rank can be recorded as a clone of ``t``; type-checks the entries that would become
        its evidence (raises `DumpError`). False: take the slow path (which checks every entry)."""
        seen: set[int] = set()
        tentries = t.entries
        assert tentries is not None  # a template that takes clones keeps its entries
        for slot in t.slots.values():
            pos = {slot.first_pos, *([slot.last_pos] if slot.last_pos >= 0 else []),
                   *(p for p, _, _ in slot.active)}
            for p in sorted(pos):
                check_clone_entry(entries[p], p, tentries[p], seen)
            pg = entries[slot.first_pos].get("process_group")
            if not isinstance(pg, (list, tuple)) or not pg:
                return False
            g = self.groups.get(str(pg[0]))
            if g is not None and rank in g.ranks:
                return False  # the same rank twice in one group: let the slow path sort it out
        return True

    def _clone(self, rank: int, entries: list[dict[str, Any]], pg_config: Mapping[str, Any],
               t: _Template) -> list[GroupAcc] | None:
        """The rank did what template ``t`` did, group for group: record it as a virtual member."""
        placed: list[tuple[Any, _Slot, GroupAcc]] = []
        for pg_id, slot in t.slots.items():
            pg = entries[slot.first_pos].get("process_group")
            if not isinstance(pg, (list, tuple)) or not pg:
                return None
            g = self._group(str(pg[0]), str(pg[1]) if len(pg) > 1 else "")
            if rank in g.ranks:
                return None  # the same rank twice in one group: let the slow path sort it out
            placed.append((pg_id, slot, g))
        touched = []
        for pg_id, slot, g in placed:
            if g.config_ranks is None and g.name in pg_config:
                cfg = pg_config[g.name]
                g.config_ranks = _parse_ranks(cfg.get("ranks")) if isinstance(cfg, dict) else None
            st = g.ranks[rank] = RankGroupState(last_seq=slot.last_seq, last_p2p_seq=slot.last_p2p_seq)
            g.pg_ids[rank] = str(pg_id)
            members = g.config_ranks
            if slot.last_pos >= 0:
                e = entries[slot.last_pos]
                gloo, done = gloo_and_finished(e)
                like, frames = t.view_source(slot.last_pos, e)
                st.last = make_view(rank, e, slot.last_seq, False, done, gloo, members, like, frames)
                # op ids are not part of the compared trace: ranks with equal collectives can differ in
                # the send/recv between them (pipeline stages), so they are read from this rank's entries
                _op_counts(st, entries, slot, "collective_seq_id", gloo)
            for pos, seq, is_p2p in slot.active:
                e = entries[pos]
                like, frames = t.view_source(pos, e)
                st.active.append(make_view(rank, e, seq, is_p2p, False, gloo_and_finished(e)[0], members, like, frames))
            t.virtual.setdefault((pg_id, g.name), []).append(rank)
            g.sources[(id(t), pg_id)] = (t, pg_id)
            touched.append(g)
        return touched

    def _slow(self, rank: int, dump: Dump, sigs: list[tuple[Any, ...]] | None) -> list[GroupAcc]:
        """Match entry by entry; remember the rank as a template when its relative trace is known."""
        seq_key = dump.fmt.seq_key
        has_flag = dump.fmt.has_p2p_flag
        names = self._names
        local: dict[Any, tuple[GroupAcc, RankGroupState, _Slot, Any]] = {}
        cap = HOLDER_CAP
        entries = dump.entries if sigs is not None else [e for e in dump.entries if isinstance(e, dict)]
        for idx, e in enumerate(entries):
            pg = e.get("process_group")
            key = pg[0] if pg.__class__ in (tuple, list) and pg else e.get("pg_id", "?")
            cached = local.get(key)
            if cached is None:
                g0, st0 = self._rank_group(rank, e, pg, dump.pg_config)
                cached = local[key] = (g0, st0, _Slot(idx, -1, -1, [], []), e.get("pg_id"))
            g, st, slot, _ = cached
            prof = e.get("profiling_name") or ""
            info = names.get(prof)
            if info is None:
                info = names[prof] = name_info(prof)
            op, rank_dependent, gloo, p2p_by_name = info
            done = finished(e, gloo)
            if e.get("is_p2p") if has_flag else p2p_by_name:
                _note_p2p(rank, idx, e, seq_key, done, gloo, g, st, slot)
                continue
            seq = e.get(seq_key)
            if seq.__class__ is not int:
                continue
            slot.positions.append(idx)
            if seq > st.last_seq:
                st.last_seq = seq
                slot.last_pos = idx
            if not done:
                st.active.append(make_view(rank, e, seq, False, done, gloo, g.config_ranks))
                slot.active.append((idx, seq, False))
            if rank_dependent:
                in_sizes = out_sizes = None
            else:
                in_sizes = e.get("input_sizes")
                out_sizes = e.get("output_sizes")
            in_dtypes, out_dtypes = compared_dtypes(e, rank_dependent)
            rec = g.seqs.get(seq)
            if (rec is not None and rec.op == op and rec.in_sizes == in_sizes and rec.out_sizes == out_sizes
                    and rec.in_dtypes == in_dtypes and rec.out_dtypes == out_dtypes):
                var = rec.ref
                var.count += 1
                if len(var.holders) < cap:
                    var.holders.append(rank)
            else:
                sig = (op, in_sizes, out_sizes, in_dtypes, out_dtypes)
                self._record(g, rec, rank, seq, e, sig, gloo, [rank])
        return self._close_slots(rank, entries, seq_key, local, sigs)

    def _close_slots(self, rank: int, entries: list[dict[str, Any]], seq_key: str,
                     local: dict[Any, tuple[GroupAcc, RankGroupState, _Slot, Any]],
                     sigs: list[tuple[Any, ...]] | None) -> list[GroupAcc]:
        """After a rank was matched entry by entry: its last entry per group, and the rank as a template
        when its relative trace is known and its pg_ids are distinct."""
        template = None
        if sigs is not None and len({pg_id for *_, pg_id in local.values()}) == len(local):
            template = _Template(rank, sigs, entries, {}, {})
        if not local:
            self.empty_ranks.add(rank)  # only items that are not entries
        touched = []
        for g, st, slot, pg_id in local.values():
            slot.last_seq = st.last_seq
            if slot.last_pos >= 0:
                e = entries[slot.last_pos]
                gloo, done = gloo_and_finished(e)
                st.last = make_view(rank, e, st.last_seq, False, done, gloo, g.config_ranks)
                _op_counts(st, entries, slot, seq_key, gloo)
            if template is not None:
                template.slots[pg_id] = slot
                template.own_groups[pg_id] = g.name
                g.sources[(id(template), pg_id)] = (template, pg_id)
            else:
                g.sources[("rank", rank)] = None
            touched.append(g)
        if template is not None:
            self._templates.insert(0, template)
            for old in self._templates[_TEMPLATES:]:
                self._retire(old)
            del self._templates[_TEMPLATES:]
        return touched

    def _retire(self, t: _Template) -> None:
        """``t`` no longer takes new virtual members: free it, or keep it until it is materialized."""
        t.views = {}
        if not t.virtual:
            t.sigs = t.entries = None
            return
        t.sigs = None
        self._pending.append(t)
        if len(self._pending) > _PENDING_TEMPLATES:
            oldest = self._pending.pop(0)
            for (pg_id, gname) in list(oldest.virtual):
                self._replay(oldest, pg_id, self.groups[gname])
            oldest.entries = None

    def _rank_group(self, rank: int, e: dict[str, Any], pg: Any,
                    pg_config: Mapping[str, Any]) -> tuple[GroupAcc, RankGroupState]:
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

    def _record(self, g: GroupAcc, rec: SeqRecord | None, entry_rank: int, seq: int, e: dict[str, Any],
                sig: tuple[Any, ...], gloo: bool, ranks: list[int]) -> None:
        """``ranks`` hold ``sig`` at ``seq``: the first record there, or a disagreement with it."""
        if rec is None:
            ref = Variant(sig=sig, holders=ranks[:HOLDER_CAP], count=len(ranks), entry=e, entry_rank=entry_rank,
                          seq=seq, gloo=gloo, members=g.config_ranks)
            g.seqs[seq] = SeqRecord(op=sig[0], in_sizes=sig[1], out_sizes=sig[2], in_dtypes=sig[3],
                                    out_dtypes=sig[4], ref=ref)
            return
        if rec.deviants is None:
            rec.deviants = {}
        key = repr(sig)
        var = rec.deviants.get(key)
        if var is None:
            rec.deviants[key] = Variant(sig=sig, holders=ranks[:HOLDER_CAP], count=len(ranks), entry=e,
                                        entry_rank=entry_rank, seq=seq, gloo=gloo, members=g.config_ranks)
        else:
            var.add(ranks)

    # --- materializing virtual members -----------------------------------------------------------

    def _replay(self, t: _Template, pg_id: Any, g: GroupAcc) -> None:
        """Count ``t``'s virtual members of ``g`` entry by entry, once, with their weight."""
        ranks = t.virtual.pop((pg_id, g.name), None)
        if not ranks or t.entries is None:
            return
        slot = t.slots[pg_id]
        names = self._names
        for pos in slot.positions:
            e = t.entries[pos]
            prof = e.get("profiling_name") or ""
            info = names.get(prof)
            if info is None:
                info = names[prof] = name_info(prof)
            op, rank_dependent, gloo, _ = info
            seq = e["collective_seq_id"]
            in_sizes = None if rank_dependent else e.get("input_sizes")
            out_sizes = None if rank_dependent else e.get("output_sizes")
            sig = (op, in_sizes, out_sizes, *compared_dtypes(e, rank_dependent))
            rec = g.seqs.get(seq)
            if rec is not None and (rec.op, rec.in_sizes, rec.out_sizes, rec.in_dtypes, rec.out_dtypes) == sig:
                rec.ref.add(ranks)
            else:
                self._record(g, rec, t.rank, seq, e, sig, gloo, ranks)

    def _materialize(self, g: GroupAcc) -> None:
        """A group fed by several sources: replay every template's virtual members of it."""
        if len(g.sources) <= 1:
            return  # one source cannot disagree with itself
        for src in list(g.sources.values()):
            if src is not None:
                self._replay(src[0], src[1], g)

    def _finalize(self, g: GroupAcc) -> None:
        """Every member was read: keep only the first divergence and the newest sequence number."""
        self._materialize(g)
        for src in g.sources.values():
            if src is not None:  # a single source: its virtual members of g need no replay
                src[0].virtual.pop((src[1], g.name), None)
        keep = {s for s in (g.first_divergence(), max(g.seqs, default=None)) if s is not None}
        g.seqs = {s: g.seqs[s] for s in keep}
        g.sources = {}
        g.finalized = True

    def finish(self) -> None:
        """Materialize what is still pending; call once after the last `add`."""
        for g in self.groups.values():
            if not g.finalized:
                self._materialize(g)
        self._templates.clear()
        self._pending.clear()


def _note_p2p(rank: int, idx: int, e: dict[str, Any], seq_key: str, done: bool, gloo: bool, g: GroupAcc,
              st: RankGroupState, slot: _Slot) -> None:
    """A send/recv entry: its p2p sequence number, and its evidence while unfinished."""
    p2p_seq = as_int(e.get("p2p_seq_id", e.get(seq_key)))
    if p2p_seq > slot.last_p2p_seq:
        slot.last_p2p_seq = st.last_p2p_seq = p2p_seq
    if not done:
        st.active.append(make_view(rank, e, p2p_seq, True, done, gloo, g.config_ranks))
        slot.active.append((idx, p2p_seq, True))


def _op_counts(st: RankGroupState, entries: list[dict[str, Any]], slot: _Slot, seq_key: str, gloo: bool) -> None:
    """Read the op ids around the rank's last collective entry of one group.

    ``op_id`` counts every op of a group, send/recv included, and ``collective_seq_id`` only collectives;
    both start at 1. gloo records no send/recv, so there ``op_id - collective_seq_id`` is the number of
    ops the recorder left out, and its ``pg_status`` counts in op ids. O(1) per group: the fast path
    calls this for every rank.
    """
    e = entries[slot.last_pos]
    op, seq = e.get("op_id"), e.get(seq_key)
    if op.__class__ is not int or seq.__class__ is not int or not -_INT64 < op < _INT64:
        return
    st.last_op_id = op
    if not gloo:
        return  # NCCL records its send/recv: nothing is left out
    st.unrecorded = max(op - seq, 0)
    vals = []
    for p in slot.positions[-(_RECENT_GAPS + 1):]:
        x = entries[p]
        o, q = x.get("op_id"), x.get(seq_key)
        # positions come from the template for a clone: its entries there were not type-checked
        if o.__class__ is int and q.__class__ is int and -_INT64 < o < _INT64 and -_INT64 < q < _INT64:
            vals.append(o - q)
    st.recent_gaps = tuple(b - a for a, b in itertools.pairwise(vals))
