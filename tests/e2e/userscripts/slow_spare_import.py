"""A module whose import never ends in a warm spare when ``$SLOW_SPARE_IMPORT_OUT`` names a folder.

The spare writes ``importing-<pid>`` there first, so a test sees it is still importing; a rank (a cold
interpreter, or a spare that took a rank after loading this module) imports it at once.
"""

import os
import sys
import time
from pathlib import Path

_main = sys.modules.get("__main__")
if getattr(getattr(_main, "__spec__", None), "name", None) == "trainguard.worker.warm":  # a spare, loading
    _out = os.environ.get("SLOW_SPARE_IMPORT_OUT")
    if _out:
        Path(_out, f"importing-{os.getpid()}").write_text(str(os.getpid()))
        time.sleep(3600)
