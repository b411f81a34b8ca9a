"""train_gpt_inprocess, except that the first attempt starts training only once the warm spares wait
(``TEST_SPARES_READY`` of them, default 1).

So a fault early in training finds a spare ready on a slow, shared machine, and the test sees the spare
take the failed rank's place rather than a cold start.
"""

import os
import sys
import time
from pathlib import Path

from trainguard.examples.train_gpt_inprocess import main

spares = Path(os.environ["TRAINGUARD_RUN_DIR"]) / "logs" / "spares"
wanted = int(os.environ.get("TEST_SPARES_READY", "1"))
deadline = time.monotonic() + 180
while os.environ.get("TRAINGUARD_ATTEMPT") == "0" and time.monotonic() < deadline:
    # a spare that found itself unfit ("unfit for a warm start") is replaced by the agent: count the fit ones
    if sum("waiting" in t and "unfit" not in t for t in (p.read_text() for p in spares.glob("spare-*.log"))) >= wanted:
        break
    time.sleep(0.2)
sys.exit(main())
