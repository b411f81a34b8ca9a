"""Benchmark: classify a generated 1 GB training log in streaming fashion; print one JSON object.

Measures wall seconds and the peak RSS of ``trainguard classify --json`` on the file, next to an
anchor in the same run: ``grep -c`` for the XID line over the same file (the cost of just reading
and matching one literal). Usage: ``python benchmarks/classify.py [--size-mb 1024] [--dir /tmp]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

XID = (b"Nov 30 08:00:01 node-17 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=0, name=python, "
       b"GPU has fallen off the bus.\n")
NCCL = b"node-17:3341:3560 [3] NCCL INFO Channel %02d/0 : 27[3] -> 35[3] via NET/IB/3/GDRDMA\n"
WARN = b"[rank3]:[W1130 07:41:%02d ProcessGroupNCCL.cpp:4115] Warning: TORCH_NCCL_AVOID_RECORD_STREAMS is deprecated\n"
STEP = b"2026-11-30 09:%02d:%02d,%03d train INFO step %d loss %.4f lr 3.0e-4 grad_norm 0.%d tokens/s 81%03d\n"


def make_log(path: Path, size_bytes: int) -> int:
    """A realistic training log: step lines, NCCL INFO noise, a few warnings; the XID at the end."""
    lines = []
    for i in range(20000):
        if i % 500 == 0:
            lines.append(NCCL % (i % 32))
        elif i % 2000 == 1:
            lines.append(WARN % (i % 60))
        else:
            lines.append(STEP % (i % 60, i % 60, i % 1000, i, 2 + (i % 97) / 100, i % 9, i % 1000))
    block = b"".join(lines)
    written = 0
    with path.open("wb") as f:
        while written < size_bytes:
            f.write(block)
            written += len(block)
        f.write(XID)
    return written + len(XID)


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[bytes]]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, check=False)
    return time.perf_counter() - start, proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    args = ap.parse_args()
    path = Path(args.dir) / f"trainguard-bench-{os.getpid()}.log"
    try:
        size = make_log(path, args.size_mb << 20)
        grep_s, grep = timed(["grep", "-c", "-F", "NVRM: Xid", str(path)])
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        tg_s, proc = timed([sys.executable, "-m", "trainguard", "classify", "--json", str(path)])
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        doc = json.loads(proc.stdout)[0] if proc.returncode == 0 else {}
        print(json.dumps({
            "benchmark": "classify",
            "file_bytes": size,
            "lines": doc.get("lines"),
            "category": doc.get("category"),
            "evidence_line": doc["evidence"][0]["line"] if doc.get("evidence") else None,
            "exit_code": proc.returncode,
            "seconds": round(tg_s, 2),
            "mb_per_second": round(size / 2**20 / tg_s, 1),
            "peak_rss_mib": round(peak_kib / 1024, 1),
            "peak_rss_note": "max RSS of any child so far" if peak_kib == before else "classify process",
            "anchor_grep_seconds": round(grep_s, 2),
            "anchor_grep_count": int(grep.stdout or b"0"),
            "slowdown_vs_grep": round(tg_s / grep_s, 1) if grep_s > 0 else None,
        }))
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
