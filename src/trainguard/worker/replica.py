"""Live healing for data-parallel replicas: after an in-process restart the survivors keep their state (no
rollback to a checkpoint) and the new ranks receive it from a live peer over the re-formed process group.

Under ``trainguard run --in-process`` a survivor re-enters the `trainguard.restartable` function in the same
interpreter. `Replica.keep` hands it back the model and optimizer it built the first time, `Replica.completed`
marks the last step whose update they hold, and `Replica.heal` (collective, after the group is formed) sends
the newest live state from the lowest rank that holds it to every other rank. Only where no rank holds a live
state (the job's start, a whole-process restart) does the script restore from its checkpoint.

The state crosses the wire as a JSON layout and raw tensors (never pickle): a peer's bytes become tensors and
plain values, not code. See docs/run.md ("Live healing").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

_TENSOR = "__tensor__"
"""The layout's marker for a tensor leaf: its index in the order the tensors are broadcast."""


@dataclass(frozen=True)
class Healed:
    """What `Replica.heal` did on this rank."""

    step: int
    """The step every rank now continues after (the newest live step of any rank)."""
    source: int
    """The rank whose state was sent."""
    received: bool
    """Whether this rank took the state from the source (a new rank, or a survivor behind it)."""
    tensor_bytes: int
    """Bytes of tensor data broadcast."""


class Replica(Generic[T]):
    """The live state of one data-parallel replica across in-process restarts (one per process)."""

    def __init__(self, keep_training: bool = True) -> None:
        self.keep_training = keep_training
        """After a failure, the survivors train on in a group of their own until the failed ranks' new processes
        arrive (torchft's behaviour: the job never stops, its batch shrinks for those steps). False: they wait
        for the whole group, and the job's trajectory is the fault-free one."""
        self._kept: T | None = None
        self._built = False
        self.step: int | None = None
        """The last step whose optimizer update this process's state holds (None: none since it started)."""
        self.last: Healed | None = None
        """What the last `heal` did (None before one that healed)."""

    def keep(self, build: Callable[[], T]) -> T:
        """``build()`` the first time this process calls it, the same objects on every later call: a survivor
        of an in-process restart goes on with the model and optimizer it trained."""
        if not self._built:
            self._kept = build()
            self._built = True
        return self._kept  # type: ignore[return-value]  # set on the first call

    def completed(self, step: int) -> None:
        """The optimizer update of ``step`` is applied. Call right after ``optimizer.step()``, with no collective
        between them: a failure then leaves every survivor at a step it finished. While the survivors train on
        without failed ranks, this is where they leave for the whole group (the wrapper's `RegroupNow`): call it
        at the end of the step, outside ``with worker.step(...)``."""
        from trainguard.worker.inprocess import note_replica_step

        self.step = step
        note_replica_step(self.keep_training)

    def heal(self, state: dict[str, Any], group: Any = None) -> int | None:
        """Collective: agree on the newest live step of any rank and give every rank that state.

        ``state`` is the caller's state dict (e.g. ``torch.distributed.checkpoint.state_dict.get_state_dict``'s
        model and optimizer dicts, as for `trainguard.Checkpointer.restore`): on the ranks that receive, its
        entries are replaced by the source's, to be applied as after a restore. Returns the step to continue
        after, or None when no rank holds a live state (restore from the checkpoint then).
        """
        import torch
        import torch.distributed as dist

        rank, world = dist.get_rank(group), dist.get_world_size(group)
        device = wire_device(group)
        steps = torch.full((world,), -1, dtype=torch.int64, device=device)
        steps[rank] = -1 if self.step is None else self.step
        dist.all_reduce(steps, op=dist.ReduceOp.MAX, group=group)  # each slot is -1 except its own rank's
        best = int(steps.max())
        if best < 0:
            return None
        if bool((steps == best).all()):
            self.last = Healed(best, rank, False, 0)
        else:
            source = int((steps == best).nonzero()[0])
            received = rank != source
            sent = _broadcast_state(state, source, received, group, device)
            self.step = best
            self.last = Healed(best, source, received, sent)
            log.info("trainguard: rank %d healed to step %d from rank %d (%d tensor bytes)", rank, best, source,
                     sent)
        _say_step(best)
        return best


def _say_step(step: int) -> None:
    """This rank's heartbeat carries the step its state holds (a healed rank may train no step of its own)."""
    from trainguard.worker import runtime

    rt = runtime.current()
    if rt is not None:
        rt.resume_at(step)


def wire_device(group: Any) -> Any:
    """Where the group's collectives take their tensors: the current CUDA device for NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _broadcast_state(state: dict[str, Any], source: int, receive: bool, group: Any, device: Any) -> int:
    """Send ``state`` from ``source`` (a rank of ``group``) to every rank: its layout as JSON, then each tensor,
    through ``device`` (a tensor elsewhere is copied there and back). Receivers' ``state`` entries are replaced.
    Returns the tensor bytes sent."""
    import torch
    import torch.distributed as dist

    src = source if group is None else dist.get_global_rank(group, source)
    tensors: list[Any] = []
    layout = b"" if receive else json.dumps(_layout(state, tensors)).encode()
    size = torch.tensor([len(layout)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src, group=group)
    raw = torch.frombuffer(bytearray(layout), dtype=torch.uint8).to(device) if not receive \
        else torch.empty(int(size), dtype=torch.uint8, device=device)
    dist.broadcast(raw, src=src, group=group)
    if receive:
        spec = json.loads(bytes(raw.cpu().numpy()).decode())
        rebuilt = _rebuild(spec, tensors)
        state.clear()
        state.update(rebuilt)
    total = 0
    for t in tensors:
        wire = t if t.device == device else t.to(device)
        dist.broadcast(wire, src=src, group=group)
        if receive and wire is not t:
            t.copy_(wire)
        total += t.numel() * t.element_size()
    return total


def _layout(value: Any, tensors: list[Any]) -> Any:
    """``value`` as JSON, each tensor replaced by its index, dtype and shape (and appended to ``tensors``)."""
    import torch

    if isinstance(value, torch.Tensor):
        tensors.append(value.detach().contiguous())
        return {_TENSOR: len(tensors) - 1, "dtype": str(value.dtype).removeprefix("torch."),
                "shape": list(value.shape)}
    if isinstance(value, dict):
        if not all(isinstance(k, str | int) for k in value):
            raise TypeError("Replica.heal: state keys must be strings or integers")
        # JSON keys are strings: integer keys (an optimizer's state by parameter index) are tagged to come back.
        return {"dict": [[k, _layout(v, tensors)] for k, v in value.items()]}
    if isinstance(value, list | tuple):
        return {"list" if isinstance(value, list) else "tuple": [_layout(v, tensors) for v in value]}
    if value is None or isinstance(value, bool | int | float | str):
        return {"value": value}
    raise TypeError(f"Replica.heal: cannot send a {type(value).__name__} (tensors, numbers, strings, "
                    "lists and dicts only)")


def _rebuild(spec: Any, tensors: list[Any]) -> Any:
    """The value `_layout` described, with empty tensors (appended to ``tensors``) to receive into."""
    import torch

    if not isinstance(spec, dict) or len(spec) == 0:
        raise ValueError("Replica.heal: malformed state layout from the source rank")
    if _TENSOR in spec:
        dtype = getattr(torch, str(spec["dtype"]), None)
        if not isinstance(dtype, torch.dtype) or int(spec[_TENSOR]) != len(tensors):
            raise ValueError("Replica.heal: malformed tensor in the source rank's state layout")
        t = torch.empty([int(d) for d in spec["shape"]], dtype=dtype)
        tensors.append(t)
        return t
    (kind, body), = spec.items()
    if kind == "dict":
        return {k: _rebuild(v, tensors) for k, v in body}
    if kind == "list":
        return [_rebuild(v, tensors) for v in body]
    if kind == "tuple":
        return tuple(_rebuild(v, tensors) for v in body)
    if kind == "value":
        return body
    raise ValueError(f"Replica.heal: unknown entry {kind!r} in the source rank's state layout")
