"""train_gpt_inprocess, except that the first process started for an in-process attempt exits at once
(or, with ``BAD_REPLACEMENT=stall``, never joins the process group).

It stands for a replacement that cannot start (a broken node, a bad environment) or that stalls: the agent
must abandon the in-process restart and restart every worker. Later processes (the whole restart's) train
normally.
"""

import os
import sys
import time
from pathlib import Path

from trainguard.examples.train_gpt_inprocess import main

marker = Path(os.environ["TRAINGUARD_RUN_DIR"]) / "bad-replacement-fired"
# A process started for an in-process attempt: a later attempt, but no elastic restart (that is the fallback's).
replacement = os.environ.get("TRAINGUARD_ATTEMPT", "0") != "0" and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"
if replacement and not marker.exists():
    marker.write_text(os.environ.get("RANK", "?"))
    if os.environ.get("BAD_REPLACEMENT") == "stall":
        time.sleep(600)
    sys.exit(7)
sys.exit(main())
