"""Names that become parts of paths (run ids, node ids, event writers, ranks), checked in one place,
and fresh run ids that do not collide.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time

from trainguard.core.numeric import is_number
from trainguard.errors import UsageError

log = logging.getLogger(__name__)

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}"
"""What a name may look like: 1-128 characters, a letter or digit first, then letters, digits, ``_.@-``."""
MAX_RANK = 10_000_000
"""Ranks are below this (far above any real world size; keeps file names short)."""

_NAME = re.compile(NAME_PATTERN)
_RANK = re.compile(r"[0-9]{1,8}")


class _IssuedIds:
    """The run ids this process handed out in the latest second (an earlier second's cannot repeat)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stamp = ""
        self.ids: set[str] = set()


_ISSUED = _IssuedIds()
_SHOWN = 60  # characters of a bad value quoted in the message: enough to recognise it, short enough for one line


def _shown(value: object) -> str:
    text = value if isinstance(value, str) else str(value)
    # repr() escapes newlines and control characters, so the message stays on one line
    return repr(text[:_SHOWN]) + ("..." if len(text) > _SHOWN else "")


def check_name(kind: str, value: object) -> str:
    """``value`` if it is safe as one path component (no separator, no ``..``, no leading dot or dash);
    else `UsageError` naming ``kind`` (e.g. ``"node id"``) and the value."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or ".." in value:
        raise UsageError(
            f"bad {kind} {_shown(value)}: use 1-128 letters, digits, '_', '.', '@' or '-', "
            "starting with a letter or digit, without '..'")
    return value


def check_rank(value: object) -> int:
    """``value`` (an int or a decimal string) as a rank in ``0 <= rank < MAX_RANK``; else `UsageError`."""
    rank: int | None = None
    if is_number(value, integer=True) or (isinstance(value, str) and _RANK.fullmatch(value)):
        rank = int(value)
    if rank is None or not 0 <= rank < MAX_RANK:
        raise UsageError(f"bad rank {_shown(value)}: must be an integer with 0 <= rank < {MAX_RANK}")
    return rank


def new_run_id(now: float | None = None) -> str:
    """A fresh run id: ``run-YYYYmmdd-HHMMSS-xxxxxx`` (local time, then 6 random hex digits).

    Ids sort by start time to the second. Within one process no id is handed out twice (the random
    part is redrawn on a repeat); across processes 24 random bits make a repeat unlikely but not
    impossible (about 1 in 1.7 million for 5 runs started in the same second), so the caller that makes
    the folder still checks that it is new."""
    stamp = time.strftime("run-%Y%m%d-%H%M%S", time.localtime(now))
    with _ISSUED.lock:
        if _ISSUED.stamp != stamp:
            _ISSUED.stamp, _ISSUED.ids = stamp, set()
        while True:
            run_id = f"{stamp}-{secrets.token_hex(3)}"
            if run_id not in _ISSUED.ids:
                _ISSUED.ids.add(run_id)
                return run_id
