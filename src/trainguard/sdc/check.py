"""Silent data corruption, the torch side: every K steps the data-parallel replicas all-gather a fingerprint of
their parameters on a gloo group of their own; on a mismatch the ranks leave a marker for the agent and wait to
be stopped. Also the ``sdc`` chaos fault (one flipped bit). The pure logic is `trainguard.sdc.verdict`.

The parameters are those of the lead optimizer (the first one whose ``step()`` completes), found through
torch's global optimizer step hook, so a script needs no change. Nothing here may stop or slow training
except a confirmed detection under an agent: every failure is logged once and turns the check off.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from typing import Any

from trainguard.core.safefs import create_exclusive
from trainguard.sdc import verdict as sdc

log = logging.getLogger(__name__)

WAIT_FOR_AGENT_SECONDS = 120.0
"""How long ranks that found corruption wait for their agent to stop them before exiting on their own."""
EXIT_SDC = 86
"""Exit code of a rank that found corruption and was not stopped by its agent in time."""


def _word_view(t: Any) -> Any:
    """The tensor's bytes as integers, so the checksum sees every bit (float sums would round bits away)."""
    import torch

    size = t.element_size()
    flat = t.reshape(-1)
    if size % 4 == 0:
        return flat.view(torch.int32)
    if size == 2:
        return flat.view(torch.int16)
    return flat.view(torch.uint8)


def parameter_tensors(optimizer: Any) -> list[Any]:
    """The optimizer's parameters in a fixed order (param groups, then position), without duplicates."""
    seen: set[int] = set()
    out = []
    for group in getattr(optimizer, "param_groups", ()):
        for p in group.get("params", ()):
            if id(p) not in seen and getattr(p, "numel", None) is not None:
                seen.add(id(p))
                out.append(p)
    return out


def fingerprint(params: list[Any]) -> tuple[int, int]:
    """(structure, value) fingerprints of the parameters' exact bytes.

    Per parameter: the sum of its 32-bit (16-, 8-bit for smaller dtypes) words in int64, computed where the
    parameter lives; one transfer brings all sums to the CPU. Any single flipped bit changes that sum by a
    power of two, hence the combined value.
    """
    import torch

    sums = []
    shapes = []
    with torch.no_grad():
        for p in params:
            t = p.detach()
            if t.numel() == 0:
                continue
            if not t.is_contiguous():
                t = t.contiguous()
            sums.append(_word_view(t).sum(dtype=torch.int64))
            shapes.append((int(t.numel()), str(t.dtype)))
        values = torch.stack(sums).cpu().tolist() if sums else []
    return sdc.structure_fingerprint(shapes), sdc.combine(int(v) for v in values)


_EXPONENT_LOW_BIT = {"torch.float32": (0, 23), "torch.float64": (1, 20), "torch.float16": (0, 10),
                     "torch.bfloat16": (0, 7)}
"""dtype -> (word within the element, bit within the word) of the lowest exponent bit."""


def flip_bit(params: list[Any]) -> str:
    """Flip one bit of one parameter in place (chaos ``sdc``): the lowest exponent bit of the largest-magnitude
    element of the largest floating parameter, which doubles or halves it: a change training feels (a low
    mantissa bit of a tiny value can vanish in rounding) without the overflow a high exponent bit causes."""
    import torch

    candidates = [(p.numel(), -i, i, p) for i, p in enumerate(params)
                  if p.numel() > 0 and p.is_floating_point() and p.data.is_contiguous()
                  and str(p.dtype) in _EXPONENT_LOW_BIT]
    if not candidates:
        raise RuntimeError("no floating-point parameter to corrupt")
    _, _, index, p = max(candidates, key=lambda c: (c[0], c[1]))
    word_in_element, bit = _EXPONENT_LOW_BIT[str(p.dtype)]
    with torch.no_grad():
        flat = p.data.reshape(-1)  # a view: the flip lands in the parameter's own storage
        element = int(flat.abs().argmax())
        words = _word_view(p.data)
        per_element = max(1, p.element_size() // words.element_size())
        before = float(flat[element])
        words[element * per_element + word_in_element] ^= 1 << bit
        after = float(flat[element])
    return f"parameter {index} element {element} bit {bit}: {before!r} -> {after!r}"


class SdcChecker:
    """The check of one worker process. ``every`` = 0: only tracks the optimizer (for chaos)."""

    def __init__(self, rt: Any, every: int) -> None:
        self.rt = rt
        self.every = every
        self.off = every <= 0
        self._lead: weakref.ref[Any] | None = None
        self._group: Any = None
        self._group_tried = False
        self._last_clean_step: int | None = None
        self._last_clean_time = time.time()
        self._stopped = False
        self.checks = 0
        """Checks run so far (tests and benchmarks read it)."""

    # --- the lead optimizer ------------------------------------------------------------------------

    def track(self, optimizer: Any) -> None:
        lead = self._lead() if self._lead is not None else None
        if lead is None:
            self._lead = weakref.ref(optimizer)

    def post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self.track(optimizer)
        except Exception as exc:  # never in the way of the optimizer
            log.warning("trainguard: SDC optimizer tracking failed (%s)", exc)

    def params(self) -> list[Any]:
        lead = self._lead() if self._lead is not None else None
        return parameter_tensors(lead) if lead is not None else []

    def ready(self) -> bool:
        """Whether chaos ``sdc`` can fire: an optimizer has stepped, so its parameters are known."""
        return bool(self.params())

    def corrupt(self) -> str:
        """Chaos ``sdc``: flip one bit of this rank's parameters now; says which."""
        return flip_bit(self.params())

    # --- the check --------------------------------------------------------------------------------

    def _setup(self, first_step: int) -> None:
        """At the first step end of the attempt, which every rank reaches: the group and the clean baseline."""
        self._group_tried = True
        # The state this attempt started from is what the replicas shared then (broadcast at DDP's
        # construction or loaded from one checkpoint): the baseline a first failed check rolls back to.
        self._last_clean_step = max(0, first_step - 1)
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            self.off = True
            return
        from datetime import timedelta

        timeout = self.rt.env.pg_timeout_seconds or 1800.0
        # A gloo group of its own: the check never interleaves with the script's collectives on the
        # default group (NCCL on GPUs), and every rank creates it here, at the same point.
        self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=max(timeout, 1.0)))

    def on_step(self, step: int, optimizer: Any = None) -> None:
        """After step ``step``'s optimizer update, on every rank. Never raises."""
        if self.off or self._stopped:
            return
        try:
            if optimizer is not None:
                self.track(optimizer)
            if not self._group_tried:
                self._setup(step)
                if self.off:
                    return
            if step % self.every == 0:
                self._check(step)
        except Exception as exc:
            self.off = True
            log.warning("trainguard: SDC check failed (%s); it is off for this process", exc)

    def _check(self, step: int) -> None:
        import torch
        import torch.distributed as dist

        params = self.params()
        if not params:
            return
        if any(type(p).__name__ == "DTensor" or type(getattr(p, "data", None)).__name__ == "DTensor"
               for p in params):
            self.off = True
            log.warning("trainguard: SDC check off: sharded (DTensor) parameters are not replicas")
            return
        structure, value = fingerprint(params)
        mine = torch.tensor([sdc.to_signed(structure), sdc.to_signed(value)], dtype=torch.int64)
        world = dist.get_world_size(self._group)
        gathered = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine, group=self._group)
        self.checks += 1
        rows = [[int(x) & sdc.MASK64 for x in t.tolist()] for t in gathered]
        ranks = list(range(world))  # the group spans the whole world: group rank == global rank
        verdict = sdc.judge(ranks, [r[1] for r in rows], [r[0] for r in rows])
        now = time.time()
        if verdict.clean:
            self._last_clean_step, self._last_clean_time = step, now
            return
        if not verdict.comparable:
            self.off = True
            log.warning("trainguard: SDC check off: %s", verdict.explanation)
            return
        self._detected(step, now, ranks, [r[1] for r in rows], verdict)

    def _detected(self, step: int, now: float, ranks: list[int], values: list[int], verdict: sdc.SdcVerdict) -> None:
        rt = self.rt
        last_clean = self._last_clean_step if self._last_clean_step is not None else 0
        log.warning("trainguard: silent data corruption found after step %d: %s (last clean: step %d)",
                    step, verdict.explanation, last_clean)
        if rt.env.agent_pid is None or rt.env.run_dir is None:
            # Nobody can roll back: say it, keep training (the check keeps reporting).
            return
        marker = sdc.SdcMarker(attempt=rt.attempt, step=step, last_clean_step=last_clean,
                               last_clean_time=self._last_clean_time, time=now, ranks=tuple(ranks),
                               fingerprints=tuple(f"{v:016x}" for v in values),
                               culprit_ranks=verdict.culprits, majority=verdict.majority,
                               explanation=verdict.explanation, source=rt.source)
        # Every rank computed the same verdict; the first to create the file wins (per node when run
        # directories are not shared).
        create_exclusive(sdc.marker_path(rt.env.run_dir, rt.attempt), marker.encode())
        self._stopped = True
        rt.set_phase("sdc")
        # Training must not go on from corrupted parameters (a checkpoint saved now would carry them):
        # wait here for the agent, which stops every rank and restarts from a clean checkpoint.
        deadline = time.monotonic() + WAIT_FOR_AGENT_SECONDS
        while time.monotonic() < deadline:
            time.sleep(0.2)
        log.warning("trainguard: the agent did not stop this rank after the SDC detection; exiting")
        os._exit(EXIT_SDC)


_handle: Any = None


def install(rt: Any) -> SdcChecker | None:
    """The process's checker (once), when the agent asked for checks or the chaos schedule has ``sdc``."""
    checker: SdcChecker | None = getattr(rt, "sdc", None)
    if checker is not None:
        return checker
    every = sdc.env_check_every(os.environ)
    wants_chaos = rt.injector is not None and any(f.kind == "sdc" for f in rt.injector.faults)
    if every <= 0 and not wants_chaos:
        return None
    global _handle
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except ImportError:
        log.warning("trainguard: this torch has no global optimizer hooks; no SDC check")
        return None
    checker = SdcChecker(rt, every)
    _handle = register_optimizer_step_post_hook(checker.post_hook)
    rt.sdc = checker
    if rt.injector is not None:
        rt.injector.sdc_target = checker
    return checker


def uninstall() -> None:
    """Remove the tracking hook (tests)."""
    global _handle
    if _handle is not None:
        _handle.remove()
        _handle = None
