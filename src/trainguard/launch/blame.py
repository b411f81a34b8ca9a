"""Which ranks caused a failure: crash culprits from exit codes, hang culprits from evidence (pure logic).

The agent gathers the facts (exit codes, flight-recorder counts, process states, control-thread answers,
heartbeat steps); the rules that turn them into culprit ranks and a one-line explanation live here so
they are unit-tested without processes.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

STOPPED_STATES = ("T", "t")
"""``/proc/<pid>/stat`` states of a process stopped by a signal (SIGSTOP, SIGTSTP) or by a tracer."""


def is_stopped(state: str | None) -> bool:
    """Whether a ``/proc/<pid>/stat`` state letter means the process is stopped."""
    return state in STOPPED_STATES


# --- crashes -----------------------------------------------------------------------------------------


def crash_culprits(exit_codes: Mapping[int, int]) -> tuple[list[int], str]:
    """Culprit ranks and failure kind (``crash`` or ``exit``) from the exit codes of the ranks that ended.

    Ranks killed by a signal are the cause; ranks exiting with an error may only be its echo. Among
    signalled ranks, SIGABRT is itself usually an echo: gloo and NCCL processes abort (std::terminate)
    when a peer's connection resets, so a rank that died of another signal is preferred. So is SIGTERM:
    it is what the agent (or torch's) sends the survivors once a rank has failed, and on a busy host a
    survivor stopped that way can end before its exit code is read.
    """
    failed = sorted(exit_codes)
    signalled = [r for r in failed if exit_codes[r] < 0]
    echoes = (-signal.SIGABRT, -signal.SIGTERM)
    primary = [r for r in signalled if exit_codes[r] not in echoes]
    return (primary or signalled or failed), ("crash" if signalled else "exit")


def exit_words(code: int) -> str:
    """An exit code as people say it: ``killed by SIGKILL`` for a negative (signal) code, ``exit code 1`` else."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def crash_detail(exit_codes: Mapping[int, int]) -> str:
    """One line naming how each ended rank ended, e.g. ``rank 1 killed by SIGKILL, rank 0 exit code 1``."""
    return ", ".join(f"rank {r} {exit_words(exit_codes[r])}" for r in sorted(exit_codes))


def unexplained_crash_note(exit_codes: Mapping[int, int], culprits: Iterable[int]) -> str:
    """What to say when the culprits' logs name no cause: a SIGKILL from outside leaves no error behind.

    Empty when a culprit did not die of SIGKILL (its own error, if any, is what the logs are searched for).
    """
    killed = [r for r in culprits if exit_codes.get(r) == -signal.SIGKILL]
    if not killed:
        return ""
    return (f"; rank {', '.join(map(str, killed))} died of SIGKILL with no error in its log: something outside "
            f"the job ended it (the kernel's OOM killer, the scheduler, an operator); see the host's kernel log")


# --- hangs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HangFacts:
    """What the agent knows about the ranks of a hung attempt."""

    world_size: int
    """Ranks in the job (all nodes)."""
    enqueued: Mapping[int, int] = field(default_factory=dict)
    """Collectives enqueued on the default group per rank, from the dumps that could be read."""
    unreadable: Mapping[int, str] = field(default_factory=dict)
    """Ranks whose dump exists but could not be read, with the reason."""
    stopped: tuple[int, ...] = ()
    """Ranks whose process is stopped (state T/t): SIGSTOP, a debugger, a job-control stop."""
    unanswered: tuple[int, ...] = ()
    """Live ranks (not stopped) whose control thread did not answer the evidence request."""
    stale: tuple[int, ...] = ()
    """Ranks whose heartbeat background thread stopped writing (process frozen)."""
    steps: Mapping[int, int] = field(default_factory=dict)
    """Last completed step per rank known to the agent."""


@dataclass(frozen=True)
class Blame:
    """Culprits of a failure and why."""

    culprits: tuple[int, ...]
    """Ranks blamed, sorted; empty when no rule singles any out."""
    explanation: str
    """One or more sentences for the Diagnosis record."""
    rule: str
    """Which rule decided: ``stopped``, ``frozen``, ``enqueued``, ``no-dump``, ``steps`` or ``none``."""


def _ranks(ranks: Iterable[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def hang_culprits(facts: HangFacts) -> Blame:
    """The rank(s) the others wait for.

    In order: ranks whose process is stopped (a stopped rank cannot reach the collective the others wait
    in, and its silence on the control socket is itself the signal); live ranks that are frozen (no answer
    from the control thread, or a stale heartbeat) while others answered; ranks whose flight recorder
    enqueued fewer collectives than the others (they never reached the collective the rest wait in);
    ranks that gave no dump while every other did; the rank(s) with the fewest completed steps.
    """
    notes: list[str] = []
    if facts.unreadable:
        notes.append("unreadable dump(s): " + "; ".join(f"rank {r}: {why}" for r, why in
                                                         sorted(facts.unreadable.items())))
    gap = _enqueued_gap(facts.enqueued)

    def done(culprits: Iterable[int], sentence: str, rule: str) -> Blame:
        text = " ".join([sentence, *(f"({n})" for n in notes)])
        return Blame(tuple(sorted(set(culprits))), text, rule)

    if facts.stopped:
        sentence = (f"rank(s) {_ranks(facts.stopped)} stopped (process state T: SIGSTOP, a debugger or job "
                    "control) and their control thread could not answer; a stopped rank cannot reach the "
                    "collective the others wait in, so it is itself the culprit")
        if gap:
            sentence += f"; its peers' flight recorders agree: {gap[1]}"
        return done(facts.stopped, sentence, "stopped")
    frozen = sorted(set(facts.unanswered) | set(facts.stale))
    answered = set(facts.enqueued) | set(facts.unreadable)
    if frozen and (answered or len(frozen) < facts.world_size):
        parts = []
        if facts.unanswered:
            parts.append(f"rank(s) {_ranks(facts.unanswered)} did not answer the evidence request")
        if facts.stale:
            parts.append(f"rank(s) {_ranks(facts.stale)} stopped refreshing their heartbeat")
        sentence = (" and ".join(parts) + " while the others answered: a process that cannot answer is "
                    "frozen, which is itself a culprit signal")
        return done(frozen, sentence, "frozen")
    if gap:
        return done(gap[0], gap[1], "enqueued")
    missing = sorted(set(range(facts.world_size)) - answered) if facts.world_size else []
    if facts.enqueued and missing:
        top = max(facts.enqueued.values())
        return done(missing, f"rank(s) {_ranks(missing)} gave no dump while the others wait in collective {top}",
                    "no-dump")
    if facts.steps and max(facts.steps.values()) > min(facts.steps.values()):
        low = min(facts.steps.values())
        behind = [r for r, s in facts.steps.items() if s == low]
        return done(behind, f"rank(s) {_ranks(behind)} completed fewer steps ({low}) than the others", "steps")
    if facts.world_size == 1:  # the only rank stopped making progress: nobody else to wait for
        return done([0], "rank 0, the only rank, made no progress", "steps")
    return done((), "no rank is behind the others", "none")


def _enqueued_gap(enqueued: Mapping[int, int]) -> tuple[list[int], str] | None:
    if not enqueued or max(enqueued.values()) == min(enqueued.values()):
        return None
    top = max(enqueued.values())
    behind = sorted(r for r, s in enqueued.items() if s < top)
    return behind, f"rank(s) {_ranks(behind)} enqueued fewer collectives than the others ({top})"


# --- reading flight-recorder summaries ----------------------------------------------------------------


def default_group_enqueued(pg_status: Mapping[str, Mapping[str, int]]) -> int:
    """Last collective enqueued on the default group (id ``0``), else the highest over all groups; -1 if none."""
    if "0" in pg_status:
        return int(pg_status["0"].get("last_enqueued_collective", -1))
    seqs = [int(v.get("last_enqueued_collective", -1)) for v in pg_status.values()]
    return max(seqs) if seqs else -1


def default_group_collectives(entries: Iterable[Any], pg_status: Mapping[str, Mapping[str, int]]) -> int:
    """Sequence number of the last collective a rank enqueued on the default group.

    Read from the flight recorder's entries (``collective_seq_id`` of non-p2p entries of group 0): on gloo
    the ``pg_status`` counters are op ids that also count sends and receives, so in a pipeline they differ
    between ranks that are all in step. Falls back to `default_group_enqueued` when no entry says.
    """
    top = -1
    for entry in entries:
        if isinstance(entry, dict) and not entry.get("is_p2p") and str(entry.get("pg_id")) == "0":
            seq = entry.get("collective_seq_id")
            if isinstance(seq, int) and not isinstance(seq, bool):
                top = max(top, seq)
    return top if top >= 0 else default_group_enqueued(pg_status)


def backend_of(entries: Iterable[Any]) -> str | None:
    """The communication backend named by a dump's entries (``gloo:all_reduce`` -> ``gloo``), if any."""
    for entry in entries:
        if isinstance(entry, dict):
            name = entry.get("profiling_name")
            if isinstance(name, str) and ":" in name:
                return name.split(":", 1)[0].lower()
    return None
