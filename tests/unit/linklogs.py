"""Synthetic multi-rank NCCL logs of one failure, for the link localization tests.

Each host writes one log (its ranks' NCCL output): the bootstrap and NET/IB ``Using`` lines that name its
address, INFO noise and training steps, then the error lines of the scenario. Line formats follow NCCL's
net_ib.cc / socket.cc warnings and the NVIDIA driver's XID and SXid lines (docs/classify.md).
"""

from __future__ import annotations

import random
from pathlib import Path

HCAS = 4


def host(i: int) -> str:
    return f"node-{i:02d}"


def ip(i: int) -> str:
    return f"10.0.{i // 200}.{i % 200 + 1}"


def _prefix(i: int, dev: int) -> str:
    return f"{host(i)}:{4100 + dev}:{4300 + dev} [{dev}]"


def preamble(i: int) -> list[str]:
    out = [f"{_prefix(i, 0)} NCCL INFO Bootstrap : Using eth0:{ip(i)}<0>",
           f"{_prefix(i, 0)} NCCL INFO NET/IB : Using " + " ".join(f"[{k}]mlx5_{k}:1/IB" for k in range(HCAS))
           + f" ; OOB eth0:{ip(i)}<0>"]
    for step in range(20):
        out.append(f"{_prefix(i, 0)} NCCL INFO Channel {step % 8:02d}/0 : {i * 8}[0] -> {i * 8 + 8}[0] "
                   f"via NET/IB/{step % HCAS}/GDRDMA")
        out.append(f"2026-12-01 10:{step:02d}:00,000 train INFO step {step} loss 2.{step:02d}")
    return out


def completion(i: int, dev: int, peer: int, *, old: bool = False) -> str:
    if old:  # NCCL before 2.19 prints neither "status=" nor the HCA
        return (f"{_prefix(i, dev)} transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
                f"{ip(peer)}<{40000 + peer}> with error 12, opcode 0, len 0, vendor err 129")
    return (f"{_prefix(i, dev)} transport/net_ib.cc:2123 NCCL WARN NET/IB : Got completion from peer "
            f"{ip(peer)}<{40000 + peer}> with status=12 opcode=0 len=0 vendor err 129 (Send) "
            f"localGid ::ffff:{ip(i)} remoteGids ::ffff:{ip(peer)} hca mlx5_{dev}")


def async_port_error(i: int, dev: int) -> str:
    return f"{_prefix(i, dev)} transport/net_ib.cc:112 NCCL WARN NET/IB : mlx5_{dev}:1 Got async event : port error"


def socket_closed(i: int, peer: int) -> str:
    return (f"{_prefix(i, 0)} misc/socket.cc:50 NCCL WARN Net : Connection closed by remote peer "
            f"{ip(peer)}<{50000 + peer}>")


def retry(i: int, peer: int) -> str:
    return (f"{_prefix(i, 0)} misc/socket.cc:560 NCCL WARN socketStartConnect: Connect to {ip(peer)}<{50000 + peer}> "
            "failed : Connection refused, retrying")


def neighbours(b: int, n: int) -> list[int]:
    """Ring neighbours of ``b`` (and the opposite host for larger jobs, a tree partner)."""
    out = {(b - 1) % n, (b + 1) % n}
    if n >= 8:
        out.add((b + n // 2) % n)
    out.discard(b)
    return sorted(out)


def write(tmp: Path, logs: dict[int, list[str]], n: int, *, missing: tuple[int, ...] = ()) -> list[Path]:
    """One file per host (hosts in ``missing`` wrote none); returns the files."""
    paths = []
    for i in range(n):
        if i in missing:
            continue
        p = tmp / f"{host(i)}.log"
        p.write_text("\n".join(preamble(i) + logs.get(i, [])) + "\n")
        paths.append(p)
    return paths


def broken_hca(n: int, b: int, dev: int) -> dict[int, list[str]]:
    """Host ``b``'s HCA ``mlx5_<dev>`` fails: it and the peers on the same rail report each other."""
    logs: dict[int, list[str]] = {b: [async_port_error(b, dev)]}
    for p in neighbours(b, n):
        logs[b].append(completion(b, dev, p))
        logs.setdefault(p, []).append(completion(p, dev, b))
    return logs


def broken_remote_host(n: int, r: int, rng: random.Random) -> dict[int, list[str]]:
    """Host ``r`` dies: every peer that talked to it reports it, through whichever HCA it used; ``r`` is silent."""
    logs: dict[int, list[str]] = {}
    for p in range(n):
        if p == r:
            continue
        if n <= 8 or p in neighbours(r, n) or rng.random() < 0.3:
            devs = rng.sample(range(HCAS), 2)
            logs[p] = [completion(p, devs[0], r), completion(p, devs[1], r, old=True), socket_closed(p, r)]
    return logs


def broken_leaf(n: int, leaf_hosts: list[int]) -> dict[int, list[str]]:
    """Every host under one leaf switch loses its links: each reports its ring peers, which report it."""
    logs: dict[int, list[str]] = {}
    for h in leaf_hosts:
        for p in ((h - 1) % n, (h + 1) % n):
            dev = (h + p) % HCAS
            logs.setdefault(h, []).append(completion(h, dev, p))
            logs.setdefault(p, []).append(completion(p, dev, h))
    return logs


def noise(n: int, rng: random.Random, count: int) -> dict[int, list[str]]:
    """Isolated connection retries between random pairs: a healthy job."""
    logs: dict[int, list[str]] = {}
    for _ in range(count):
        a, b = rng.sample(range(n), 2)
        logs.setdefault(a, []).append(retry(a, b))
    return logs


def topology(n: int, per_leaf: int) -> dict[str, object]:
    return {"hosts": {host(i): {"leaf": f"leaf-{i // per_leaf}", "addresses": [ip(i)],
                                "hcas": {f"mlx5_{k}": f"leaf-{i // per_leaf}/{(i % per_leaf) * HCAS + k + 1}"
                                         for k in range(HCAS)}}
                      for i in range(n)}}


def merge(*parts: dict[int, list[str]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for part in parts:
        for k, v in part.items():
            out.setdefault(k, []).extend(v)
    return out
