"""A worker whose rank 0 starts a helper in a session of its own that ignores SIGTERM (a `setsid` child).

    detach.py OUT forever            every rank runs until it is stopped
    detach.py OUT crash-then-finish  attempt 0: rank 0 exits 3 after a second; attempt 1: rank 0 writes
                                     whether attempt 0's helper still runs (OUT/seen-1), then every rank ends
"""

import os
import subprocess
import sys
import time
from pathlib import Path


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            data = fh.read()
    except OSError:
        return False
    return data[data.rfind(")") + 1:].split()[0] not in ("Z", "X")


out, mode = Path(sys.argv[1]), sys.argv[2]
rank, attempt = os.environ["RANK"], os.environ.get("TRAINGUARD_ATTEMPT", "0")
(out / f"worker-{attempt}-{rank}").write_text(str(os.getpid()))
if rank == "0":
    helper = subprocess.Popen(["/bin/sh", "-c", "trap '' TERM; while :; do sleep 0.2; done"], start_new_session=True)
    (out / f"helper-{attempt}").write_text(str(helper.pid))
if mode == "crash-then-finish" and attempt == "0":
    if rank == "0":
        time.sleep(1)
        sys.exit(3)
elif mode == "crash-then-finish":
    if rank == "0":
        first = int((out / "helper-0").read_text())
        (out / "seen-1").write_text("running" if running(first) else "gone")
    time.sleep(1)
    sys.exit(0)
while True:
    time.sleep(0.1)
