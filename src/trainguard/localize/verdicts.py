"""From matched collectives to verdicts: per group, then causes ordered before their consequences."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from trainguard.localize.match import GroupAcc, Matcher
from trainguard.localize.model import EntryView, Problem
from trainguard.localize.problems import SHOW, Context, group_label, make_problem, plural, rank_list, where

log = logging.getLogger(__name__)

# hang and p2p-hang share a rank: when each waits on the other (a rank skipped a send and went on to a
# collective its receiver never reaches), the one with fewer culprits is the cause.
_PRIORITY = {"mismatch": 0, "desync": 1, "crash": 2, "hang": 3, "p2p-hang": 3, "incomplete": 5,
             "insufficient-evidence": 6}


def _divergence(g: GroupAcc, members: list[int], missing: list[int], ctx: Context,
                gloo: bool) -> Problem | None:
    seq = g.first_divergence()
    if seq is None:
        return None
    variants = g.seqs[seq].variants()
    variants.sort(key=lambda v: -v.count)
    tie = len(variants) > 1 and variants[0].count == variants[1].count
    minority = variants if tie else variants[1:]
    culprits = tuple(sorted({r for v in minority for r in v.holders}))
    ops = {v.sig[0] for v in variants}
    verdict = "desync" if len(ops) > 1 else "mismatch"
    major = variants[0]
    detail = "; ".join(
        f"rank{'s' if v.count > 1 else ''} {rank_list(v.holders)}{' (+more)' if v.count > len(v.holders) else ''}: "
        f"{v.view.op} in {v.view.input_sizes} {v.view.input_dtypes or ''}".rstrip()
        for v in variants
    )
    what = ("called different collectives" if verdict == "desync"
            else "called the same collective with different sizes or dtypes")
    text = (
        f"In {group_label(g)} the ranks {what} at collective sequence number {seq}: {detail}. "
        + ("No majority: the culprit cannot be told apart. " if tie else
           f"The majority ({major.count} rank{'s' if major.count > 1 else ''}) called {major.view.op}; "
           f"rank{'s' if len(culprits) > 1 else ''} {rank_list(culprits)} diverged"
           f"{where(minority[0].view)} and caused everything after it in this group to fail or hang. ")
    )
    if missing:
        why = ("gloo aborts a receiver whose incoming message has the wrong size" if gloo
               else "the job failed after it")
        text += (f"{'Ranks' if len(missing) > 1 else 'Rank'} {rank_list(missing)} left no dump: the divergence "
                 f"explains it ({why}), so {'they are' if len(missing) > 1 else 'it is'} listed as "
                 "a consequence, not a culprit.")
    waiting = tuple(sorted(r for r, st in g.ranks.items() if any(not a.is_p2p for a in st.active)))
    return make_problem(
        g, members, ctx, verdict=verdict, collective_seq=seq, op=major.view.op, culprit_ranks=culprits,
        waiting_ranks=waiting, consequence_ranks=tuple(missing), explanation=text.strip(),
        evidence=tuple(v.view for v in variants[:6]), confidence=0.5 if tie else 0.95,
    )


@dataclass(frozen=True)
class _Progress:
    """How far one member got in one group, from its entries and its ``pg_status`` counters."""

    seq: int
    """Highest collective sequence number it entered (-1: none known)."""
    done: bool
    """The op at ``seq`` finished: NCCL ``completed``; gloo ``retired``, which failed work is too."""
    view: EntryView | None
    """The recorded entry at ``seq``; None when only ``pg_status`` knows about that op."""
    ahead: str = ""
    """Set when ``pg_status`` counts more enqueued ops than the entries show: what is missing."""


def _progress(g: GroupAcc, r: int, gloo: bool) -> _Progress:
    st = g.ranks.get(r)
    seq = st.last_seq if st is not None else -1
    view = st.last if st is not None and st.last is not None and st.last.seq == seq else None
    done = view.completed if view is not None else True
    status = g.status.get(r)
    if not status or st is None:
        return _Progress(seq, done, view)
    enq = status.get("last_enqueued_collective", -1)
    fin = status.get("last_completed_collective", -1)
    if gloo:
        # gloo's counters are op ids (send/recv included), which differ from rank to rank in a pipeline:
        # they say something only against this rank's own newest entry. Only recorded collectives move
        # them, so a counter beyond that entry means at least one more collective was enqueued.
        if 0 <= st.last_op_id < enq:
            return _Progress(seq + 1, fin >= enq, None,
                             f"newest entries of rank {r} in {group_label(g)}: pg_status counts op {enq} enqueued, "
                             f"the entries end at op {st.last_op_id}")
    elif enq > seq and st.last_p2p_seq < 0:
        # NCCL counts collectives by sequence number, but names a p2p sequence number after a send/recv:
        # only read where this rank recorded no send/recv in the group.
        return _Progress(enq, fin >= enq, None,
                         f"newest entries of rank {r} in {group_label(g)}: pg_status counts collective {enq} "
                         f"enqueued, the entries end at {seq}")
    return _Progress(seq, done, view)


def _irregular(g: GroupAcc, ranks: list[int]) -> list[int]:
    """gloo: ranks that left fewer send/recv out of the record before their last collective than before
    each of at least two earlier ones: in a steady loop that is a skipped send or receive."""
    out = []
    for r in ranks:
        st = g.ranks.get(r)
        gaps = st.recent_gaps if st is not None else ()
        if len(gaps) >= 3 and gaps[-1] < min(gaps[:-1]):
            out.append(r)
    return out


def _p2p_line(g: GroupAcc, present: list[int]) -> str:
    """The missing-records line about gloo's unrecorded send/recv in ``g`` ('' when there are none)."""
    unrec = [(r, g.ranks[r].unrecorded) for r in present if r in g.ranks and g.ranks[r].unrecorded > 0]
    if not unrec:
        return ""
    who = [r for r, _ in unrec]
    counts = ", ".join(str(n) for _, n in unrec[:SHOW])
    return (f"send/recv in {group_label(g)}: gloo records none; op ids count {sum(n for _, n in unrec)} since the "
            f"group was created (rank{'s' if len(who) > 1 else ''} {rank_list(who)}: {counts})")


def _p2p_sentence(who: list[int], behind: tuple[int, ...]) -> str:
    """The explanation's sentence about gloo's unrecorded send/recv of ranks ``who``."""
    if not who:
        return ""
    text = (f" gloo records no send/recv, but op ids show that rank{'s' if len(who) > 1 else ''} {rank_list(who)} "
            "also sent or received between collectives")
    if len(behind) > 1:
        text += (f": ranks {rank_list(behind)} may be blocked in a send or receive (with one another or with a rank "
                 "ahead), which the dumps cannot show, so which of them stopped first cannot be told from them; "
                 "their stacks show where each one waits.")
    elif behind:
        text += (f": rank {behind[0]} may be blocked in a send or receive, which the dumps cannot show; its "
                 "stack shows where it waits.")
    else:
        text += "."
    return text


def _skipped(g: GroupAcc, members: list[int], ctx: Context, odd: list[int], behind: tuple[int, ...],
             top: int, p2p_line: str) -> Problem:
    """gloo: ranks whose op ids show one send/recv fewer than usual before their last collective, while
    other ranks never reached it: most likely those wait for the op they skipped."""
    gaps = "; ".join(f"rank {r}: {g.ranks[r].recent_gaps[-1]} instead of at least {min(g.ranks[r].recent_gaps[:-1])}"
                     for r in odd[:SHOW])
    many = len(odd) > 1
    text = (f"In {group_label(g)}, rank{'s' if many else ''} {rank_list(odd)} sent or received fewer times before "
            f"{'their' if many else 'its'} last collective than before each earlier one (send/recv left out of "
            f"gloo's record, counted from op ids: {gaps}), and rank{'s' if len(behind) > 1 else ''} "
            f"{rank_list(behind)} never reached collective {top}. gloo records no send/recv, so the waiting op "
            f"itself is not in the dumps, but in a steady loop this means rank{'s' if many else ''} "
            f"{rank_list(odd)} skipped a send or receive that a lagging rank waits for.")
    evidence = tuple(st.last for r in odd[:3] if (st := g.ranks.get(r)) is not None and st.last is not None)
    return make_problem(
        g, members, ctx, verdict="p2p-hang", collective_seq=None, op="send/recv", culprit_ranks=tuple(odd),
        waiting_ranks=behind, consequence_ranks=(), explanation=text, evidence=evidence, confidence=0.6,
        missing_records=(p2p_line,) if p2p_line else (),
    )


def _unknown_sentence(unreadable: list[int], empty: list[int]) -> str:
    out = ""
    if unreadable:
        out += (f" Rank{'s' if len(unreadable) > 1 else ''} {rank_list(unreadable)} could not be read (unreadable "
                "dump): state unknown.")
    if empty:
        out += (f" The dump{'s' if len(empty) > 1 else ''} of rank{'s' if len(empty) > 1 else ''} {rank_list(empty)} "
                "hold no entries: state unknown.")
    return out


@dataclass(frozen=True)
class Gap:
    """Something the dumps do not record."""

    line: str
    """What is missing, one line (the report's ``missing_records``)."""
    hides: bool
    """It could hide a problem: with no problem found, the verdict is ``insufficient-evidence``."""


@dataclass(frozen=True)
class _Standoff:
    """One group at its newest collective: who entered it and waits, who stayed behind, what is unknown."""

    label: str
    """The group as the explanation names it."""
    op: str
    """The operation the waiting ranks are in."""
    top: int
    """Its collective sequence number: the newest any member entered."""
    progress: dict[int, _Progress]
    """How far each member with entries got."""
    behind: tuple[int, ...]
    """Members that never entered it."""
    waiting: tuple[int, ...]
    """Members that entered it and did not finish (or, on gloo, saw it fail)."""
    waiting_views: list[EntryView]
    """Their entries for it."""
    failed: bool
    """On gloo: the leaders retired it although members stayed behind, so it failed there."""
    missing: list[int]
    """Members that left no dump."""
    unreadable: list[int]
    """Members whose dump could not be read."""
    empty: list[int]
    """Members whose dump holds no entries."""
    unknown_text: str
    """The sentence about unreadable and empty members ("" if none)."""
    p2p_line: str
    """What gloo left unrecorded in this group ("" if nothing)."""
    p2p_text: str
    """The sentence about lagging ranks that may be blocked in unrecorded send/recv."""


_Finding = tuple[str, float, str, tuple[int, ...], tuple[str, ...]]
"""(verdict, confidence, explanation, culprit ranks, further records the verdict would need)."""


def _behind_hang(s: _Standoff, g: GroupAcc, members: list[int], ctx: Context, present: list[int], gloo: bool,
                 extra: list[Problem]) -> _Finding:
    """Some members wait in the collective and others never entered it: those are the culprits."""
    behind, waiting, culprits = s.behind, s.waiting, tuple(sorted(set(s.behind) | set(s.missing)))
    lag = ", ".join(f"rank {r} at {s.progress[r].seq if s.progress[r].seq >= 0 else 'none'}" for r in behind[:SHOW])
    if s.failed:
        text = (f"In {s.label}, rank{plural(waiting)} {rank_list(waiting)} entered {s.op} (collective "
                f"sequence number {s.top}) and gloo retired it, which it does for failed work too; "
                f"rank{plural(behind)} {rank_list(behind)} never entered it (last entered: "
                f"{lag}), and a collective cannot finish without every member, so it failed there "
                "(most likely timed out waiting). ")
    else:
        text = (f"In {s.label}, rank{plural(waiting)} {rank_list(waiting)} entered {s.op} (collective "
                f"sequence number {s.top}) and wait{'s' if len(waiting) == 1 else ''} in it; "
                f"rank{plural(behind)} {rank_list(behind)} never entered it (last entered: "
                f"{lag}). ")
    text += ("They are the culprits: their stacks show what they do instead." if len(behind) > 1 else
             "It is the culprit: its stack shows what it does instead.")
    odd = [r for r in _irregular(g, present) if r not in culprits] if gloo else []
    if odd:
        extra.append(_skipped(g, members, ctx, odd, behind, s.top, s.p2p_line))
        text += (f" Rank{plural(odd)} {rank_list(odd)} most likely skipped a send or "
                 "receive (see the p2p-hang).")
    text += s.p2p_text
    if s.missing:
        text += f" Rank{plural(s.missing)} {rank_list(s.missing)} left no dump."
    text += s.unknown_text
    return "hang", (0.7 if s.failed or s.p2p_line else 0.9), text, culprits, ()


def _silent_live_ranks(s: _Standoff, ctx: Context) -> _Finding:
    """Every dumped member waits for members the supervisor saw alive but silent: a hang they caused."""
    stopped = [r for r in s.missing if r in ctx.stopped]
    silent = [r for r in s.missing if r not in ctx.stopped]
    how = []
    if stopped:
        how.append(f"rank{plural(stopped)} {rank_list(stopped)} {'was' if len(stopped) == 1 else 'were'} alive "
                   "but stopped (SIGSTOP or a debugger)")
    if silent:
        how.append(f"rank{plural(silent)} {rank_list(silent)} {'was' if len(silent) == 1 else 'were'} running "
                   "but did not answer the dump request")
    text = (f"In {s.label}, rank{plural(s.waiting)} {rank_list(s.waiting)} wait in {s.op} "
            f"(collective sequence number {s.top}) for rank{plural(s.missing)} {rank_list(s.missing)}, which "
            f"left no dump: when the supervisor asked, {' and '.join(how)}. "
            f"{'They are' if len(s.missing) > 1 else 'It is'} the culprit." + s.unknown_text)
    return "hang", 0.9, text, tuple(sorted(s.missing)), ()


def _crash_before_dump(s: _Standoff) -> _Finding:
    """Every dumped member waits, and members without a dump never answered: they died."""
    text = (f"In {s.label}, rank{plural(s.waiting)} {rank_list(s.waiting)} wait in {s.op} "
            f"(collective sequence number {s.top}) for rank{plural(s.missing)} "
            f"{rank_list(s.missing)}, which left no dump: the process died (or was killed) before "
            "it could be asked for one." + s.unknown_text)
    return "crash", 0.9, text, tuple(sorted(s.missing)), ()


def _unknown_members(s: _Standoff) -> _Finding:
    """Every readable member waits; only the unknown ones can say whether they entered: an unknown
    rank is never evidence that the collective is merely in flight."""
    unreadable, empty = s.unreadable, s.empty
    unknown = sorted(set(unreadable) | set(empty))
    what = []
    if unreadable:
        what.append(f"the dump{plural(unreadable)} of rank{plural(unreadable)} {rank_list(unreadable)} "
                    "could not be read")
    if empty:
        what.append(f"the dump{plural(empty)} of rank{plural(empty)} {rank_list(empty)} hold no entries")
    many = len(unknown) > 1
    text = (f"In {s.label}, rank{plural(s.waiting)} {rank_list(s.waiting)} entered {s.op} "
            f"(collective sequence number {s.top}) and wait{'s' if len(s.waiting) == 1 else ''} in it; "
            f"{' and '.join(what)}, so whether {'they' if many else 'it'} entered it is "
            f"unknown: {'they are' if many else 'it is'} the suspect"
            f"{'s' if many else ''}. Check {'their' if many else 'its'} "
            "stacks and logs, or gather the dumps again.")
    # unreadable files: incomplete (as for the whole report); readable but empty: the records lack it
    records = (f"entries of rank{plural(empty)} {rank_list(empty)}",) if empty else ()
    return ("incomplete" if unreadable else "insufficient-evidence"), 0.5, text, tuple(unknown), records


def _stuck_inside(s: _Standoff, gloo: bool) -> _Finding | None:
    """Every member entered the collective: stuck on a device, inside the collective, or in flight (None)."""
    started = [v.rank for v in s.waiting_views if v.state == "started"]
    sched = tuple(v.rank for v in s.waiting_views if v.state == "scheduled")
    if started and sched:
        text = (f"In {s.label} every member entered {s.op} (sequence number {s.top}), but on rank"
                f"{plural(sched)} {rank_list(sched)} the operation never started on the "
                f"device while it started on {rank_list(started)}: the device or its stream is stuck "
                "there (a faulty GPU or an earlier kernel that never finished).")
        return "hang", 0.7, text, sched, ()
    if not gloo and any(v.retired for v in s.waiting_views):
        text = (f"In {s.label} every member entered {s.op} (sequence number {s.top}) and none finished "
                "before the timeout: the fault is inside the collective (network or device), "
                "not a rank that stayed away.")
        return "hang", 0.5, text, (), ()
    return None  # in flight on every member: nothing says it is stuck


def _standoff(g: GroupAcc, members: list[int], missing: list[int], ctx: Context, gloo: bool,
              present: list[int], progress: dict[int, _Progress], p2p_ranks: set[int]) -> _Standoff:
    top = max(p.seq for p in progress.values())
    leaders = [r for r in present if progress[r].seq == top]
    behind = tuple(r for r in present if progress[r].seq < top)
    waiting = tuple(r for r in leaders if not progress[r].done)
    # On gloo a collective that some members never entered cannot have finished on the others, so
    # there "retired" can only mean it failed (timed out, or the connection broke): they were waiting.
    failed = not waiting and bool(behind) and gloo
    if failed:
        waiting = tuple(leaders)
    waiting_views = [v for r in waiting if (v := progress[r].view) is not None]
    op = waiting_views[0].op if waiting_views else (g.seqs[top].ref.view.op if top in g.seqs else "")
    unreadable = [r for r in members if r in ctx.unreadable]
    empty = [r for r in members if r in ctx.empty]
    # a lagging rank that sends or receives anywhere may be blocked in it, unseen
    p2p_text = _p2p_sentence(sorted(p2p_ranks & set(present)) if set(behind) & p2p_ranks else [], behind)
    return _Standoff(label=group_label(g), op=op, top=top, progress=progress, behind=behind, waiting=waiting,
                     waiting_views=waiting_views, failed=failed, missing=missing, unreadable=unreadable,
                     empty=empty, unknown_text=_unknown_sentence(unreadable, empty),
                     p2p_line=_p2p_line(g, present) if gloo else "", p2p_text=p2p_text)


def _stuck(g: GroupAcc, members: list[int], missing: list[int], ctx: Context, gloo: bool,
           notes: list[Gap], p2p_ranks: set[int], extra: list[Problem]) -> Problem | None:
    """A hang, crash or unknown-rank problem of ``g`` (None when nothing is stuck). ``p2p_ranks``: ranks
    that do send/recv gloo did not record, in any group; ``extra`` receives a gloo p2p-hang inferred
    from op ids, when one rank skipped a send or receive."""
    present = [r for r in members if r in ctx.dumped and r not in ctx.empty]
    progress = {r: _progress(g, r, gloo) for r in present}
    ahead = [p.ahead for p in progress.values() if p.ahead]
    notes.extend(Gap(a, False) for a in ahead[:4])  # the counters say what the rank did: nothing hidden
    if not progress:
        return None
    s = _standoff(g, members, missing, ctx, gloo, present, progress, p2p_ranks)
    if s.p2p_line:
        notes.append(Gap(s.p2p_line, True))
    records = tuple(x for x in (s.p2p_line, *ahead[:2]) if x)
    if s.p2p_text and not s.p2p_line:
        records = (*records, "send/recv on gloo (never recorded)")
    if s.waiting:
        if s.behind:
            found: _Finding | None = _behind_hang(s, g, members, ctx, present, gloo, extra)
        elif missing and set(missing) <= (ctx.stopped | ctx.unanswered):
            found = _silent_live_ranks(s, ctx)
        elif missing:
            found = _crash_before_dump(s)
        elif s.unreadable or s.empty:
            found = _unknown_members(s)
        else:
            found = _stuck_inside(s, gloo)
        if found is None:
            return None
        verdict, conf, text, culprits, more_records = found
        last_of_behind = [st.last for r in s.behind[:3] if (st := g.ranks.get(r)) and st.last]
        return make_problem(
            g, members, ctx, verdict=verdict, collective_seq=s.top, op=s.op, culprit_ranks=culprits,
            waiting_ranks=s.waiting, consequence_ranks=(), explanation=text,
            evidence=(*last_of_behind, *s.waiting_views[:3]), confidence=conf,
            missing_records=(*records, *more_records),
        )
    if missing and gloo and set(missing) <= (ctx.stopped | ctx.unanswered):
        # The peers' work is retired, yet the ranks without a dump were alive and silent when asked:
        # they stopped, and the others wait (or failed) on them.
        how = "stopped (SIGSTOP or a debugger)" if set(missing) <= ctx.stopped else "alive but silent"
        text = (f"Rank{plural(missing)} {rank_list(missing)} of {s.label} left no dump: when the supervisor asked, "
                f"{'it was' if len(missing) == 1 else 'they were'} {how}; the others last entered {s.op} "
                f"(collective sequence number {s.top}) and cannot go on without "
                f"{'it' if len(missing) == 1 else 'them'}. {'It is' if len(missing) == 1 else 'They are'} "
                "the culprit.")
        return make_problem(
            g, members, ctx, verdict="hang", collective_seq=s.top, op=s.op, culprit_ranks=tuple(missing),
            waiting_ranks=(), consequence_ranks=(), explanation=text, evidence=(), confidence=0.8,
            missing_records=records,
        )
    if missing and gloo:
        text = (f"Rank{plural(missing)} {rank_list(missing)} of {s.label} left no dump; "
                f"the others last entered {s.op} (collective sequence number {s.top}). gloo records no "
                "completion times and retires failed work too, so whether the peers finished it or "
                "failed on the lost connection cannot be read from the dumps: most likely the rank died.")
        return make_problem(
            g, members, ctx, verdict="crash", collective_seq=s.top, op=s.op, culprit_ranks=tuple(missing),
            waiting_ranks=(), consequence_ranks=(), explanation=text, evidence=(), confidence=0.6,
            missing_records=records,
        )
    return None


def _p2p(g: GroupAcc, members: list[int], ctx: Context, busy: set[int]) -> Problem | None:
    posted: dict[tuple[int, int, str], EntryView] = {}
    for st in g.ranks.values():
        for a in st.active:
            if a.is_p2p and a.peer is not None:
                posted.setdefault((a.rank, a.peer, a.op), a)
    unmatched: set[int] = set()
    waiting: list[EntryView] = []
    for (rank, peer, op), view in posted.items():
        other = "recv" if op == "send" else "send"
        if (peer, rank, other) not in posted:
            unmatched.add(peer)
            waiting.append(view)
    if not waiting:
        return None
    # In a pipeline the peer that never sent may itself wait, earlier in its program, for the stage
    # before it: a link of the chain, not its cause. A cause is a peer that waits for nothing, or one
    # that went past the point: it entered a later collective of this group than the one the waiting
    # op follows, so it skipped the matching op. When no peer qualifies, every one is named.
    expected: dict[int, int] = {}
    for v in waiting:
        if v.peer is not None and v.after_seq is not None:
            expected[v.peer] = min(expected.get(v.peer, v.after_seq), v.after_seq)
    culprits: set[int] = set()
    for r in unmatched:
        state = g.ranks.get(r)
        past = state is not None and state.last_seq > expected.get(r, state.last_seq)
        if r in ctx.dumped and (r not in busy or past):
            culprits.add(r)
    culprits = culprits or unmatched
    waiting.sort(key=lambda v: (v.rank, v.seq))
    first = next((v for v in waiting if v.peer in culprits), waiting[0])
    lines = "; ".join(
        f"rank {v.rank} posted {v.op} {'to' if v.op == 'send' else 'from'} rank {v.peer}{where(v)}"
        for v in waiting[:SHOW]
    )
    chain = sorted(unmatched - culprits)
    text = (f"In {group_label(g)} a point-to-point operation waits for a peer that never posted the matching "
            f"one: {lines}. The peer{'s' if len(culprits) > 1 else ''} {rank_list(sorted(culprits))} "
            "did not post the matching send/recv.")
    if chain:
        many = len(chain) > 1
        text += (f" Rank{'s' if many else ''} {rank_list(chain)} did not either, but "
                 f"{'they wait' if many else 'it waits'} in an op of {'their' if many else 'its'} own that comes "
                 "first: a consequence.")
    return make_problem(
        g, members, ctx, verdict="p2p-hang", collective_seq=first.seq, op=first.op,
        culprit_ranks=tuple(sorted(culprits)), waiting_ranks=tuple(sorted({v.rank for v in waiting})),
        consequence_ranks=(), explanation=text, evidence=tuple(waiting[:6]), confidence=0.85,
    )


def group_problems(m: Matcher, ctx: Context, notes: list[Gap] | None = None,
                   inferred: dict[str, list[int]] | None = None) -> list[Problem]:
    """Every problem of every group, before cross-group reasoning. ``notes`` receives one line per kind of
    record the dumps lack (see `missing_records`); ``inferred``: group name -> members where the dumps do
    not name them (`trainguard.localize.membership.infer_members`)."""
    gloo = "gloo" in m.backends
    notes = [] if notes is None else notes
    # ranks with an unfinished op in some group, and (gloo) ranks that do send/recv gloo never recorded
    busy: set[int] = set()
    p2p_ranks: set[int] = set()
    for g in m.groups.values():
        for r, st in g.ranks.items():
            if st.active:
                busy.add(r)
            if st.unrecorded > 0:
                p2p_ranks.add(r)
    out: list[Problem] = []
    for g in m.groups.values():
        members = (inferred or {}).get(g.name) or g.members(ctx.world)
        missing = sorted(r for r in members if r not in m.ranks and r not in ctx.unreadable)
        div = _divergence(g, members, missing, ctx, gloo)
        if div is not None:
            out.append(div)
            if gloo:  # the divergence decides; the missing send/recv are still worth knowing
                line = _p2p_line(g, [r for r in members if r in ctx.dumped])
                if line:
                    notes.append(Gap(line, True))
        else:
            stuck = _stuck(g, members, missing, ctx, gloo, notes, p2p_ranks, out)
            if stuck is not None:
                out.append(stuck)
        p2p = _p2p(g, members, ctx, busy)
        if p2p is not None:
            out.append(p2p)
    return out


def missing_records(ctx: Context, notes: list[Gap]) -> tuple[list[str], bool]:
    """What the dumps lack, one line each, and whether it could hide a problem (then "healthy" would be a
    guess: the verdict is ``insufficient-evidence``). ``notes``: what `group_problems` found."""
    lines = list(dict.fromkeys(n.line for n in notes))  # one line per distinct note, in order
    decisive = any(n.hides for n in notes)
    empty = sorted(ctx.empty)
    if empty:
        lines.insert(0, f"entries of rank{'s' if len(empty) > 1 else ''} {rank_list(empty)}: the dump"
                        f"{'s hold' if len(empty) > 1 else ' holds'} none (flight recorder off, e.g. "
                        "TORCH_FR_BUFFER_SIZE=0, or a counters-only dump)")
        decisive = True
    return lines[:16], decisive


def order_problems(problems: list[Problem]) -> list[Problem]:
    """Drop problems another one fully explains, then put causes before consequences."""
    explained: set[int] = set()
    for p in problems:
        if p.verdict in ("mismatch", "desync"):
            explained |= set(p.consequence_ranks)
    kept: list[Problem] = []
    seen_crash: set[tuple[int, ...]] = set()
    for p in sorted(problems, key=lambda p: -len(p.waiting_ranks)):
        if p.verdict == "crash" and set(p.culprit_ranks) <= explained:
            continue
        if p.verdict == "crash":
            if p.culprit_ranks in seen_crash:
                continue
            seen_crash.add(p.culprit_ranks)
        kept.append(p)

    def blocks(a: Problem, b: Problem) -> bool:
        stuck = set(a.waiting_ranks) | set(a.consequence_ranks) | (
            set(a.culprit_ranks) if a.verdict == "crash" else set())
        return a is not b and bool(set(b.culprit_ranks) & stuck)

    # list.sort empties the list while it runs: the key must read a copy, or nothing looks blocked
    snapshot = list(kept)

    def key(p: Problem) -> tuple[int, int, int, int, str]:
        # blocked problems last; in a cycle (a cross-group deadlock) the fewest culprits first
        blocked = any(blocks(q, p) and not blocks(p, q) for q in snapshot)
        return (int(blocked), _PRIORITY.get(p.verdict, 9), len(p.culprit_ranks), -len(p.waiting_ranks),
                p.process_group)

    kept.sort(key=key)
    return [
        replace(p, blocked_by=tuple(j for j, q in enumerate(kept) if blocks(q, p) and not blocks(p, q)))
        for p in kept
    ]
