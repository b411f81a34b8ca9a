"""Benchmark: classify a generated training log (1 GiB by default) in streaming fashion; print one JSON object.

Measures, in one run on the same file, the wall seconds and peak RSS of ``trainguard classify --json`` and of
``grep -c -E`` with the same trigger words that make a line a candidate for trainguard (the scanner's
``trigger_words``, one alternation), run with ``LC_ALL=C`` (grep's fastest, byte-wise mode, like the RE2
pre-filter): the cost of finding the same candidate lines in C and nothing else. ``ratio_to_grep`` is their
quotient. ``grep -c -F`` of the one XID literal is printed too, as the floor of merely reading the file.
Usage: ``python benchmarks/classify.py [--size-mb 1024] [--dir /tmp] [--candidates-per-mille N] [--candidate bar]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
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


# The link pass: the address lines every rank prints at start, and a failing HCA's errors before the XID.
LINK_START = (b"node-17:3341:3341 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.17<0>\n"
              b"node-17:3341:3341 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB "
              b"[3]mlx5_3:1/IB ; OOB eth0:10.0.0.17<0>\n")
LINK_END = b"".join(
    b"node-17:3341:3560 [3] transport/net_ib.cc:2123 NCCL WARN NET/IB : Got completion from peer 10.0.0.%d<4%04d> "
    b"with status=12 opcode=0 len=0 vendor err 129 (Send) localGid ::ffff:10.0.0.17 remoteGids ::ffff:10.0.0.%d "
    b"hca mlx5_3\n" % (peer, peer, peer) for peer in (16, 18, 25)) + (
    b"node-17:3341:3560 [3] transport/net_ib.cc:112 NCCL WARN NET/IB : mlx5_3:1 Got async event : port error\n")
NOISE = b"2026-11-30 09:00:%02d,%03d data WARNING worker %d: shard fetch failed with error, retrying (attempt 1)\n"
# a progress bar printed one update per line (what some loggers do with tqdm): a candidate of the busy-rank reading
BAR = b"Running tokenizer on dataset:  %02d%%|%s| %d/10000 [00:%02d<01:00, 1200.00 examples/s]\n"


def make_log(path: Path, size_bytes: int, candidates_per_mille: int = 0, candidate: str = "warning") -> int:
    """A realistic training log: NCCL's address lines, step lines, NCCL INFO noise, a few warnings; a failing
    HCA's NET/IB errors and the XID at the end (so the link pass has work). With ``candidates_per_mille``,
    that many lines in a thousand trigger the pre-filter: warnings, or (``candidate="bar"``) progress-bar lines."""
    lines = []
    every = 1000 // candidates_per_mille if candidates_per_mille else 0
    for i in range(20000):
        if every and i % every == every - 1:
            lines.append(NOISE % (i % 60, i % 1000, i % 16) if candidate == "warning"
                         else BAR % (i % 100, b"#" * (i % 10) + b" " * (10 - i % 10), i % 10000, i % 60))
        elif i % 500 == 0:
            lines.append(NCCL % (i % 32))
        elif i % 2000 == 1:
            lines.append(WARN % (i % 60))
        else:
            lines.append(STEP % (i % 60, i % 60, i % 1000, i, 2 + (i % 97) / 100, i % 9, i % 1000))
    block = b"".join(lines)
    written = len(LINK_START)
    with path.open("wb") as f:
        f.write(LINK_START)
        while written < size_bytes:
            f.write(block)
            written += len(block)
        f.write(LINK_END + XID)
    return written + len(LINK_END) + len(XID)


def grep_pattern() -> str:
    """trainguard's trigger words as one POSIX extended regular expression."""
    from trainguard.classify import default_rules
    from trainguard.classify.scan import Scanner

    scanner = Scanner(default_rules())
    if scanner.trigger_patterns:  # built-in rules all have keywords; say so if that ever changes
        print("warning: rules without keywords are not in the grep pattern", file=sys.stderr)
    return "|".join(re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", w) for w in scanner.trigger_words)


GNU_TIME = "/usr/bin/time"


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, int, subprocess.CompletedProcess[bytes]]:
    """(wall seconds, peak RSS in KiB, result) of one command.

    The peak comes from GNU time's ``%M`` where it is installed: a child forked from this Python process would
    otherwise report this process's own high-water mark, which Linux carries across exec. Without GNU time it
    is wait4's figure, an upper bound."""
    with tempfile.NamedTemporaryFile() as rss_file, tempfile.TemporaryFile() as err:
        wrapped = [GNU_TIME, "-f", "%M", "-o", rss_file.name, *cmd] if os.access(GNU_TIME, os.X_OK) else cmd
        start = time.perf_counter()
        proc = subprocess.Popen(wrapped, stdout=subprocess.PIPE, stderr=err, env=env)
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        err.seek(0)
        kib = usage.ru_maxrss
        if wrapped is not cmd:
            with contextlib.suppress(ValueError, IndexError):  # time wrote no figure: keep wait4's
                kib = int(Path(rss_file.name).read_text().split()[-1])
        return elapsed, kib, subprocess.CompletedProcess(cmd, code, out, err.read())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--candidates-per-mille", type=int, default=0, choices=range(0, 1001), metavar="N",
                    help="lines in a thousand that the pre-filter passes to Python (default 0: the headline file)")
    ap.add_argument("--candidate", choices=("warning", "bar"), default="warning",
                    help="what those lines are: a warning that names no cause, or a progress-bar update")
    args = ap.parse_args()
    path = Path(args.dir) / f"trainguard-bench-{os.getpid()}.log"
    c_env = {**os.environ, "LC_ALL": "C"}
    try:
        size = make_log(path, args.size_mb << 20, args.candidates_per_mille, args.candidate)
        pattern = grep_pattern()
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # same page cache for all below
        lit_s, _, lit = timed(["grep", "-c", "-F", "NVRM: Xid", str(path)], c_env)
        grep_s, grep_kib, grep = timed(["grep", "-c", "-E", pattern, str(path)], c_env)
        tg_s, tg_kib, proc = timed([sys.executable, "-m", "trainguard", "classify", "--json", str(path)])
        doc = json.loads(proc.stdout)[0] if proc.returncode == 0 else {}
        print(json.dumps({
            "benchmark": "classify",
            "file_bytes": size,
            "candidates_per_mille": args.candidates_per_mille,
            "candidate": args.candidate,
            "lines": doc.get("lines"),
            "category": doc.get("category"),
            "evidence_line": doc["evidence"][0]["line"] if doc.get("evidence") else None,
            "link_shared": ((doc.get("links") or {}).get("shared") or {}).get("name"),
            "link_fatal_pairs": (doc.get("links") or {}).get("fatal_pairs"),
            "exit_code": proc.returncode,
            "seconds": round(tg_s, 3),
            "mb_per_second": round(size / 2**20 / tg_s, 1),
            "peak_rss_mib": round(tg_kib / 1024, 1),
            "grep_seconds": round(grep_s, 3),
            "grep_command": "LC_ALL=C grep -c -E '<trigger words, one alternation>' FILE",
            "grep_trigger_words": pattern.count("|") + 1,
            "grep_count": int(grep.stdout or b"0"),
            "grep_peak_rss_mib": round(grep_kib / 1024, 1),
            "ratio_to_grep": round(tg_s / grep_s, 2) if grep_s > 0 else None,
            "grep_literal_seconds": round(lit_s, 3),
            "grep_literal_command": "LC_ALL=C grep -c -F 'NVRM: Xid' FILE",
            "grep_literal_count": int(lit.stdout or b"0"),
        }))
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
