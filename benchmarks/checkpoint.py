"""Checkpoint benchmark: trainguard's saves and restores against plain DCP and the raw disk, in one run.

Starts ``--ranks`` gloo processes holding ``--mb`` MB of state in total (sharded: every rank owns its
slice). Each repeat measures, in a rotating order: raw parallel write + fdatasync of the same bytes;
plain ``dcp.save``; trainguard sync save (checksums, manifest, commit); plain ``dcp.async_save`` on its
own gloo group (stall and total) and trainguard's async save (stall and total). Then, per repeat, with
the files evicted from the page cache before each (posix_fadvise DONTNEED, no root needed): raw read,
plain ``dcp.load`` of trainguard's checkpoint, the former two-read restore (checksum, then
``dcp.load``) and trainguard's restore (one read, verified while it loads) twice: with an older
checkpoint to fall back on (``restore``: it loads in place) and as a job's first checkpoint
(``restore_first``: staged, then written back). Every figure is the
slowest rank's time; goals are judged on the median of per-repeat paired ratios (measurements of one
repeat run back to back). Prints one JSON object.
Example: ``python benchmarks/checkpoint.py --mb 256 --ranks 2 --repeats 3``.

``--memory`` measures the memory tier instead, every rank a node of its own (its own holder, the other
rank's node as its peer): the stall of a memory-tier save against plain ``dcp.async_save``'s, a restore
from the node's own memory and one from the peer's replica (own copies removed first) against a cold
plain ``dcp.load`` of the same state from disk, and the bytes each restore read from storage. Beside
them, the physical bounds of this machine: one ``copy_`` of the rank's bytes between two tensors
(``memcpy``; ``ceiling_ratio = dcp_load / memcpy`` is the most any restore that copies the bytes once
could gain over ``dcp.load`` here) and one transfer of them over loopback TCP, every rank at once
(``tcp_loopback``; the bound of a peer restore, ``peer_ceiling_ratio``). ``restore_phases_median``
splits each memory restore into its parts (`MemoryRestore.phases`).
Example: ``python benchmarks/checkpoint.py --memory --mb 512 --ranks 2 --repeats 3`` (256 MB per rank).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' shared helpers
from page_cache import evict as evict_files

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 8 << 20
SAVES = ("raw_write", "dcp_save", "sync_save", "dcp_async_stall", "dcp_async_total", "async_stall", "async_total")
LOADS = ("raw_read", "dcp_load", "verify_then_load", "restore", "restore_first")


def _files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()]


class Bench:
    """One rank's view: its shard, a timing group, and helpers that time the slowest rank."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import torch.distributed as dist

        self.dist = dist
        self.rank, self.world = args.rank, args.ranks
        self.base = Path(args.dir)
        share = int(args.mb * 1e6) // self.world
        gen = torch.Generator().manual_seed(self.rank)
        self.shards = {f"w{i}": torch.rand(share // args.tensors // 4, generator=gen) for i in range(args.tensors)}
        self.mb = sum(t.numel() * 4 for t in self.shards.values()) * self.world / 1e6
        self.timing_pg = dist.new_group(backend="gloo")
        self.raw = self.base / f"raw-{self.rank}.bin"
        self.payload = memoryview(torch.cat([t.view(torch.uint8) for t in self.shards.values()]).numpy())

    def slowest(self, seconds: float) -> float:
        import torch

        box = torch.tensor([seconds], dtype=torch.float64)
        self.dist.all_reduce(box, op=self.dist.ReduceOp.MAX, group=self.timing_pg)
        return float(box)

    def settle(self, evict: bool = False) -> None:
        """Start a measurement with no dirty pages pending (and, for reads, nothing cached); align ranks."""
        if self.rank == 0:
            os.sync()
            if evict:
                evict_files(_files(self.base))
        self.dist.barrier(group=self.timing_pg)

    def timed(self, fn: Callable[[], Any], evict: bool = False) -> float:
        self.settle(evict)
        start = time.perf_counter()
        fn()
        return self.slowest(time.perf_counter() - start)

    def raw_write(self) -> None:
        fd = os.open(self.raw, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for off in range(0, self.payload.nbytes, CHUNK):
                os.write(fd, self.payload[off : off + CHUNK])
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def raw_read(self) -> None:
        with self.raw.open("rb", buffering=0) as fh:
            buf = bytearray(CHUNK)
            while fh.readinto(buf):
                pass


def _async_pair(b: Bench, runs: dict[str, list[float]], save: Callable[[], Any], wait: Callable[[Any], None],
                prefix: str) -> None:
    """Stall (until ``save`` returns) and total (until the checkpoint is durable) of one async save."""
    b.settle()
    start = time.perf_counter()
    handle = save()
    stalled = time.perf_counter() - start
    wait(handle)
    runs[f"{prefix}_total"].append(b.slowest(time.perf_counter() - start))
    runs[f"{prefix}_stall"].append(b.slowest(stalled))


def _save_jobs(b: Bench, runs: dict[str, list[float]], rep: int, ckpts: dict[str, Any], async_pg: Any) -> list[Any]:
    import torch.distributed.checkpoint as dcp

    state = {"rank_local": b.shards}
    plain = {"__rank_local__": {str(b.rank): b.shards}}  # the same layout trainguard writes
    return [
        lambda: runs["raw_write"].append(b.timed(b.raw_write)),
        lambda: runs["dcp_save"].append(b.timed(lambda: dcp.save(plain, checkpoint_id=b.base / f"plain-{rep}"))),
        lambda: runs["sync_save"].append(b.timed(lambda: ckpts["sync"].save(rep, state))),
        lambda: _async_pair(
            b, runs, lambda: dcp.async_save(plain, checkpoint_id=b.base / f"plain-async-{rep}", process_group=async_pg),
            lambda fut: fut.result(), "dcp_async",
        ),
        lambda: _async_pair(b, runs, lambda: ckpts["async"].save(rep, state), lambda _: ckpts["async"].wait(), "async"),
    ]


def _load_jobs(b: Bench, runs: dict[str, list[float]], ckpt: Any, first: Any, last: Path) -> list[Any]:
    import torch
    import torch.distributed.checkpoint as dcp

    from trainguard.checkpoint.manifest import read_manifest, verify_files

    target = {"rank_local": {k: torch.empty_like(v) for k, v in b.shards.items()}}
    target_first = {"rank_local": {k: torch.empty_like(v) for k, v in b.shards.items()}}
    plain = {"__rank_local__": {str(b.rank): {k: torch.empty_like(v) for k, v in b.shards.items()}}}

    def verify_then_load() -> None:
        """The two-read restore trainguard used before: checksum this rank's share of the files, then load."""
        manifest = read_manifest(last)
        verify_files(last, manifest, sorted(manifest.files)[b.rank :: b.world])
        dcp.load(plain, checkpoint_id=last)

    def check(loaded: dict[str, Any], what: str) -> None:
        """Outside the timed part (for every method alike): the loaded tensors are the saved ones."""
        if not all(torch.equal(loaded[k], v) for k, v in b.shards.items()):
            raise SystemExit(f"{what} returned other data")

    def restore(checkpointer: Any, into: dict[str, Any]) -> None:
        if checkpointer.restore(into) is None:
            raise SystemExit("restore found no checkpoint")

    def timed_load(name: str, fn: Callable[[], Any], loaded: dict[str, Any]) -> None:
        runs[name].append(b.timed(fn, evict=True))
        check(loaded, name)

    own = plain["__rank_local__"][str(b.rank)]
    return [
        lambda: runs["raw_read"].append(b.timed(b.raw_read, evict=True)),
        lambda: timed_load("dcp_load", lambda: dcp.load(plain, checkpoint_id=last), own),
        lambda: timed_load("verify_then_load", verify_then_load, own),
        lambda: timed_load("restore", lambda: restore(ckpt, target), target["rank_local"]),
        lambda: timed_load("restore_first", lambda: restore(first, target_first), target_first["rank_local"]),
    ]


def _paired(runs: dict[str, list[float]], num: str, den: str) -> float:
    """Median over repeats of ``num/den`` (times) measured back to back."""
    return round(statistics.median(a / b for a, b in zip(runs[num], runs[den], strict=True)), 4)


def summarize(runs: dict[str, list[float]], mb: float, ranks: int, checksum: str) -> dict[str, Any]:
    best = {k: min(v) for k, v in runs.items()}
    out: dict[str, Any] = {"mb": round(mb, 1), "ranks": ranks, "checksum": checksum}
    out["mb_per_second"] = {
        "disk_write": round(mb / best["raw_write"], 1),
        "dcp_save": round(mb / best["dcp_save"], 1),
        "save": round(mb / best["sync_save"], 1),
        "dcp_async_total": round(mb / best["dcp_async_total"], 1),
        "async_total": round(mb / best["async_total"], 1),
        "disk_read_cold": round(mb / best["raw_read"], 1),
        "dcp_load_cold": round(mb / best["dcp_load"], 1),
        "verify_then_load_cold": round(mb / best["verify_then_load"], 1),
        "restore_cold": round(mb / best["restore"], 1),
        "restore_first_cold": round(mb / best["restore_first"], 1),
    }
    out["stall_seconds"] = {"dcp_async": round(best["dcp_async_stall"], 4), "async": round(best["async_stall"], 4),
                            "sync_save": round(best["sync_save"], 4)}
    # Throughput ratios are inverse time ratios: trainguard's figure over the reference's.
    out["ratios_paired_median"] = {
        "save_vs_dcp_save": _paired(runs, "dcp_save", "sync_save"),
        "async_total_vs_dcp_async_total": _paired(runs, "dcp_async_total", "async_total"),
        "async_stall_vs_dcp_async_stall": _paired(runs, "async_stall", "dcp_async_stall"),
        "async_stall_vs_sync_save": _paired(runs, "async_stall", "sync_save"),
        "save_vs_disk_write": _paired(runs, "raw_write", "sync_save"),
        "restore_vs_disk_read": _paired(runs, "raw_read", "restore"),
        "restore_vs_dcp_load": _paired(runs, "dcp_load", "restore"),
        "restore_vs_verify_then_load": _paired(runs, "verify_then_load", "restore"),
        "restore_first_vs_dcp_load": _paired(runs, "dcp_load", "restore_first"),
    }
    judged = out["ratios_paired_median"]
    out["goals"] = {
        "restore_at_least_80pct_of_disk_read": judged["restore_vs_disk_read"] >= 0.8,
        "save_at_least_95pct_of_dcp_save": judged["save_vs_dcp_save"] >= 0.95,
        "async_save_at_least_95pct_of_dcp_async_save": judged["async_total_vs_dcp_async_total"] >= 0.95,
        "async_stall_at_most_5pct_of_sync_save": judged["async_stall_vs_sync_save"] <= 0.05,
    }
    out["runs_seconds"] = {k: [round(v, 4) for v in vals] for k, vals in runs.items()}
    return out


def worker(args: argparse.Namespace) -> None:
    import logging
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from trainguard.checkpoint import CheckpointConfig, Checkpointer

    if os.environ.get("TG_BENCH_DEBUG"):
        logging.basicConfig(level=logging.DEBUG, format=f"rank{args.rank} %(message)s")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.ranks, timeout=timedelta(seconds=600))
    b = Bench(args)
    async_pg = dist.new_group(backend="gloo")  # plain async_save on the default group hangs (see docs)
    # Long-lived checkpointers, warmed up once (first use of their gloo groups, staging buffers), as in a job.
    ckpts = {
        "sync": Checkpointer(b.base / "sync", CheckpointConfig(async_save=False, keep_last=100)),
        "async": Checkpointer(b.base / "async", CheckpointConfig(async_save=True, keep_last=100)),
    }
    for ckpt in ckpts.values():
        ckpt.save(0, {"rank_local": b.shards})
        ckpt.wait()
    runs: dict[str, list[float]] = {k: [] for k in (*SAVES, *LOADS)}
    for rep in range(1, args.repeats + 1):
        jobs = _save_jobs(b, runs, rep, ckpts, async_pg)
        for i in range(len(jobs)):  # rotate the order each repeat: no method always runs first
            jobs[(i + rep) % len(jobs)]()
        dist.barrier(group=b.timing_pg)
        if b.rank == 0:  # keep the disk from filling; outside the timed parts
            # The sync checkpointer keeps two steps: its restore then has an older one to fall back on, as
            # in a job that has saved more than once (it loads in place); "first" below times the other case.
            for old in (b.base / f"plain-{rep}", b.base / f"plain-async-{rep}", b.base / "async" / f"step-{rep - 1}",
                        b.base / "sync" / f"step-{rep - 2}"):
                shutil.rmtree(old, ignore_errors=True)
    ckpts["async"].close()
    restorer = ckpts["sync"]
    last = b.base / "sync" / f"step-{args.repeats}"
    if b.rank == 0:  # the same files (hard links) as the only checkpoint of another directory: a job's first
        (b.base / "first" / last.name).mkdir(parents=True)
        for path in last.iterdir():
            os.link(path, b.base / "first" / last.name / path.name)
    dist.barrier(group=b.timing_pg)
    first = Checkpointer(b.base / "first", CheckpointConfig(async_save=False, keep_last=100))
    for rep in range(1, args.repeats + 1):
        jobs = _load_jobs(b, runs, restorer, first, last)
        for i in range(len(jobs)):
            jobs[(i + rep) % len(jobs)]()
    restorer.close()
    first.close()
    if b.rank == 0:
        Path(args.out).write_text(json.dumps(summarize(runs, b.mb, b.world, restorer.checksum)))
    dist.destroy_process_group()


def _storage_read_bytes() -> int:
    """This process's bytes read from block devices (``/proc/self/io``); tmpfs reads count nothing."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def _loopback_transfer(payload: memoryview) -> None:
    """Send ``payload`` to this process over loopback TCP and receive it into a fresh buffer (the peer
    restore's transfer, with no holder, checksum or copy around it)."""
    import mmap
    import threading

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)

        def send() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(payload)

        sender = threading.Thread(target=send)
        sender.start()
        buf = mmap.mmap(-1, payload.nbytes)
        with socket.create_connection(server.getsockname()) as sock, memoryview(buf) as view:
            got = 0
            while got < payload.nbytes:
                n = sock.recv_into(view[got:], min(payload.nbytes - got, 8 << 20))
                if not n:
                    raise SystemExit("loopback transfer ended early")
                got += n
        buf.close()
        sender.join()


def _phase_medians(phases: list[dict[str, float]]) -> dict[str, float]:
    names = sorted({k for p in phases for k in p})
    return {k: round(statistics.median(p.get(k, 0.0) for p in phases), 4) for k in names}


def memory_worker(args: argparse.Namespace) -> None:
    """The ``--memory`` measurements (see module doc); rank 0 writes the JSON."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from trainguard.checkpoint import CheckpointConfig, Checkpointer

    torch.set_num_threads(1)
    os.environ["TRAINGUARD_NODE"] = f"bench-node-{args.rank}"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.ranks, timeout=timedelta(seconds=600))
    b = Bench(args)
    async_pg = dist.new_group(backend="gloo")
    state = {"rank_local": b.shards}
    plain = {"__rank_local__": {str(b.rank): b.shards}}
    disk = b.base / "plain"
    dcp.save(plain, checkpoint_id=disk)
    shm = Path(args.memory_root)
    config = CheckpointConfig(memory_gb=args.memory_gb, memory_root=str(shm), memory_address="127.0.0.1",
                              directory=str(b.base / "tiered"))
    ckpt = Checkpointer(b.base / "tiered", config)
    assert ckpt.memory is not None
    ckpt.save_to_memory(0, state)  # warm-up: holders started, slots allocated
    ckpt.wait()
    target = {"rank_local": {k: torch.empty_like(v) for k, v in b.shards.items()}}
    loaded = {"__rank_local__": {str(b.rank): {k: torch.empty_like(v) for k, v in b.shards.items()}}}
    runs: dict[str, list[float]] = {k: [] for k in ("memory_stall", "memory_total", "dcp_async_stall",
                                                     "dcp_async_total", "own_restore", "peer_restore", "dcp_load",
                                                     "memcpy", "tcp_loopback")}
    tiers, storage_bytes, disk_bytes = set(), [], []
    phases: dict[str, list[dict[str, float]]] = {"own": [], "peer": []}
    source = torch.cat([t.view(torch.uint8) for t in b.shards.values()])
    sink = torch.empty_like(source)
    sink.copy_(source)  # pages of the destination allocated before the first timed copy, as the model's are

    def restore(expect: str) -> None:
        runs[f"{expect.rstrip(':')}_restore"].append(b.timed(lambda: ckpt.restore(target)))
        step = ckpt.last_restore.step if ckpt.last_restore else None
        got = ckpt.last_restore.tier if ckpt.last_restore else "storage"
        if step is None or not got.startswith(expect):
            raise SystemExit(f"memory restore came from {got}, not {expect}")
        if not all(torch.equal(target["rank_local"][k], v) for k, v in b.shards.items()):
            raise SystemExit("memory restore returned other data")
        tiers.add(got)
        storage_bytes.append(ckpt.last_restore_storage_bytes)
        assert ckpt.last_restore is not None
        phases["own" if expect == "own" else "peer"].append(ckpt.last_restore.phases)

    def dcp_load() -> None:
        before = _storage_read_bytes()
        dcp.load(loaded, checkpoint_id=disk)
        disk_bytes.append(_storage_read_bytes() - before)

    def drop_own() -> None:
        own = ckpt.memory.node_dir / "own" / f"rank-{b.rank}"  # type: ignore[union-attr]
        for description in own.glob("slot-*.json"):
            description.unlink()

    for rep in range(1, args.repeats + 1):
        _async_pair(b, runs, lambda rep=rep: ckpt.save_to_memory(rep, state), lambda _: ckpt.wait(), "memory")
        _async_pair(b, runs, lambda rep=rep: dcp.async_save(plain, checkpoint_id=b.base / f"async-{rep}",
                                                    process_group=async_pg), lambda fut: fut.result(), "dcp_async")
        restore("own")  # timed inside; the data check after the clock stops (dcp_load has none either)
        drop_own()
        restore("peer:")
        runs["dcp_load"].append(b.timed(dcp_load, evict=True))
        runs["memcpy"].append(b.timed(lambda: sink.copy_(source)))
        runs["tcp_loopback"].append(b.timed(lambda: _loopback_transfer(b.payload)))
        if b.rank == 0:
            shutil.rmtree(b.base / f"async-{rep}", ignore_errors=True)
    ckpt.close()
    if b.rank == 0:
        best = {k: min(v) for k, v in runs.items()}
        out = {
            "mode": "memory", "mb": round(b.mb, 1), "mb_per_rank": round(b.mb / b.world, 1), "ranks": b.world,
            "seconds_best": {k: round(v, 4) for k, v in best.items()},
            "ratios_paired_median": {
                "own_restore_speedup_vs_dcp_load": _paired(runs, "dcp_load", "own_restore"),
                "peer_restore_speedup_vs_dcp_load": _paired(runs, "dcp_load", "peer_restore"),
                "memory_stall_vs_dcp_async_stall": _paired(runs, "memory_stall", "dcp_async_stall"),
                "ceiling_ratio": _paired(runs, "dcp_load", "memcpy"),
                "peer_ceiling_ratio": _paired(runs, "dcp_load", "tcp_loopback"),
                "own_restore_vs_memcpy": _paired(runs, "own_restore", "memcpy"),
                "peer_restore_vs_tcp_loopback": _paired(runs, "peer_restore", "tcp_loopback"),
            },
            "restore_phases_median": {tier: _phase_medians(p) for tier, p in phases.items()},
            # Rank 0's figures: checkpoint bytes the checkpointer read, and the block-device reads of dcp.load.
            "storage_bytes_read_per_restore": {"memory_tier": max(storage_bytes), "dcp_load": max(disk_bytes)},
            "tiers_seen_on_rank0": sorted(tiers),
            "runs_seconds": {k: [round(v, 4) for v in vals] for k, vals in runs.items()},
        }
        judged = out["ratios_paired_median"]
        out["goals"] = {
            "memory_restores_at_least_10x_dcp_load": min(judged["own_restore_speedup_vs_dcp_load"],
                                                        judged["peer_restore_speedup_vs_dcp_load"]) >= 10,
            "memory_stall_at_most_dcp_async_stall": judged["memory_stall_vs_dcp_async_stall"] <= 1.0,
            "no_storage_read_from_memory": max(storage_bytes) == 0,
        }
        Path(args.out).write_text(json.dumps(out))
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=64.0, help="total state size in MB (10^6 bytes); default 64")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--tensors", type=int, default=8, help="tensors per rank")
    ap.add_argument(
        "--repeats", type=int, default=3, help="measurements per figure (best reported; goals on paired medians)"
    )
    ap.add_argument("--dir", default="", help="directory on the disk to measure (default: a temp dir)")
    ap.add_argument("--memory", action="store_true", help="measure the memory tier (see module doc)")
    ap.add_argument("--memory-gb", type=float, default=8.0, help="memory tier bound per node (--memory)")
    ap.add_argument("--memory-root", default="/dev/shm", help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        (memory_worker if args.memory else worker)(args)
        return 0
    if not (0 < args.mb <= 100_000 and 1 <= args.ranks <= 64 and args.repeats >= 1 and args.tensors >= 1):
        print("checkpoint benchmark: --mb, --ranks, --tensors or --repeats out of range", file=sys.stderr)
        return 2
    base = Path(tempfile.mkdtemp(prefix="tg-ckpt-bench-", dir=args.dir or None))
    out = base / "result.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    common = ["--worker", "--port", str(port), "--dir", str(base), "--out", str(out)]
    common += ["--mb", str(args.mb), "--ranks", str(args.ranks), "--tensors", str(args.tensors)]
    common += ["--repeats", str(args.repeats), "--memory-gb", str(args.memory_gb), "--memory-root", args.memory_root]
    common += ["--memory"] if args.memory else []
    env["TRAINGUARD_JOB_SECRET"] = os.environ.get("TRAINGUARD_JOB_SECRET") or os.urandom(16).hex()
    procs = [
        subprocess.Popen([sys.executable, __file__, *common, "--rank", str(r)], env=env) for r in range(args.ranks)
    ]
    codes = [p.wait() for p in procs]
    try:
        if any(codes) or not out.exists():
            print(f"checkpoint benchmark: a rank failed (exit codes {codes})", file=sys.stderr)
            return 1
        result = json.loads(out.read_text())
        result["directory"] = str(base)
        print(json.dumps(result))
        return 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
