"""c10d's private parts: the flight recorder's dump functions and aborting a process group's communicators.

The dumps live in ``torch._C._distributed_c10d``: ``_dump_fr_trace``/``_dump_fr_trace_json`` read the generic
recorder (gloo's), ``_dump_nccl_trace``/``_dump_nccl_trace_json`` NCCL's own (CUDA builds only, 2.11-2.14).
From 2.15 the generic functions take ``backend=`` and read that backend's recorder (its NCCL backend records
there), so a backend-aware generic function is preferred when there is one. The abort is
``distributed_c10d._abort_process_group``; where torch offers no abort, a plain destroy is used.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_GENERIC = {"pickle": "_dump_fr_trace", "json": "_dump_fr_trace_json"}
_NCCL = {"pickle": "_dump_nccl_trace", "json": "_dump_nccl_trace_json"}


def _c10d_module() -> Any:
    import torch._C._distributed_c10d as c10d

    return c10d


def takes_backend(fn: Callable[..., Any]) -> bool:
    """Whether a dump function reads per-backend recorders (its pybind signature names ``backend``)."""
    return "backend" in (getattr(fn, "__doc__", None) or "").split("->")[0]


def dump_function(fmt: str, backend: str | None) -> tuple[Callable[..., Any] | None, dict[str, Any]]:
    """torch's dump function for ``fmt`` (``pickle`` or ``json``) and the extra arguments it needs: the
    backend-aware generic one (2.15+), else NCCL's own recorder for the NCCL backend when the build has it,
    else the generic one; ``(None, {})`` when this torch has none."""
    try:
        c10d = _c10d_module()
    except ImportError:
        return None, {}
    if backend is not None and "nccl" in backend:  # "nccl", or a device map such as "cpu:gloo,cuda:nccl"
        backend = "nccl"
    generic = getattr(c10d, _GENERIC[fmt], None)
    if generic is not None and backend is not None and takes_backend(generic):
        return generic, {"backend": backend}
    if backend == "nccl":
        fn = getattr(c10d, _NCCL[fmt], None)
        if fn is not None:
            return fn, {}
    return generic, {}


def dump_flight_recorder(fmt: str = "pickle", *, backend: str | None = None, collectives: bool = True,
                         stack_traces: bool = True, only_active: bool = False) -> bytes | None:
    """The flight recorder's buffer as torch writes it (``pickle`` or ``json``), or None when this torch has no
    dump function. Exceptions from torch itself propagate: the caller knows whether a failure is worth a
    warning. JSON never carries stack frames (torch's rule), so ``stack_traces`` applies to pickles only."""
    fn, extra = dump_function(fmt, backend)
    if fn is None:
        return None
    if fmt == "json":
        return bytes(fn(includeCollectives=collectives, onlyActive=only_active, **extra))
    return bytes(fn(includeCollectives=collectives, includeStackTraces=stack_traces, onlyActive=only_active,
                    **extra))


def abort_process_group() -> str:
    """Abort the default process group's communicators (pending NCCL work would block a plain destroy).

    Returns how it was done: ``abort`` (torch's abort) or ``destroy`` (this torch has no abort)."""
    import torch.distributed as dist

    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is not None:
        abort()
        return "abort"
    # torch's own, past any wrapper trainguard's hooks put on the script's name for it
    getattr(dist.destroy_process_group, "__wrapped__", dist.destroy_process_group)()
    return "destroy"


def has_abort() -> bool:
    """Whether this torch can abort communicators (in-process restart on NCCL relies on it)."""
    import torch.distributed as dist

    return getattr(dist.distributed_c10d, "_abort_process_group", None) is not None


PREWARM_MODULES = ("torch._inductor.config",)
"""torch's modules whose first import the first stack-trace dump pays (about 2 s on 2 cores): warm spares
import them ahead. Missing ones are skipped."""
