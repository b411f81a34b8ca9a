"""Worker script for the localization tests: a real gloo job with one planted fault, dumping its recorder.

Run as ``python _localize_workers.py SCENARIO WORLD OUTDIR RANK``. Rank 0 opens a TCPStore on an
OS-chosen port and writes it to OUTDIR/port. Each rank dumps its flight recorder from a background
thread one second after reaching the faulty step (the main thread may be blocked in a collective),
to OUTDIR/fr_trace_rank_<r>.pkl, then writes OUTDIR/done_<r>. The test kills the processes.
Scenarios: skip, desync, size, die, subgroup, tpdie-<tp>-<dead> (8 ranks in tensor-parallel groups of
<tp> consecutive ranks; rank <dead> dies at its sub-group collective of step 3, leaving no dump), and with
send/recv (gloo records none of them):
pipeline (4 stages; stage 2 receives but never sends) and tp_pipeline (2 stages of 2 tensor-parallel
ranks; rank 0 skips one send). The send/recv scenarios use a 4 s process-group timeout and dump twice:
during the hang (OUTDIR) and after the timeout made gloo retire the waiting work (OUTDIR/late).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path


def _port(out: Path, rank: int, world: int) -> tuple[object, int]:
    import torch.distributed as dist

    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world, True, timeout=timedelta(seconds=60),
                                wait_for_workers=False)
        tmp = out / "port.tmp"
        tmp.write_text(str(store.port))
        tmp.rename(out / "port")
        return store, store.port
    deadline = time.monotonic() + 60
    while not (out / "port").exists():
        if time.monotonic() > deadline:
            raise SystemExit("no port file")
        time.sleep(0.05)
    port = int((out / "port").read_text())
    return dist.TCPStore("127.0.0.1", port, world, False, timeout=timedelta(seconds=60)), port


def _dump(path: Path) -> None:
    from torch._C._distributed_c10d import _dump_fr_trace

    data = _dump_fr_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.rename(path)


def _dump_when_set(out: Path, rank: int) -> threading.Event:
    """An event that, once set, makes a thread write this rank's dump a second later (the job has failed by
    then: the dump shows where every live rank waits), then its ready flag."""
    final = threading.Event()

    def dumper() -> None:
        final.wait()
        time.sleep(1.0)
        _dump(out / f"fr_trace_rank_{rank}.pkl")
        (out / f"ready_rank_{rank}.flag").write_text("ok")

    threading.Thread(target=dumper, daemon=True).start()
    return final


_P2P_TIMEOUT = 4.0
"""Process-group timeout of the send/recv scenarios: short, so the run also shows gloo after it."""


def _p2p_job(scenario: str, world: int, out: Path, rank: int) -> None:
    """A job whose ranks also send and receive: a pipeline, or pipeline stages of tensor-parallel pairs."""
    import torch
    import torch.distributed as dist

    store, _ = _port(out, rank, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=_P2P_TIMEOUT))
    tp = None
    if scenario == "tp_pipeline":  # stage 0 = ranks 0, 1; stage 1 = ranks 2, 3; tp pairs within a stage
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        tp = groups[rank // 2]
        width, stages = 2, 2
    else:
        width, stages = 1, world
    stage = rank // width
    final = threading.Event()

    def dumper() -> None:
        final.wait()
        time.sleep(1.0)
        _dump(out / f"fr_trace_rank_{rank}.pkl")
        time.sleep(_P2P_TIMEOUT + 2.0)  # every waiting op has timed out by now: gloo retired it
        (out / "late").mkdir(exist_ok=True)
        _dump(out / "late" / f"fr_trace_rank_{rank}.pkl")
        (out / f"ready_rank_{rank}.flag").write_text("ok")

    threading.Thread(target=dumper, daemon=True).start()
    t = torch.ones(4)
    steps = 5  # enough steady steps before the fault for op-id gaps to show a pattern
    try:
        for step in range(1, steps + 1):
            if step == 2:
                # A snapshot before the fault (also warms up the first, slow, dump with stack traces).
                (out / "healthy").mkdir(exist_ok=True)
                _dump(out / "healthy" / f"fr_trace_rank_{rank}.pkl")
            if step == steps:
                final.set()
            if stage > 0:
                dist.recv(t, rank - width)
            if scenario == "pipeline" and rank == 2 and step == steps:
                time.sleep(3600)  # received its input, never sends its output
            if tp is not None:
                dist.all_reduce(t, group=tp)
            if stage < stages - 1 and not (scenario == "tp_pipeline" and rank == 0 and step == steps):
                dist.send(t, rank + width)
            dist.all_reduce(t)
    except Exception as exc:  # the timeout: keep the process for the late dump
        print(f"rank {rank}: {exc.__class__.__name__}: {str(exc)[:200]}", file=sys.stderr, flush=True)
    final.set()
    time.sleep(3600)


def _tp_die_job(world: int, out: Path, rank: int, tp_size: int, dead: int) -> None:
    """Each step: an all-reduce in the tensor-parallel group, then one over every rank; ``dead`` dies at step 3."""
    import torch
    import torch.distributed as dist

    # every rank creates every group, in the same order, as torch requires
    groups = [dist.new_group(list(range(s, s + tp_size))) for s in range(0, world, tp_size)]
    mine = groups[rank // tp_size]
    final = _dump_when_set(out, rank)
    t = torch.ones(4)
    try:
        for step in range(1, 5):
            if step == 2:
                (out / "healthy").mkdir(exist_ok=True)
                _dump(out / "healthy" / f"fr_trace_rank_{rank}.pkl")
            if step == 3:
                final.set()
                if rank == dead:
                    os._exit(17)  # a device fault in the sub-group collective: the process is gone, no dump
            dist.all_reduce(t, group=mine)
            dist.all_reduce(t)
    except Exception as exc:  # the peers see gloo errors once the connection closes: dump anyway
        print(f"rank {rank}: {exc.__class__.__name__}: {str(exc)[:200]}", file=sys.stderr, flush=True)
    final.set()
    time.sleep(3600)


def main() -> None:
    scenario, world, out, rank = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    if scenario in ("pipeline", "tp_pipeline"):
        _p2p_job(scenario, world, out, rank)
        return
    import torch
    import torch.distributed as dist

    store, _ = _port(out, rank, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=20))
    mine = None
    if scenario.startswith("tpdie-"):
        _, tp_size, dead = scenario.split("-")
        _tp_die_job(world, out, rank, int(tp_size), int(dead))
        return
    if world >= 4:
        g01 = dist.new_group([0, 1])
        g23 = dist.new_group([2, 3])
        mine = g01 if rank < 2 else g23
    final = _dump_when_set(out, rank)
    t = torch.ones(4)
    steps = 4
    try:
        for step in range(1, steps + 1):
            if step == 2:
                # A healthy snapshot (also warms up the first, slow, dump with stack traces).
                (out / "healthy").mkdir(exist_ok=True)
                _dump(out / "healthy" / f"fr_trace_rank_{rank}.pkl")
            fault_step = 4 if scenario == "skip" else 3
            if step == fault_step:
                final.set()
            if scenario == "subgroup":
                if step <= 2:
                    dist.all_reduce(t)
                if step == 3 and rank == 3:
                    time.sleep(3600)  # stuck in compute: never enters the sub-group collective
                dist.all_reduce(t, group=mine)
                continue
            if scenario == "skip" and rank == 1 and step == 2:
                continue  # skips one all_reduce, carries on
            if step == 3 and rank == 1:
                if scenario == "desync":
                    dist.broadcast(t, src=0)
                    continue
                if scenario == "size":
                    dist.all_reduce(torch.ones(400))
                    continue
                if scenario == "die":
                    os._exit(17)
            dist.all_reduce(t)
    except Exception as exc:  # the peers of a fault see gloo errors: dump anyway
        print(f"rank {rank}: {exc.__class__.__name__}: {str(exc)[:200]}", file=sys.stderr, flush=True)
    final.set()
    time.sleep(3600)


if __name__ == "__main__":
    main()
