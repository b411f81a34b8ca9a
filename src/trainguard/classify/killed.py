"""What an Unknown answer says when a process was killed or stopped and its logs hold no cause: one line
naming who was killed by which signal ("rank 1 killed by SIGKILL from outside the job; no cause in its logs")."""

from __future__ import annotations

import re
from collections.abc import Iterable

from trainguard.classify.scan import Hit

KILLED_RULE = "process-killed"
"""The rule (rules.toml) whose lines say a process died of a signal sent from outside it."""

# torchelastic prints the negated signal number as the exit code; shells print 128 + the signal number
_SIGNALS = {"9": "SIGKILL", "15": "SIGTERM", "137": "SIGKILL", "143": "SIGTERM", "2": "SIGINT", "6": "SIGABRT"}
_SIGNAL = re.compile(r"\b(SIG(?:KILL|TERM|INT|HUP|ABRT))\b|(?:exit ?code:? ?|return code = )(-9|-15|137|143)\b"
                     r"|\b(Killed|Terminated)(?:\s*$|\s)|已杀死|已终止", re.IGNORECASE)
_RANK = re.compile(r"\b(local_rank|global_rank|rank)\s*[:=#]?\s*(\d+)|\[[Rr]ank (\d+)\]")


def _signal(text: str) -> str:
    m = _SIGNAL.search(text)
    if m is None:
        return "a signal"
    if m.group(1):
        return m.group(1).upper()
    if m.group(2):
        return _SIGNALS[m.group(2).lstrip("-")]
    # the shell's "Killed"/"Terminated" (also in Chinese locales) after a job it ran
    return "SIGTERM" if (m.group(3) or "").lower() == "terminated" or "终止" in m.group(0) else "SIGKILL"


def _who(ranks: list[str], local: bool) -> str:
    if not ranks:
        return "the process"
    noun = "local rank" if local else "rank"
    if len(ranks) == 1:
        return f"{noun} {ranks[0]}"
    shown = ", ".join(ranks[:8]) + (" ..." if len(ranks) > 8 else "")
    return f"{noun}s {shown}"


def killed_summary(hits: Iterable[Hit]) -> str | None:
    """One line for a killed or stopped process with no cause in its logs, or None when no line says that a
    process died of a signal. Only for answers where no rule named a cause: a kill after an OOM-killer line
    or a maintenance notice is that cause's consequence, not this."""
    killed = [h for h in hits if h.rule == KILLED_RULE]
    if not killed:
        return None
    signals: list[str] = []
    ranks: list[str] = []
    local = False
    for h in killed:
        sig = _signal(h.text)
        if sig not in signals:
            signals.append(sig)
        m = _RANK.search(h.text)
        rank = (m.group(2) or m.group(3)) if m is not None else None
        if m is not None and rank is not None and rank not in ranks:
            ranks.append(rank)
            local = local or m.group(1) == "local_rank"
    verb = "stopped" if all(s in ("SIGTERM", "SIGINT", "SIGHUP") for s in signals) else "killed"
    whose = "their" if len(ranks) > 1 else "its"
    return (f"{_who(sorted(ranks, key=int), local)} {verb} by {'/'.join(signals)} from outside the job; no cause in "
            f"{whose} logs (look at the host's kernel log for the OOM killer, and at the scheduler for a cancel or a "
            f"time limit)")
