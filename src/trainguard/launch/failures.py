"""The agent's failure path: evidence to gather, who is to blame for a hang, the root-cause category, and
the ``FailureDetected``/``Diagnosis`` records written by the one agent that claims a failure.

`trainguard.launch.agent.GuardAgent` decides *when* a failure happened; this module says what it was.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch.distributed.elastic.agent.server.api import WorkerGroup

from trainguard.core.events import Diagnosis, Event, FailureDetected
from trainguard.core.protocol import RunLayout
from trainguard.health import drain
from trainguard.launch import blame, evidence, nodes
from trainguard.launch.config import SupervisorConfig
from trainguard.launch.store_auth import StoreSigner
from trainguard.launch.watchdog import Verdict

if TYPE_CHECKING:
    from trainguard.classify import LinkReport

log = logging.getLogger(__name__)

DUMP_WAIT_SECONDS = 3.0
"""How long the node recording a hang waits for other nodes' dumps in a shared diagnostics folder."""
_HANG_VERDICTS = ("hang", "p2p-hang")


def latest_checkpoint(directory: Path) -> int | None:
    """Newest committed checkpoint step (manifest present; verification happens in the workers' restore)."""
    from trainguard.checkpoint import latest_step

    step = latest_step(directory)
    return int(step) if step is not None else None


# --- evidence -------------------------------------------------------------------------------------------


def live_ranks(wg: WorkerGroup, exclude: set[int]) -> dict[int, int]:
    """Global rank -> pid of the local workers still alive (those in ``exclude`` left out)."""
    live = {}
    for w in wg.workers:
        if w.global_rank in exclude or w.id is None:
            continue
        try:
            os.kill(int(w.id), 0)
            live[w.global_rank] = int(w.id)
        except (OSError, ValueError):
            pass
    return live


def rank_logs(layout: RunLayout, attempt: int, wg: WorkerGroup) -> dict[int, list[Path]]:
    """Global rank -> the log files of the local workers in ``attempt``."""
    return {w.global_rank: [layout.rank_log(attempt, w.global_rank), layout.rank_stdout(attempt, w.global_rank)]
            for w in wg.workers}


def wait_for_peer_dumps(diag_dir: Path, local_ranks: int, world: int) -> None:
    if local_ranks >= world:
        return  # every rank is local: nothing else will arrive
    deadline = time.monotonic() + DUMP_WAIT_SECONDS
    while len(list(diag_dir.glob("fr_trace_rank_*.pkl"))) < world and time.monotonic() < deadline:
        time.sleep(0.2)


# --- blame for a hang -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HangFinding:
    """Who the supervisor blames for a hang, and what the diagnosis says."""

    culprits: list[int]
    """The ranks ``FailureDetected`` names."""
    explanation: str
    verdict: str
    """``hang``, or localization's verdict when it agrees with the supervisor's evidence."""
    diagnosis_ranks: list[int]
    diagnosis_explanation: str
    backend: str | None


def hang_finding(ev: evidence.GatheredEvidence, verdict: Verdict, world: int, layout: RunLayout,
                 attempt: int) -> HangFinding:
    """Blame from the dumps in ``ev.directory``, the ranks' replies and the watchdog's verdict."""
    dumps = evidence.read_dumps(ev.directory)
    # Replies are checked when read (`trainguard.worker.control.parse_reply`); a step of another type is ignored.
    steps = {r: rep["step"] for r, rep in ev.replies.items() if type(rep.get("step")) is int}
    for r, s in verdict.last_steps.items():
        steps.setdefault(r, s)
    found = blame.hang_culprits(blame.HangFacts(
        world_size=world, enqueued=dumps.enqueued, unreadable=dumps.unreadable, stopped=tuple(ev.stopped),
        unanswered=tuple(ev.unanswered), stale=verdict.stale_ranks, steps=steps))
    culprits, explanation = list(found.culprits), found.explanation
    verdict_name, diag_culprits, diag_explanation = "hang", culprits, explanation
    loc = evidence.localize(ev.directory, layout.rank_nodes(attempt)) if dumps.enqueued else None
    agrees = loc is not None and loc["verdict"] == "hang" and sorted(loc["culprit_ranks"]) == culprits
    if loc is not None and (found.rule in ("enqueued", "no-dump", "steps", "none") or agrees) and (
            not culprits or sorted(loc["culprit_ranks"]) == culprits):
        verdict_name, diag_culprits = loc["verdict"], loc["culprit_ranks"]
        diag_explanation = loc["explanation"]
        culprits = culprits or diag_culprits
    elif loc is not None:
        # The supervisor's own evidence (a stopped or frozen rank, or one short of the collective the
        # others wait in) decides; a different localization finding is kept as context.
        diag_explanation = f"{explanation}; localization said {loc['verdict']}: {loc['explanation']}"
    return HangFinding(culprits, explanation, verdict_name, diag_culprits, diag_explanation, dumps.backend)


# --- classification and records -------------------------------------------------------------------------


@dataclass(frozen=True)
class Classified:
    """The root cause of one failure, from the culprits' log tails."""

    category: str
    group: str
    confidence: float
    lines: tuple[str, ...]
    """The evidence lines themselves (the fleet database reads XID codes from them)."""
    note: str
    """Appended to the diagnosis' explanation: what limited the finding, the link it points to."""
    cause: str = ""
    """The classifier's one-line reason for the category ("a Python package is missing: numpy")."""


def classify(ev: evidence.GatheredEvidence, ranks: list[int], verdict: str, backend: str | None,
             attempt: int) -> Classified:
    """The category of a failure from the culprits' log tails (Unknown when classification fails)."""
    note = ""
    given: str | None = verdict
    if verdict in _HANG_VERDICTS and backend != "nccl":
        # classify maps a hang verdict to "NCCL Watchdog Timeouts"; without NCCL evidence (a gloo job,
        # or no dump at all) that would be a guess presented as a finding, so only the logs decide.
        given = None
        note = f" (hang on {backend or 'an unknown backend'}: no NCCL evidence, category from logs only)"
    try:
        from trainguard.classify import classify_text

        text = "".join((ev.directory / f"log_tail_rank_{r}.txt").read_text() for r in ranks
                       if (ev.directory / f"log_tail_rank_{r}.txt").exists())
        c = classify_text(text, f"attempt-{attempt}", verdict=given)
        # The evidence lines themselves (not only file paths): the fleet database reads XID codes from them.
        lines = c.evidence_strings()
        links = _links(ev)
        if links is not None:  # every rank's tail: the failing pairs of all ranks locate a link
            if links.shared is not None:
                note += (f"; link: {links.shared.kind} {links.shared.name} in {links.shared.pairs} of "
                         f"{links.fatal_pairs} failing pair(s) (confidence {links.shared.confidence:.2f})")
            lines = (*lines, *links.evidence_strings())
        cause = c.explanation if c.category != "Unknown" else ""
        return Classified(c.category, c.group, float(c.confidence), lines, note, cause)
    except Exception as exc:  # classification must never stand in the way of recovery
        log.warning("classification of attempt %d failed: %s", attempt, exc)
        return Classified("Unknown", "Unknown", 0.0, (), note)


def _links(ev: evidence.GatheredEvidence) -> LinkReport | None:
    """Link localization over every rank's log tail of the failure (not only the culprits')."""
    from trainguard.classify import classify_paths

    tails = sorted(ev.directory.glob("log_tail_rank_*.txt"))
    return classify_paths(tails, combine=True)[0].links if tails else None


class FailureRecorder:
    """Writes this node's failure records, and keeps the ``FailureDetected`` ones for the run's result."""

    def __init__(self, cfg: SupervisorConfig, emit: Callable[[Event], None], store: Callable[[], Any],
                 signer: StoreSigner) -> None:
        self.cfg = cfg
        self.emit = emit
        self.store = store
        """The rendezvous store (None before the first rendezvous): where nodes claim a failure."""
        self.signer = signer
        """Names the claim keys: only the job's agents can name (and so pre-claim) one."""
        self.failures: list[FailureDetected] = []

    def hosts_of(self, attempt: int, ranks: list[int]) -> tuple[str, ...]:
        where = self.cfg.layout.rank_nodes(attempt)
        return tuple(sorted({where.get(r, self.cfg.node_id) for r in ranks}))

    def claim(self, attempt: int) -> bool:
        """Only one node records a failure that several nodes see."""
        store = self.store()
        if store is None:
            return True
        try:
            return int(store.add(self._claim_key(attempt), 1)) == 1  # add, not compare_set: etcd's store has only add
        except Exception:
            return True

    def _claim_key(self, attempt: int) -> str:
        return self.signer.claim_key(f"trainguard/{self.cfg.run_id}/failure/{attempt}")

    def _rejoin_key(self, attempt: int) -> str:
        return f"trainguard/{self.cfg.run_id}/membership/{attempt}"

    def announce_rejoin(self, attempt: int, reason: str) -> bool:
        """This node restarts ``attempt`` because a node waits to join (torch's membership change): told to the
        peers before our workers stop, so that theirs failing for it is no failure. False when a peer already
        claimed the attempt's failure (the waiting node is that peer, back after its own failure) or the store
        cannot be written: then the restart is that failure's."""
        store = self.store()
        if store is None:
            return False
        try:
            if store.check([self._claim_key(attempt)]):
                return False
            key = self._rejoin_key(attempt)
            store.set(key, self.signer.sign(key, {"reason": reason}))
            return True
        except Exception as exc:  # the store going away: the restart is counted as before
            log.debug("membership change of attempt %d not announced: %s", attempt, exc)
            return False

    def rejoin_announced(self, attempt: int) -> str | None:
        """Why a peer restarted ``attempt`` for a node waiting to join (`announce_rejoin`), or None."""
        store = self.store()
        if store is None:
            return None
        key = self._rejoin_key(attempt)
        try:
            if not store.check([key]):
                return None
            raw = bytes(store.get(key))
        except Exception as exc:
            log.debug("membership announcement of attempt %d unreadable: %s", attempt, exc)
            return None
        fields = self.signer.verify(key, raw, ("reason",))
        return fields["reason"] if fields is not None else None

    def add(self, failure: FailureDetected, *others: Event) -> None:
        """Keep ``failure`` and write it and the records that go with it."""
        self.failures.append(failure)
        for record in (failure, *others):
            self.emit(record)

    def record(self, attempt: int, kind: str, ranks: list[int], latency: float, wall: float, step: int | None,
               ev: evidence.GatheredEvidence, detail: str, *, verdict: str, explanation: str,
               diagnosis_ranks: list[int] | None = None, backend: str | None = None, if_unknown: str = "",
               latency_from: str = "") -> None:
        """``FailureDetected`` and a classified ``Diagnosis`` of a crash or hang (the caller claimed it)."""
        record = FailureDetected(time=wall, host=self.cfg.node_id, attempt=attempt, kind=kind,
                                 ranks=tuple(ranks), hosts=self.hosts_of(attempt, ranks),
                                 detection_latency_seconds=max(0.0, latency), latency_from=latency_from, step=step,
                                 evidence=tuple(ev.files), detail=detail)
        self.add(record)
        found = classify(ev, ranks, verdict, backend, attempt)
        note = found.note + (if_unknown if found.category == "Unknown" else "")  # say why nothing was found
        blamed = list(ranks if diagnosis_ranks is None else diagnosis_ranks)
        diagnosis = Diagnosis(time=time.time(), host=self.cfg.node_id, attempt=attempt, category=found.category,
                              group=found.group, verdict=verdict, culprit_ranks=tuple(blamed),
                              culprit_hosts=self.hosts_of(attempt, blamed), confidence=found.confidence,
                              explanation=explanation + note, cause=found.cause, evidence=(*ev.files, *found.lines))
        self.emit(diagnosis)
        drain.after_diagnosis(self.cfg, diagnosis, self.emit)  # --drain-bad-nodes: a hardware root cause

    def record_node_lost(self, attempt: int, lost: list[nodes.LostNode], wall: float, step: int | None) -> None:
        """``FailureDetected`` (kind ``node-lost``), a ``Diagnosis``, and ``NodeExcluded`` for each lost node,
        by the one agent that claims the failure; the lost nodes' last beats and log tails become evidence."""
        if not self.claim(attempt):
            return
        # The lost-node markers decide too: with c10d the store that answers the claim may have died with the node.
        if not [n for n in lost if nodes.mark_lost(self.cfg.run_dir, n.node, f"recorded by {self.cfg.node_id} in "
                                                   f"attempt {attempt}")]:
            return
        failure, *others = nodes.lost_records(self.cfg.layout, self.cfg.node_id, attempt, lost, wall, step,
                                              self.cfg.node_lost_timeout_seconds)
        self.add(failure, *others)
        drain.after_lost(self.cfg, attempt, [n.node for n in lost], self.emit)  # --drain-bad-nodes


def preload_failure_path() -> None:
    """Import now what the first failure needs, not inside the restart's critical path."""
    for name in ("trainguard.classify", "trainguard.localize", "trainguard.checkpoint"):
        try:
            importlib.import_module(name)
        except ImportError as exc:  # e.g. google-re2 missing: failures are then recorded unclassified
            log.error("%s unavailable (%s): failures will be recorded without it", name, exc)
