"""The tiny GPT example, except in the attempt that ``TG_TEST_HOLD_ATTEMPT`` names: there every rank waits before
its first step (no collective, no step) until the agent replaces it. A round that must still be running when
a late node arrives then is, however slow the machine: the wait ends on the agents' restart, not on a clock
(and, should the late node never come, on the first-step allowance's hang)."""

import os
import runpy
import sys
import time

held = os.environ.get("TG_TEST_HOLD_ATTEMPT")
if held is not None and os.environ.get("TRAINGUARD_ATTEMPT") == held:
    print(f"hold_attempt: holding attempt {held}", flush=True)
    while True:
        time.sleep(1)
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
