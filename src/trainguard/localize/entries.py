"""Raw flight-recorder entries as the matcher reads them: op name, compared signature, finished or not,
and the evidence record (`EntryView`) an entry becomes."""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

from trainguard.localize.model import EntryView

log = logging.getLogger(__name__)

MAX_FRAMES = 12
"""Stack frames kept per evidence record."""
# Ops whose sizes legitimately differ between ranks (uneven splits, root-only buffers).
_RANK_DEPENDENT_SIZES = frozenset(
    {"all_to_all", "alltoall", "alltoall_base", "all_to_all_single", "gather", "scatter",
     "allgather_v", "reduce_scatter_v", "all_gather_into_tensor_coalesced", "coalesced"}
)


def compared_dtypes(e: dict[str, Any], rank_dependent: bool) -> tuple[Any, Any]:
    """The dtypes that must agree across ranks. Rooted ops (gather, scatter) fill only the root's output
    (or input) side, so for them only the set of dtypes a rank used is compared, not each side."""
    ins, outs = e.get("input_dtypes"), e.get("output_dtypes")
    if not rank_dependent:
        return ins, outs
    return tuple(sorted({str(d) for d in [*(ins or ()), *(outs or ())]})), None


_P2P_NAME = re.compile(r"^(send|recv)\b")
_SEND = re.compile(r"send\s+(\d+)\s*->\s*(\d+)")
_RECV = re.compile(r"recv\s+(\d+)\s*<-\s*(\d+)")


def as_int(value: Any, default: int = -1) -> int:
    return value if isinstance(value, int) else default


def op_name(profiling_name: str) -> str:
    """'gloo:all_reduce' -> 'all_reduce'; 'nccl:send 0->1' -> 'send'."""
    name = profiling_name.split(":", 1)[1] if ":" in profiling_name else profiling_name
    return name.split(" ", 1)[0]


def name_info(profiling_name: str) -> tuple[str, bool, bool, bool]:
    """(op, sizes differ by rank legitimately, gloo, point-to-point by name) for one profiling name."""
    op = op_name(profiling_name)
    return (op, op in _RANK_DEPENDENT_SIZES, profiling_name.startswith("gloo:"), bool(_P2P_NAME.match(op)))


def _text(v: Any) -> str:
    # entries are type-checked before they become evidence; this only keeps a miss harmless
    if isinstance(v, str):
        return v[:300]
    return str(v) if isinstance(v, int) and -(10**18) < v < 10**18 else "?"


def entry_frames(raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, (list, tuple)):
        return ()
    out = []
    for f in raw[:MAX_FRAMES]:
        if isinstance(f, dict):
            # interned: thousands of ranks share the same frames
            out.append(sys.intern(f"{_text(f.get('name', '?'))} ({_text(f.get('filename', '?'))}:"
                                  f"{_text(f.get('line', '?'))})"))
    return tuple(out)


def make_view(rank: int, e: dict[str, Any], seq: int, is_p2p: bool, done: bool, gloo: bool,
              members: tuple[int, ...] | None, like: dict[str, Any] | None = None,
              frames: tuple[str, ...] | None = None) -> EntryView:
    """The evidence record of one raw entry.

    ``like``: an entry of another rank equal to ``e`` in name, sizes, dtypes, state and retired, whose
    objects are shared instead of keeping ``e``'s; ``frames``: ``e``'s frames, already formatted.
    """
    s = e if like is None else like
    prof = str(s.get("profiling_name", ""))
    peer = None
    if is_p2p:
        m = _SEND.search(prof) or _RECV.search(prof)
        if m:
            local = int(m.group(2))
            peer = members[local] if members and local < len(members) else local
    after = e.get("collective_seq_id") if is_p2p else None
    started = e.get("time_discovered_started_ns")
    state = str(s.get("state", ""))
    if not gloo and state == "scheduled" and started:
        state = "started"
    return EntryView(
        rank=rank,
        record_id=as_int(e.get("record_id")),
        seq=seq,
        op=op_name(prof),
        profiling_name=prof,
        is_p2p=is_p2p,
        state=state,
        completed=done,
        input_sizes=s.get("input_sizes"),
        output_sizes=s.get("output_sizes"),
        input_dtypes=s.get("input_dtypes"),
        output_dtypes=s.get("output_dtypes"),
        peer=peer,
        frames=entry_frames(e.get("frames")) if frames is None else frames,
        time_created_ns=e.get("time_created_ns"),
        retired=bool(s.get("retired")),
        after_seq=after if after.__class__ is int else None,
    )


def finished(e: dict[str, Any], gloo: bool) -> bool:
    """Whether an entry's collective is over. gloo's recorder never marks an entry completed, only
    retired (its work object freed); NCCL's says ``completed`` once the GPU finished it."""
    return e.get("retired") is True if gloo else e.get("state") == "completed"


def gloo_and_finished(e: dict[str, Any]) -> tuple[bool, bool]:
    """(gloo, finished) for one raw entry."""
    gloo = str(e.get("profiling_name") or "").startswith("gloo:")
    return gloo, finished(e, gloo)
