"""Building blocks of the verdicts: what they know besides the entries, and how a verdict names ranks,
hosts, places and groups (`trainguard.localize.verdicts` decides; this module only words and assembles)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainguard.localize.match import GroupAcc
from trainguard.localize.model import EntryView, Problem

SHOW = 8  # ranks named in an explanation before "and N more"


@dataclass(frozen=True)
class Context:
    """What the verdicts need besides the matched entries."""

    world: frozenset[int]
    """Every rank expected to have a dump (dumps read, 0..max rank, rank map, run events)."""
    dumped: frozenset[int]
    """Ranks whose dump was read."""
    unreadable: frozenset[int]
    """Ranks whose file exists but could not be read: state unknown, never blamed."""
    empty: frozenset[int]
    """Ranks whose dump was read but holds no entry (recorder off): state unknown, never blamed."""
    hosts: dict[int, str]
    evidence_files: Callable[[int], tuple[str, ...]]
    """Rank -> its stacks / log-tail evidence (paths and last lines)."""
    stopped: frozenset[int] = frozenset()
    """Ranks the supervisor saw alive but stopped when it gathered the dumps (`trainguard.localize.observed`)."""
    unanswered: frozenset[int] = frozenset()
    """Ranks the supervisor saw alive that did not answer its dump request."""


def rank_list(ranks: list[int] | tuple[int, ...]) -> str:
    shown = ", ".join(str(r) for r in list(ranks)[:SHOW])
    more = len(ranks) - SHOW
    return f"{shown} and {more} more" if more > 0 else shown


def hosts_of(ranks: tuple[int, ...], ctx: Context) -> tuple[str, ...]:
    out: list[str] = []
    for r in ranks:
        h = ctx.hosts.get(r)
        if h and h not in out:
            out.append(h)
    return tuple(out)


def where(v: EntryView | None) -> str:
    if v is None or not v.frames:
        return ""
    user = [f for f in v.frames if "torch/distributed" not in f]
    return f" at {(user or list(v.frames))[0]}"


def group_label(g: GroupAcc) -> str:
    return f"group {g.name} ({g.desc})" if g.desc and g.desc != "undefined" else f"group {g.name}"


def make_problem(g: GroupAcc, members: list[int], ctx: Context, **kw: object) -> Problem:
    culprits: tuple[int, ...] = kw.pop("culprit_ranks")  # type: ignore[assignment]
    files: list[str] = []
    for r in list(culprits)[:4]:
        files.extend(ctx.evidence_files(r))
    return Problem(
        process_group=g.name,
        process_group_desc=g.desc,
        group_ranks=tuple(members),
        culprit_ranks=culprits,
        culprit_hosts=hosts_of(culprits, ctx),
        evidence_files=tuple(files),
        **kw,  # type: ignore[arg-type]
    )


def plural(items: list[int] | tuple[int, ...]) -> str:
    return "s" if len(items) > 1 else ""
