"""From matched collectives to verdicts: per group, then causes ordered before their consequences."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from trainguard.localize.match import GroupAcc, Matcher
from trainguard.localize.model import EntryView, Problem

log = logging.getLogger(__name__)

_PRIORITY = {"mismatch": 0, "desync": 1, "crash": 2, "hang": 3, "p2p-hang": 4, "incomplete": 5}
_SHOW = 8  # ranks named in an explanation before "and N more"


@dataclass(frozen=True)
class Context:
    """What the verdicts need besides the matched entries."""

    world: frozenset[int]
    """Every rank expected to have a dump (dumps read, 0..max rank, rank map, run events)."""
    dumped: frozenset[int]
    """Ranks whose dump was read."""
    unreadable: frozenset[int]
    """Ranks whose file exists but could not be read: state unknown, never blamed."""
    hosts: dict[int, str]
    evidence_files: Callable[[int], tuple[str, ...]]
    """Rank -> its stacks / log-tail evidence (paths and last lines)."""


def _names(ranks: list[int] | tuple[int, ...]) -> str:
    shown = ", ".join(str(r) for r in list(ranks)[:_SHOW])
    more = len(ranks) - _SHOW
    return f"{shown} and {more} more" if more > 0 else shown


def _hosts(ranks: tuple[int, ...], ctx: Context) -> tuple[str, ...]:
    out: list[str] = []
    for r in ranks:
        h = ctx.hosts.get(r)
        if h and h not in out:
            out.append(h)
    return tuple(out)


def _where(v: EntryView | None) -> str:
    if v is None or not v.frames:
        return ""
    user = [f for f in v.frames if "torch/distributed" not in f]
    return f" at {(user or list(v.frames))[0]}"


def _label(g: GroupAcc) -> str:
    return f"group {g.name} ({g.desc})" if g.desc and g.desc != "undefined" else f"group {g.name}"


def _problem(g: GroupAcc, members: list[int], ctx: Context, **kw: object) -> Problem:
    culprits: tuple[int, ...] = kw.pop("culprit_ranks")  # type: ignore[assignment]
    files: list[str] = []
    for r in list(culprits)[:4]:
        files.extend(ctx.evidence_files(r))
    return Problem(
        process_group=g.name,
        process_group_desc=g.desc,
        group_ranks=tuple(members),
        culprit_ranks=culprits,
        culprit_hosts=_hosts(culprits, ctx),
        evidence_files=tuple(files),
        **kw,  # type: ignore[arg-type]
    )


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
        f"rank{'s' if v.count > 1 else ''} {_names(v.holders)}{' (+more)' if v.count > len(v.holders) else ''}: "
        f"{v.view.op} in {v.view.input_sizes} {v.view.input_dtypes or ''}".rstrip()
        for v in variants
    )
    what = ("called different collectives" if verdict == "desync"
            else "called the same collective with different sizes or dtypes")
    text = (
        f"In {_label(g)} the ranks {what} at collective sequence number {seq}: {detail}. "
        + ("No majority: the culprit cannot be told apart. " if tie else
           f"The majority ({major.count} rank{'s' if major.count > 1 else ''}) called {major.view.op}; "
           f"rank{'s' if len(culprits) > 1 else ''} {_names(culprits)} diverged"
           f"{_where(minority[0].view)} and caused everything after it in this group to fail or hang. ")
    )
    if missing:
        why = ("gloo aborts a receiver whose incoming message has the wrong size" if gloo
               else "the job failed after it")
        text += (f"{'Ranks' if len(missing) > 1 else 'Rank'} {_names(missing)} left no dump: the divergence "
                 f"explains it ({why}), so {'they are' if len(missing) > 1 else 'it is'} listed as "
                 "a consequence, not a culprit.")
    waiting = tuple(sorted(r for r, st in g.ranks.items() if any(not a.is_p2p for a in st.active)))
    return _problem(
        g, members, ctx, verdict=verdict, collective_seq=seq, op=major.view.op, culprit_ranks=culprits,
        waiting_ranks=waiting, consequence_ranks=tuple(missing), explanation=text.strip(),
        evidence=tuple(v.view for v in variants[:6]), confidence=0.5 if tie else 0.95,
    )


def _stuck(g: GroupAcc, members: list[int], missing: list[int], ctx: Context, gloo: bool) -> Problem | None:
    present = [r for r in members if r in ctx.dumped]
    last: dict[int, int] = {}
    for r in present:
        st = g.ranks.get(r)
        seq = st.last_seq if st else -1
        status = g.status.get(r)
        if status:
            seq = max(seq, status.get("last_enqueued_collective", -1))
        last[r] = seq
    if not last:
        return None
    top = max(last.values())
    waiting_views = []
    for r in present:
        st = g.ranks.get(r)
        if st and last[r] == top and st.last is not None and st.last.seq == top and not st.last.completed:
            waiting_views.append(st.last)
    waiting = tuple(v.rank for v in waiting_views)
    behind = tuple(r for r in present if last[r] < top)
    op = waiting_views[0].op if waiting_views else (g.seqs[top].ref.view.op if top in g.seqs else "")
    label = _label(g)
    unknown = [r for r in members if r in ctx.unreadable]
    if waiting:
        culprits = tuple(sorted(set(behind) | set(missing)))
        evidence: list[EntryView] = []
        for r in behind[:3]:
            st = g.ranks.get(r)
            if st and st.last:
                evidence.append(st.last)
        evidence.extend(waiting_views[:3])
        if behind:
            lag = ", ".join(f"rank {r} at {last[r] if last[r] >= 0 else 'none'}" for r in behind[:_SHOW])
            text = (f"In {label}, rank{'s' if len(waiting) > 1 else ''} {_names(waiting)} entered {op} "
                    f"(collective sequence number {top}) and wait{'s' if len(waiting) == 1 else ''} in it; "
                    f"rank{'s' if len(behind) > 1 else ''} {_names(behind)} never entered it (last entered: "
                    f"{lag}). " + ("They are the culprits: their stacks show what they do instead."
                                   if len(behind) > 1 else
                                   "It is the culprit: its stack shows what it does instead."))
            if missing:
                text += f" Rank{'s' if len(missing) > 1 else ''} {_names(missing)} left no dump."
            if unknown:
                text += (f" Rank{'s' if len(unknown) > 1 else ''} {_names(unknown)} could not be read (unreadable "
                         "dump): state unknown.")
            verdict, conf = "hang", 0.9
        elif missing:
            text = (f"In {label}, rank{'s' if len(waiting) > 1 else ''} {_names(waiting)} wait in {op} "
                    f"(collective sequence number {top}) for rank{'s' if len(missing) > 1 else ''} "
                    f"{_names(missing)}, which left no dump: the process died (or was killed) before "
                    "it could be asked for one.")
            if unknown:
                text += (f" Rank{'s' if len(unknown) > 1 else ''} {_names(unknown)} could not be read (unreadable "
                         "dump): state unknown.")
            verdict, conf = "crash", 0.9
        elif unknown:
            # Every readable member waits; only the unreadable ones can say whether they entered: an
            # unreadable rank is unknown, never evidence that the collective is merely in flight.
            culprits = tuple(unknown)
            text = (f"In {label}, rank{'s' if len(waiting) > 1 else ''} {_names(waiting)} entered {op} "
                    f"(collective sequence number {top}) and wait{'s' if len(waiting) == 1 else ''} in it; "
                    f"the dump{'s' if len(unknown) > 1 else ''} of rank{'s' if len(unknown) > 1 else ''} "
                    f"{_names(unknown)} could not be read, so whether {'they' if len(unknown) > 1 else 'it'} "
                    f"entered it is unknown: {'they are' if len(unknown) > 1 else 'it is'} the suspect"
                    f"{'s' if len(unknown) > 1 else ''}. Check {'their' if len(unknown) > 1 else 'its'} "
                    "stacks and logs, or gather the dumps again.")
            verdict, conf = "incomplete", 0.5
        else:
            started = [v.rank for v in waiting_views if v.state == "started"]
            sched = tuple(v.rank for v in waiting_views if v.state == "scheduled")
            if started and sched:
                culprits = sched
                text = (f"In {label} every member entered {op} (sequence number {top}), but on rank"
                        f"{'s' if len(sched) > 1 else ''} {_names(sched)} the operation never started on the "
                        f"device while it started on {_names(started)}: the device or its stream is stuck "
                        "there (a faulty GPU or an earlier kernel that never finished).")
                verdict, conf = "hang", 0.7
            elif not gloo and any(v.retired for v in waiting_views):
                text = (f"In {label} every member entered {op} (sequence number {top}) and none finished "
                        "before the timeout: the fault is inside the collective (network or device), "
                        "not a rank that stayed away.")
                verdict, conf = "hang", 0.5
            else:
                return None  # in flight on every member: nothing says it is stuck
        return _problem(
            g, members, ctx, verdict=verdict, collective_seq=top, op=op, culprit_ranks=culprits,
            waiting_ranks=waiting, consequence_ranks=(), explanation=text, evidence=tuple(evidence),
            confidence=conf,
        )
    if missing and gloo:
        text = (f"Rank{'s' if len(missing) > 1 else ''} {_names(missing)} of {label} left no dump; "
                f"the others last entered {op} (collective sequence number {top}). gloo records no "
                "completion times and retires failed work too, so whether the peers finished it or "
                "failed on the lost connection cannot be read from the dumps: most likely the rank died.")
        return _problem(
            g, members, ctx, verdict="crash", collective_seq=top, op=op, culprit_ranks=tuple(missing),
            waiting_ranks=(), consequence_ranks=(), explanation=text, evidence=(), confidence=0.6,
        )
    return None


def _p2p(g: GroupAcc, members: list[int], ctx: Context) -> Problem | None:
    posted: dict[tuple[int, int, str], EntryView] = {}
    for st in g.ranks.values():
        for a in st.active:
            if a.is_p2p and a.peer is not None:
                posted.setdefault((a.rank, a.peer, a.op), a)
    culprits: set[int] = set()
    waiting: list[EntryView] = []
    for (rank, peer, op), view in posted.items():
        other = "recv" if op == "send" else "send"
        if (peer, rank, other) not in posted:
            culprits.add(peer)
            waiting.append(view)
    if not waiting:
        return None
    waiting.sort(key=lambda v: (v.rank, v.seq))
    first = waiting[0]
    lines = "; ".join(
        f"rank {v.rank} posted {v.op} {'to' if v.op == 'send' else 'from'} rank {v.peer}{_where(v)}"
        for v in waiting[:_SHOW]
    )
    text = (f"In {_label(g)} a point-to-point operation waits for a peer that never posted the matching "
            f"one: {lines}. The peer{'s' if len(culprits) > 1 else ''} {_names(sorted(culprits))} "
            "did not post the matching send/recv.")
    return _problem(
        g, members, ctx, verdict="p2p-hang", collective_seq=first.seq, op=first.op,
        culprit_ranks=tuple(sorted(culprits)), waiting_ranks=tuple(sorted({v.rank for v in waiting})),
        consequence_ranks=(), explanation=text, evidence=tuple(waiting[:6]), confidence=0.85,
    )


def group_problems(m: Matcher, ctx: Context) -> list[Problem]:
    """Every problem of every group, before cross-group reasoning."""
    gloo = "gloo" in m.backends
    out: list[Problem] = []
    for g in m.groups.values():
        members = g.members(ctx.world)
        missing = sorted(r for r in members if r not in m.ranks and r not in ctx.unreadable)
        div = _divergence(g, members, missing, ctx, gloo)
        if div is not None:
            out.append(div)
        else:
            stuck = _stuck(g, members, missing, ctx, gloo)
            if stuck is not None:
                out.append(stuck)
        p2p = _p2p(g, members, ctx)
        if p2p is not None:
            out.append(p2p)
    return out


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

    def key(p: Problem) -> tuple[int, int, int, int, str]:
        # blocked problems last; in a cycle (a cross-group deadlock) the fewest culprits first
        blocked = any(blocks(q, p) and not blocks(p, q) for q in kept)
        return (int(blocked), _PRIORITY.get(p.verdict, 9), len(p.culprit_ranks), -len(p.waiting_ranks),
                p.process_group)

    kept.sort(key=key)
    return [
        replace(p, blocked_by=tuple(j for j, q in enumerate(kept) if blocks(q, p) and not blocks(p, q)))
        for p in kept
    ]
