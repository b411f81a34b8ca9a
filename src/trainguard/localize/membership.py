"""Group membership the dumps do not name, and the verdict that follows from it.

gloo's ``pg_config`` is broken, so a sub-group's members are the ranks whose entries name it: a rank
that died and left no dump belongs to no sub-group, and its peers look healthy. `infer_members` puts
such ranks back into the sub-group whose sibling layout has a hole where they are; `common_cause`
then names the rank every blocked group has in common that cannot answer, and lists its peers as waiting.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from trainguard.localize.match import GroupAcc, Matcher
from trainguard.localize.model import Problem
from trainguard.localize.problems import rank_list

log = logging.getLogger(__name__)

def _order(name: str) -> tuple[int, str]:
    return (int(name), name) if name.isdigit() else (1 << 30, name)


def _families(groups: list[GroupAcc]) -> list[list[GroupAcc]]:
    """Sub-groups split into families of pairwise disjoint groups (tensor-parallel groups apart from
    data-parallel ones, which cross them). Creation order first: a job creates one family at a time."""
    fams: list[tuple[str, list[GroupAcc], set[int]]] = []
    for g in sorted(groups, key=lambda g: _order(g.name)):
        seen = set(g.ranks)
        for desc, fam, used in fams:
            if desc == g.desc and not (used & seen):
                fam.append(g)
                used |= seen
                break
        else:
            fams.append((g.desc, [g], set(seen)))
    return [fam for _, fam, _ in fams if len(fam) > 1]


def _completions(g: GroupAcc, fam: list[GroupAcc], silent: frozenset[int],
                 world: frozenset[int]) -> set[frozenset[int]]:
    """Member sets for ``g`` that repeat a complete sibling's layout, shifted: holes only at silent ranks."""
    seen = set(g.ranks)
    size = max(len(s.ranks) for s in fam)
    others = set().union(*(set(s.ranks) for s in fam if s is not g))
    out: set[frozenset[int]] = set()
    first = min(seen)
    for sib in fam:
        if len(sib.ranks) != size:
            continue
        for s0 in sib.ranks:
            shifted = frozenset(x + first - s0 for x in sib.ranks)
            if (seen <= shifted and shifted <= world and not (shifted & others)
                    and (shifted - seen) <= silent):
                out.add(shifted)
    return out


def infer_members(m: Matcher, world: frozenset[int]) -> dict[str, list[int]]:
    """Group name -> members, for sub-groups without a valid ``pg_config`` whose layout has holes that
    only ranks without entries can fill (exactly one way). Other groups are absent: their members
    stay as `GroupAcc.members` infers them."""
    known = set().union(*(set(g.ranks) for g in m.groups.values())) if m.groups else set()
    silent = frozenset(world - known)
    if not silent:
        return {}
    subs = [g for g in m.groups.values()
            if not g.config_ranks and g.desc != "default_pg" and g.name != "0" and g.ranks]
    out: dict[str, list[int]] = {}
    for fam in _families(subs):
        size = max(len(g.ranks) for g in fam)
        for g in fam:
            if len(g.ranks) == size:
                continue
            found = _completions(g, fam, silent, world)
            if len(found) == 1:
                members = sorted(next(iter(found)))
                out[g.name] = members
                log.debug("group %s: members %s inferred from its siblings' layout", g.name, members)
    return out


def _lost(p: Problem) -> bool:
    """A crash whose culprits left no dump (or could not be asked): they cannot answer."""
    return p.verdict == "crash" and bool(p.culprit_ranks)


def common_cause(problems: list[Problem], m: Matcher, dumped: frozenset[int],
                 hosts: dict[int, str]) -> list[Problem]:
    """A hang whose culprits with a dump are all peers waiting in a sub-group on ranks that left none:
    the ranks without a dump are the culprits of both; the peers are waiting, not culprits."""
    crashes = [p for p in problems if _lost(p)]
    if not crashes:
        return problems
    out: list[Problem] = []
    changed: dict[int, Problem] = {}
    for p in problems:
        if p.verdict != "hang":
            out.append(p)
            continue
        present = [r for r in p.culprit_ranks if r in dumped]
        lost_here = set(p.culprit_ranks) - set(present)
        holders: list[Problem] = []
        for r in present:
            k = next((k for k in crashes if r in k.group_ranks and r not in k.culprit_ranks
                      and set(k.culprit_ranks) <= lost_here and _went_on(m, p, k, r)), None)
            if k is None:
                break
            if k not in holders:
                holders.append(k)
        else:
            if not present or not holders:
                out.append(p)
                continue
            root = tuple(sorted({r for k in holders for r in k.culprit_ranks}))
            where = "; ".join(f"group {k.process_group} ({k.op}, sequence number {k.collective_seq}) on "
                              f"rank{'s' if len(k.culprit_ranks) > 1 else ''} {rank_list(k.culprit_ranks)}"
                              for k in holders)
            many = len(root) > 1
            # the collective cannot have finished without the lost ranks: a leader that gloo retired failed
            g = m.groups.get(p.process_group)
            leaders = {r for r, st in g.ranks.items() if st.last_seq == p.collective_seq} if g else set()
            p = replace(p, waiting_ranks=tuple(sorted(set(p.waiting_ranks) | (leaders & dumped))))
            label = (f"group {p.process_group} ({p.process_group_desc})"
                     if p.process_group_desc and p.process_group_desc != "undefined" else f"group {p.process_group}")
            text = (f"In {label}, rank{'s' if len(p.waiting_ranks) > 1 else ''} {rank_list(p.waiting_ranks)} "
                    f"entered {p.op} (collective sequence number {p.collective_seq}) and wait for "
                    f"rank{'s' if len(present) > 1 else ''} {rank_list(present)}, which never entered it: "
                    f"{'they wait' if len(present) > 1 else 'it waits'} in {where}, which left no dump. "
                    f"Rank{'s' if many else ''} {rank_list(root)} {'are' if many else 'is'} what every blocked "
                    f"group has in common and cannot answer: the culprit{'s' if many else ''}; "
                    f"rank{'s' if len(present) > 1 else ''} {rank_list(present)} "
                    f"{'are' if len(present) > 1 else 'is'} waiting, not culprit{'s' if len(present) > 1 else ''}.")
            root_hosts = tuple(dict.fromkeys(hosts[r] for r in root if hosts.get(r)))
            p = replace(p, culprit_ranks=root, culprit_hosts=root_hosts, explanation=text,
                        confidence=max(p.confidence, 0.8))
            for k in holders:
                changed[id(k)] = _corroborated(k, p, present)
        out.append(p)
    return [changed.get(id(p), p) for p in out]


def _went_on(m: Matcher, hang: Problem, crash: Problem, r: int) -> bool:
    """Rank ``r``'s entry in the crash's group is newer than its last one in the hang's group: it went on
    from the hang's group to the crash's, and waits there (no creation times: assumed)."""
    a, b = m.groups.get(hang.process_group), m.groups.get(crash.process_group)
    sa, sb = (a.ranks.get(r) if a else None), (b.ranks.get(r) if b else None)
    if sa is None or sb is None or sa.last is None or sb.last is None:
        return False
    ta, tb = sa.last.time_created_ns, sb.last.time_created_ns
    return not (ta and tb) or tb >= ta


def _corroborated(k: Problem, hang: Problem, peers: list[int]) -> Problem:
    """The crash, now that another group shows its peers blocked: they waited (or failed) on the lost ranks."""
    waiting = tuple(sorted(set(k.waiting_ranks) | set(peers)))
    text = (f"{k.explanation} In group {hang.process_group}, rank{'s' if len(hang.waiting_ranks) > 1 else ''} "
            f"{rank_list(hang.waiting_ranks)} wait in {hang.op} (sequence number {hang.collective_seq}) for "
            f"rank{'s' if len(peers) > 1 else ''} {rank_list(peers)}, which are held here: the lost "
            f"rank{'s' if len(k.culprit_ranks) > 1 else ''} {rank_list(k.culprit_ranks)} stopped both groups.")
    return replace(k, waiting_ranks=waiting, explanation=text, confidence=max(k.confidence, 0.8))
