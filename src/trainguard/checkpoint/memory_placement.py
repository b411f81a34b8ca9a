"""Where the memory tier puts a node's replicas: ``ring`` (the next node) or ``clique:K`` (the rest of its clique).

Pure (no torch). Nodes are ordered by node id (plain string order, the order every rank sees after the
holders' addresses are gathered); a replica never goes to the node that holds the copy itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

RING = "ring"
CLIQUE = "clique"


@dataclass(frozen=True)
class Placement:
    """A parsed placement (`parse_placement`)."""

    kind: str
    """``ring`` or ``clique``."""
    size: int = 0
    """Nodes per clique (``clique`` only, >= 2)."""

    def __str__(self) -> str:
        return RING if self.kind == RING else f"{CLIQUE}:{self.size}"

    def replicas_per_copy(self, nodes: int) -> int:
        """How many other nodes hold a replica of each copy in a job of ``nodes`` nodes (the most, for cliques)."""
        if nodes < 2:
            return 0
        if self.kind == RING:
            return 1
        return max(len(c) for c in cliques(nodes, self.size)) - 1


def parse_placement(text: str) -> Placement:
    """``ring`` or ``clique:K`` (K an integer >= 2); ``ValueError`` saying what is accepted otherwise."""
    value = text.strip().lower() if isinstance(text, str) else ""
    if value == RING:
        return Placement(RING)
    kind, sep, size = value.partition(":")
    if kind == CLIQUE and sep and size.isdigit() and int(size) >= 2:
        return Placement(CLIQUE, int(size))
    raise ValueError(f"memory checkpoint placement must be 'ring' or 'clique:K' with an integer K >= 2, got {text!r}")


def cliques(count: int, size: int) -> list[range]:
    """Indices ``0..count-1`` cut into runs of ``size``; a last run of one joins the run before it (a clique of
    one node would hold no replica)."""
    runs = [range(start, min(start + size, count)) for start in range(0, count, size)]
    if len(runs) > 1 and len(runs[-1]) == 1:
        runs[-2:] = [range(runs[-2].start, count)]
    return runs


def replica_nodes(nodes: Sequence[str], node: str, placement: Placement) -> list[str]:
    """The nodes that get a replica of ``node``'s copies, in node order; none with one node."""
    ordered = sorted(set(nodes))
    if node not in ordered:
        raise ValueError(f"node {node!r} is not one of the job's nodes")
    if len(ordered) < 2:
        return []
    index = ordered.index(node)
    if placement.kind == RING:
        return [ordered[(index + 1) % len(ordered)]]
    clique = next(c for c in cliques(len(ordered), placement.size) if index in c)
    return [ordered[i] for i in clique if i != index]
