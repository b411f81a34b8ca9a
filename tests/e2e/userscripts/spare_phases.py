"""A job for the warm-spare lifetime tests: every rank records its pid and runs until it is stopped.

    spare_phases.py OUT forever     every rank runs until it is stopped
    spare_phases.py OUT crash-once  attempt 0: rank 1 exits 3 once OUT/crash exists; later attempts run on

Its top-level import `slow_spare_import` keeps a warm spare in its import when the test asks for it.
"""

import os
import sys
import time
from pathlib import Path

import slow_spare_import  # noqa: F401  (loaded ahead by a warm spare)

out, mode = Path(sys.argv[1]), sys.argv[2]
rank, attempt = os.environ["RANK"], os.environ.get("TRAINGUARD_ATTEMPT", "0")
(out / f"worker-{attempt}-{rank}").write_text(str(os.getpid()))
while True:
    if mode == "crash-once" and attempt == "0" and rank == "1" and (out / "crash").exists():
        sys.exit(3)
    time.sleep(0.1)
