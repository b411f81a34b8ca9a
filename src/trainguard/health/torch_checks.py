"""Torch checks: devices visible and usable, and a real gloo collective over loopback."""

from __future__ import annotations

import threading
from datetime import timedelta

from trainguard.health.base import HIGH, CheckResult, HealthConfig, failed, passed


def check_torch_devices(config: HealthConfig) -> list[CheckResult]:
    """Every visible accelerator runs a tiny kernel; without CUDA, the CPU does (and that is reported)."""
    import torch

    if not torch.cuda.is_available():
        if config.expected_gpus:
            return [failed("torch_devices", HIGH, f"torch sees no CUDA device, expected {config.expected_gpus}")]
        x = torch.arange(4, dtype=torch.float32)
        if float((x * 2).sum()) != 12.0:
            return [failed("torch_devices", HIGH, "CPU tensor arithmetic gave a wrong result")]
        return [passed("torch_devices", HIGH, "no CUDA devices visible; CPU tensors work")]
    count = torch.cuda.device_count()
    bad: list[str] = []
    for i in range(count):
        try:
            y = torch.full((256,), 2.0, device=f"cuda:{i}")
            if float(y.sum().item()) != 512.0:
                bad.append(f"cuda:{i} wrong result")
        except Exception as exc:
            bad.append(f"cuda:{i} {exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if config.expected_gpus is not None and count < config.expected_gpus:
        bad.append(f"{count} CUDA devices visible, expected {config.expected_gpus}")
    if bad:
        return [failed("torch_devices", HIGH, "; ".join(bad))]
    return [passed("torch_devices", HIGH, f"{count} CUDA devices usable")]


def check_torch_collective(config: HealthConfig) -> list[CheckResult]:
    """A two-rank gloo all-reduce over 127.0.0.1 (TCPStore on an OS-chosen port), ranks as threads.

    Exercises the gloo transport and store without touching the caller's default process group.
    """
    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=config.timeout_seconds)
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timeout, wait_for_workers=False)
    results: dict[int, float] = {}
    errors: list[str] = []

    def rank(r: int) -> None:
        try:
            s = store if r == 0 else dist.TCPStore("127.0.0.1", store.port, 2, False, timeout=timeout)
            pg = dist.ProcessGroupGloo(dist.PrefixStore("trainguard-health", s), r, 2, timeout)
            t = torch.tensor([float(r + 1)])
            pg.allreduce([t]).wait()
            results[r] = float(t.item())
        except Exception as exc:
            errors.append(f"rank {r}: {exc.__class__.__name__}: {exc}")

    threads = [threading.Thread(target=rank, args=(r,), daemon=True, name=f"health-gloo-{r}") for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(config.timeout_seconds + 1)
    if any(t.is_alive() for t in threads):
        return [failed("torch_collective", HIGH, f"gloo all-reduce did not finish in {config.timeout_seconds:g} s")]
    if errors:
        return [failed("torch_collective", HIGH, "; ".join(errors)[:500])]
    if results != {0: 3.0, 1: 3.0}:
        return [failed("torch_collective", HIGH, f"gloo all-reduce gave wrong results {results}")]
    return [passed("torch_collective", HIGH, f"gloo all-reduce over 127.0.0.1:{store.port} ok")]
