"""What ``trainguard run`` and ``demo`` say on the console while a job runs: one line per detection,
diagnosis, exclusion and restart, read from the node agent's event file, and a summary at the end.

It follows ``events/agent-<node>.jsonl`` from a thread of the supervising process, so it needs
nothing from the agent but the records it writes anyway.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from trainguard.core.eventlog import EventFollower
from trainguard.core.events import AttemptStarted, Diagnosis, Event, FailureDetected, InProcessRecovery, NodeExcluded
from trainguard.report.inert import for_terminal

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
"""How often the event file is read: a line shows at most this long after the agent wrote it."""


_DOUBLE_PREFIX = re.compile(r"^(\[rank(\d+)\]: ?)\[rank\2\]: ?", re.MULTILINE)
"""A line that torch prefixed in the worker (``[rank1]: `` on tracebacks once a process group exists, and
``[rank1]:`` on its C++ warnings) and that the console prefix of the same rank is put in front of again."""


def collapse_rank_prefix(text: str) -> str:
    """``[rank0]: [rank0]: Traceback`` -> ``[rank0]: Traceback``, on every line of ``text``; other lines unchanged."""
    return _DOUBLE_PREFIX.sub(r"\1", text) if "]: [rank" in text or "]:[rank" in text else text


class RankPrefixFilter:
    """A text stream that passes everything on to ``stream`` with doubled rank prefixes collapsed.

    The workers' lines reach the console through torch's log tailing, which writes each line as one
    ``write`` of ``<prefix><line>`` to the supervisor's ``sys.stdout`` / ``sys.stderr``; torch in the
    worker has often prefixed the line with the same rank already. Stateless per call, so the tailing
    threads may write concurrently as they do to the stream itself.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(collapse_rank_prefix(text))

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def single_rank_prefixes() -> Iterator[None]:
    """While the workers run: ``sys.stdout`` and ``sys.stderr`` collapse doubled rank prefixes."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RankPrefixFilter(out), RankPrefixFilter(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def _ranks(ranks: tuple[int, ...] | list[int]) -> str:
    if not ranks:
        return "no rank singled out"
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in ranks)


def _latency(record: FailureDetected) -> str:
    """The detection latency and what it is counted from (`FailureDetected.latency_from`)."""
    seconds = f"{record.detection_latency_seconds:.2f}s"
    if record.latency_from == "fault":
        return f"{seconds} after the injected fault"
    if record.latency_from == "last-progress":
        return f"{seconds} after the job's last progress (the fault's own time is unknown: an estimate)"
    return f"{seconds} after the last sign of life"


def _hosts(hosts: tuple[str, ...]) -> str:
    return f" on {'node' if len(hosts) == 1 else 'nodes'} {','.join(hosts)}" if hosts else ""


def _inprocess_line(record: InProcessRecovery) -> str:
    """How an in-process restart ended: the new group formed, or the agent fell back to restarting everyone."""
    replaced = f"{_ranks(record.ranks)} replaced" if record.ranks else "no rank replaced"
    warm = f" ({record.warm_spares_used} from warm spares)" if record.warm_spares_used else ""
    if record.status == "recovered":
        return (f"in-process restart of attempt {record.attempt} recovered in {record.seconds:.2f}s: "
                f"{replaced}{warm}")
    why = f": {record.detail}" if record.detail else ""
    return (f"in-process restart of attempt {record.attempt} gave up after {record.seconds:.2f}s{why}; "
            f"restarting every worker")


def run_ettr(run_dir: Path) -> float | None:
    """Effective training time ratio of the run from `trainguard.accounting.goodput`; None when it cannot be
    computed (no steps yet, a record it does not understand): the summary then says so."""
    return ettr_text_parts(run_dir)[0]


def ettr_text_parts(run_dir: Path) -> tuple[float | None, str]:
    """The run's ETTR, and what the summary adds when the lost progress is unknown (an attempt's resume point
    is: `trainguard.accounting.goodput.GoodputReport.lost_progress_unknown`), else ``""``."""
    try:
        from trainguard.accounting.goodput import compute_goodput

        report = compute_goodput(run_dir)
    except Exception as exc:  # an accounting problem must not turn a finished run into an error
        log.debug("goodput of %s: %s", run_dir, exc)
        return None, ""
    note = report.lost_progress_unknown
    if not note:
        return float(report.ettr), ""
    attempts = ",".join(str(a) for a in note["attempts"])
    return float(report.ettr), (f" (lost progress unknown: attempt {attempts} resumed from an unknown step; "
                                f"ETTR at least {note['ettr_min']:.3f}; see trainguard report)")


class Console:
    """Prints trainguard's lines for one node's run on ``stream`` (stderr), unless ``quiet``.
    Progress itself is the workers' own output, which torch streams with rank prefixes.
    """

    def __init__(self, cfg: Any, *, quiet: bool = False, stream: TextIO | None = None,
                 label: str = "trainguard") -> None:
        self.cfg = cfg
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stderr
        self.label = label
        self._follower = EventFollower(cfg.layout.agent_events(cfg.node_id))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainguard-console", daemon=True)
        self._lock = threading.Lock()

    # --- output ---------------------------------------------------------------------------------

    def line(self, text: str, *, always: bool = False) -> None:
        """One line ``<label>: text``; ``always``: even when quiet (errors). The text carries run data (failure
        details, host names, reasons), so it is made inert for the terminal first."""
        if self.quiet and not always:
            return
        with self._lock, contextlib.suppress(OSError, ValueError):  # a closed console must not stop the run
            self.stream.write(f"{self.label}: {for_terminal(text)}\n")
            self.stream.flush()

    def describe(self, record: Event) -> str | None:
        """The console line of one agent record, None for records that get none."""
        if isinstance(record, FailureDetected):
            where = f" after step {record.step}" if record.step is not None else " before the first step"
            detail = f" ({record.detail})" if record.detail else ""
            return (f"{record.kind} detected in attempt {record.attempt}{where}: {_ranks(record.ranks)}"
                    f"{_hosts(record.hosts)}, {_latency(record)}{detail}")
        if isinstance(record, Diagnosis):
            evidence = self.cfg.layout.diagnostics_dir(record.attempt)
            verdict = f"{record.verdict}, " if record.verdict else ""
            # "Unknown (confidence 0.00)" alone reads like a fault of the tool: say what was seen instead
            why = f" ({record.explanation})" if record.category == "Unknown" and record.explanation else ""
            cause = f": {record.cause}" if record.cause else ""  # the reason behind a known category, one clause
            return (f"diagnosis of attempt {record.attempt}: {verdict}culprit {_ranks(record.culprit_ranks)}"
                    f"{_hosts(record.culprit_hosts)}, category {record.category} "
                    f"(confidence {record.confidence:.2f}{cause}){why}; evidence in {evidence}")
        if isinstance(record, NodeExcluded):
            return f"node {record.node} excluded: {record.reason}"
        if isinstance(record, AttemptStarted) and record.attempt > 0:
            resume = (f"resuming from the checkpoint of step {record.resume_step}" if record.resume_step is not None
                      else "no trainguard checkpoint: the script resumes from its own, if it keeps one")
            how = "in-process restart" if record.recovery == "in-process" else "restart"
            warm = f" ({record.warm_starts} warm)" if record.warm_starts else ""
            return f"{how}: attempt {record.attempt} with {record.world_size} ranks{warm}, {resume}"
        if isinstance(record, InProcessRecovery):
            return _inprocess_line(record)
        return None

    # --- following the event file ----------------------------------------------------------------

    def poll(self) -> None:
        """Print the lines of the records written since the last poll."""
        for record in self._follower.new_records():
            text = self.describe(record)
            if text is not None:
                self.line(text)

    def _loop(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                self.poll()
            except Exception as exc:  # the console must never break the run it describes
                log.debug("console: %s", exc)

    def start(self) -> Console:
        if not self.quiet:
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following and print what the agent wrote last."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        if not self.quiet:
            with contextlib.suppress(Exception):
                self.poll()

    # --- the end ----------------------------------------------------------------------------------

    def summary(self, result: Any) -> None:
        """The closing lines: how it ended, steps, restarts, ETTR, and faults that never fired."""
        restarts = max(0, int(result.attempts) - 1)
        steps = "no step completed" if result.completed_steps is None else f"{result.completed_steps} steps"
        ettr, unknown = ettr_text_parts(self.cfg.run_dir) if not self.quiet else (None, "")
        ettr_text = f"ETTR {ettr:.3f}{unknown}" if ettr is not None else "ETTR n/a"
        text = (f"summary: {result.status} ({result.reason}); {steps}, {restarts} "
                f"restart{'s' if restarts != 1 else ''}, {ettr_text}; run dir {self.cfg.run_dir}")
        self.line(text, always=result.status not in ("completed",))
        unfired = tuple(getattr(result, "unfired_faults", ()))
        if unfired:
            self.line(f"never fired: {'; '.join(unfired)} (the job ended before their step or rank came up)",
                      always=True)

