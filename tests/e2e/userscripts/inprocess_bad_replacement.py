"""train_gpt_inprocess, except that the first process started for an in-process attempt exits at once.

It stands for a replacement that cannot start (a broken node, a bad environment): the agent must abandon
the in-process restart and restart every worker. Later processes (the whole restart's) train normally.
"""

import os
import sys
from pathlib import Path

from trainguard.examples.train_gpt_inprocess import main

marker = Path(os.environ["TRAINGUARD_RUN_DIR"]) / "bad-replacement-fired"
if os.environ.get("TRAINGUARD_ATTEMPT", "0") != "0" and not marker.exists():
    marker.write_text(os.environ.get("RANK", "?"))
    sys.exit(7)
sys.exit(main())
