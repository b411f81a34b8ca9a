"""`diagnose_path`: find the dumps, stream them through the matcher, and build the report."""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from trainguard.errors import InputError, TrainguardError
from trainguard.localize.match import Matcher
from trainguard.localize.membership import common_cause, infer_members
from trainguard.localize.model import FileWarning, LocalizationReport, Problem
from trainguard.localize.observed import read_observed
from trainguard.localize.problems import Context
from trainguard.localize.reader import (
    MAX_RANK,
    Dump,
    DumpError,
    check_rank,
    find_dump_files,
    rank_from_name,
    read_dump,
    read_regular_file,
)
from trainguard.localize.verdicts import Gap, group_problems, missing_records, order_problems

log = logging.getLogger(__name__)

_ATTEMPT = re.compile(r"^attempt-(\d+)$")
_MAX_RANK_WARNINGS = 20
_MAX_RANK_MAP_BYTES = 64 * 1024**2
_EVIDENCE_TAIL_BYTES = 64 * 1024
"""Only the end of a stacks / log-tail file is read: its last lines are what the report shows."""


def load_rank_map(path: str | Path) -> dict[int, str]:
    """A rank-map file: JSON ``{"0": "host-a", "1": "host-a", ...}``. Raises `InputError` when bad."""
    p = Path(path)
    try:
        data = json.loads(read_regular_file(p, _MAX_RANK_MAP_BYTES))
    except DumpError as exc:
        raise InputError(f"{p}: cannot read rank map: {exc}") from None
    except (UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise InputError(f"{p}: rank map is not JSON ({str(exc)[:200]})") from None
    if not isinstance(data, dict):
        raise InputError(f"{p}: rank map must be a JSON object {{rank: host}}")
    out: dict[int, str] = {}
    for k, v in data.items():
        try:
            rank = int(k) if len(k) <= 20 else -1
        except ValueError:
            raise InputError(f"{p}: rank map key {k[:40]!r} is not a rank number") from None
        if not isinstance(v, str) or not 0 <= rank <= MAX_RANK:
            raise InputError(f"{p}: rank map entry {k[:40]!r} must map a rank from 0 to {MAX_RANK} to a host name")
        out[rank] = v
    return out


def _run_root(p: Path) -> tuple[Path | None, int | None, Path]:
    """(run dir, attempt, directory holding the dumps) for a run dir, its attempt dir, or any dir."""
    if (p / "events").is_dir():
        diag = p / "diagnostics"
        attempts = sorted(
            (int(m.group(1)), d) for d in (diag.iterdir() if diag.is_dir() else [])
            if not d.is_symlink() and d.is_dir() and (m := _ATTEMPT.match(d.name))
        )
        for k, d in reversed(attempts):
            if find_dump_files(d):
                return p, k, d
        raise InputError(f"{p}: run directory without flight-recorder dumps in diagnostics/attempt-*/")
    m = _ATTEMPT.match(p.name)
    if m and p.parent.name == "diagnostics" and (p.parent.parent / "events").is_dir():
        return p.parent.parent, int(m.group(1)), p
    return None, None, p


def _from_events(root: Path, attempt: int | None, warnings: list[FileWarning]) -> tuple[dict[int, str], int]:
    """Rank -> host and the world size of ``attempt`` from the run's event records."""
    from trainguard.core.rundir import RunDir  # light: no torch

    hosts: dict[int, str] = {}
    other: dict[int, str] = {}
    world = 0
    try:
        loaded = RunDir(root).load()
    except TrainguardError as exc:
        warnings.append(FileWarning(str(root / "events"), f"rank-to-host map unavailable: {exc}"))
        return {}, 0
    for le in loaded:
        rec = le.record
        rank = getattr(rec, "rank", None)
        rec_attempt = getattr(rec, "attempt", None)
        if rec.TYPE == "attempt_started" and rec_attempt == attempt:
            claimed = getattr(rec, "world_size", 0)
            if isinstance(claimed, int) and 0 < claimed <= MAX_RANK + 1:
                world = max(world, claimed)
            elif claimed:
                warnings.append(FileWarning(str(root / "events"), f"world size {claimed} of attempt {attempt} "
                                            f"ignored (above {MAX_RANK + 1})"))
        if isinstance(rank, int) and 0 <= rank <= MAX_RANK and rec.host:
            (hosts if attempt is None or rec_attempt == attempt else other)[rank] = rec.host
    return {**other, **hosts}, world


def _evidence_files(directory: Path | None) -> Callable[[int], tuple[str, ...]]:
    def find(rank: int) -> tuple[str, ...]:
        if directory is None:
            return ()
        out = []
        for name in (f"stacks_rank_{rank}.txt", f"log_tail_rank_{rank}.txt"):
            p = directory / name
            if not os.path.lexists(p):
                continue
            try:
                # never through a link (it could point anywhere), never blocking on a FIFO
                text = read_regular_file(p, _EVIDENCE_TAIL_BYTES, tail=True).decode(errors="replace")
            except DumpError as exc:
                out.append(f"{p}: not read ({exc})")
                continue
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            tail = " | ".join(lines[-3:])
            out.append(f"{p}: {tail}" if tail else str(p))
        return tuple(out)

    return find


def analyze(
    dumps: Iterable[Dump | FileWarning],
    *,
    rank_hosts: dict[int, str] | None = None,
    world_size: int = 0,
    directory: Path | None = None,
    path: str = "",
    warnings: list[FileWarning] | None = None,
) -> LocalizationReport:
    """Match a stream of dumps (one at a time; each is dropped after matching) and give the verdict."""
    gc_was_enabled = gc.isenabled()
    gc.disable()  # reading builds millions of short-lived containers; cyclic GC passes only cost time
    try:
        return _analyze(dumps, rank_hosts=rank_hosts, world_size=world_size, directory=directory,
                        path=path, warnings=warnings)
    finally:
        if gc_was_enabled:
            gc.enable()


def _analyze(
    dumps: Iterable[Dump | FileWarning],
    *,
    rank_hosts: dict[int, str] | None,
    world_size: int,
    directory: Path | None,
    path: str,
    warnings: list[FileWarning] | None,
) -> LocalizationReport:
    t0 = time.perf_counter()
    warnings = list(warnings or [])
    matcher, versions, candidates = _match_all(dumps, warnings)
    if not matcher.ranks:
        reasons = "; ".join(f"{w.file}: {w.message}" for w in warnings[:3])
        raise InputError(f"{path or 'input'}: no valid flight-recorder dump among {candidates} file(s)"
                         + (f" ({reasons})" if reasons else ""))
    counts = Counter(v for v, _ in versions.values())
    warnings.extend(_mixed_version_warnings(versions, counts))
    # Ranks are capped at MAX_RANK wherever they come from, so the expected world stays bounded.
    hosts = {r: h for r, h in (rank_hosts or {}).items() if 0 <= r <= MAX_RANK}
    if world_size > MAX_RANK + 1:
        warnings.append(FileWarning("world size", f"{world_size} ignored (above {MAX_RANK + 1})"))
        world_size = 0
    unreadable = frozenset(w.rank for w in warnings if w.rank is not None) - matcher.ranks
    world = (set(matcher.ranks) | set(range(max(matcher.ranks | unreadable) + 1)) | set(hosts)
             | set(range(world_size)))
    seen = read_observed(directory)
    ctx = Context(world=frozenset(world), dumped=frozenset(matcher.ranks), unreadable=unreadable,
                  empty=frozenset(matcher.empty_ranks), hosts=hosts, evidence_files=_evidence_files(directory),
                  stopped=seen.stopped if seen else frozenset(), unanswered=seen.unanswered if seen else frozenset())
    notes: list[Gap] = []
    inferred = infer_members(matcher, ctx.world)
    problems = order_problems(common_cause(group_problems(matcher, ctx, notes, inferred), matcher, ctx.dumped,
                                           hosts))
    records, decisive = missing_records(ctx, notes)
    if not problems and unreadable:
        problems = [_incomplete(sorted(unreadable), warnings, hosts, records)]
    elif not problems and decisive:
        # Nothing recorded shows a problem, but what is not recorded could: say so rather than "healthy".
        problems = [_insufficient(records, sorted(matcher.empty_ranks), hosts, bool(matcher.groups))]
    missing = sorted(world - matcher.ranks)
    warnings.extend(_missing_rank_warnings(missing, unreadable))
    backend = next(iter(matcher.backends)) if len(matcher.backends) == 1 else (
        "mixed" if matcher.backends else "unknown")
    if problems:
        top = problems[0]
        text = top.explanation
        if unreadable and "could not be read" not in text:
            text += f" {_unreadable_sentence(sorted(unreadable))}"
        report = LocalizationReport(
            verdict=top.verdict, process_group=top.process_group or None, collective_seq=top.collective_seq,
            op=top.op or None, culprit_ranks=top.culprit_ranks, culprit_hosts=top.culprit_hosts,
            explanation=text, problems=tuple(problems), warnings=tuple(warnings),
            ranks_analyzed=tuple(sorted(matcher.ranks)), missing_ranks=tuple(missing), backend=backend,
            format_versions=tuple(sorted(counts)), path=path, seconds=time.perf_counter() - t0,
            unreadable_ranks=tuple(sorted(unreadable)), missing_records=tuple(records),
        )
    else:
        report = LocalizationReport(
            verdict="healthy", process_group=None, collective_seq=None, op=None, culprit_ranks=(),
            culprit_hosts=(), explanation=_healthy_text(matcher), problems=(), warnings=tuple(warnings),
            ranks_analyzed=tuple(sorted(matcher.ranks)), missing_ranks=tuple(missing), backend=backend,
            format_versions=tuple(sorted(counts)), path=path, seconds=time.perf_counter() - t0,
            missing_records=tuple(records),
        )
    return report


def _match_all(dumps: Iterable[Dump | FileWarning],
               warnings: list[FileWarning]) -> tuple[Matcher, dict[int, tuple[str, str]], int]:
    """Feed every readable dump to a matcher, one in memory at a time; the rest become warnings.
    Also: each rank's (format version, file name), and how many candidate files there were."""
    matcher = Matcher()
    versions: dict[int, tuple[str, str]] = {}
    candidates = 0
    for d in dumps:
        candidates += 1
        if isinstance(d, FileWarning):
            warnings.append(d)
            continue
        if d.rank in matcher.ranks:
            warnings.append(FileWarning(d.path.name, f"second dump for rank {d.rank}; ignored"))
            continue
        for note in d.fmt.notes:
            warnings.append(FileWarning(d.path.name, note))
        try:
            matcher.add(d)
        except DumpError as exc:  # wrong-typed fields: the rank is unreadable, the rest is analysed
            warnings.append(FileWarning(d.path.name, str(exc), d.rank))
            del d
            continue
        versions[d.rank] = (d.fmt.version, d.path.name)
        del d  # free this dump before the next one is read: one dump in memory at a time
    matcher.finish()
    return matcher, versions, candidates


def _mixed_version_warnings(versions: dict[int, tuple[str, str]], counts: Counter[str]) -> list[FileWarning]:
    """One warning per rank whose dump format differs from most ranks' (mixed torch versions)."""
    if len(counts) <= 1:
        return []
    common = counts.most_common(1)[0][0]
    return [FileWarning(name, f"rank {rank} wrote format {v or '?'} but most ranks "
                              f"wrote {common}: mixed torch versions; analysed anyway")
            for rank, (v, name) in sorted(versions.items()) if v != common]


def _missing_rank_warnings(missing: list[int], unreadable: frozenset[int]) -> list[FileWarning]:
    out = [FileWarning(f"rank {r}", "no dump for this rank (expected from the other ranks, "
                                    "the rank map or the run's events)")
           for r in [r for r in missing if r not in unreadable][:_MAX_RANK_WARNINGS]]
    if len(missing) > _MAX_RANK_WARNINGS:
        out.append(FileWarning("ranks", f"{len(missing) - _MAX_RANK_WARNINGS} more ranks without a dump"))
    return out


def _healthy_text(matcher: Matcher) -> str:
    text = (f"{len(matcher.ranks)} rank(s), {len(matcher.groups)} process group(s): every collective matched "
            "across ranks and none is stuck.")
    if "gloo" in matcher.backends:
        text += (" (gloo records no send/recv: a hang in point-to-point ops of a group without recorded "
                 "collectives would not show here.)")
    return text


def _unreadable_sentence(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    return (f"Rank{'s' if len(ranks) > 1 else ''} {shown} could not be read (unreadable dump, see the "
            "warnings): state unknown.")


def _host_list(ranks: list[int], hosts: dict[int, str]) -> tuple[str, ...]:
    out: list[str] = []
    for r in ranks:
        h = hosts.get(r)
        if h and h not in out:
            out.append(h)
    return tuple(out)


def _insufficient(records: list[str], empty: list[int], hosts: dict[int, str], recorded: bool) -> Problem:
    """No problem in what the dumps record, but they lack records that could show one."""
    text = (("Every recorded collective matched across ranks and none is stuck, but the dumps lack records "
             "that could show a problem: " if recorded else "The dumps record no collective at all: ")
            + f"{'; '.join(records[:3])}. Whether the job is healthy cannot be told from them: check the "
            "ranks' stacks (stacks_rank_<r>.txt)"
            + (", or gather dumps with the recorder on (TORCH_FR_BUFFER_SIZE > 0)." if empty else
               ": a rank blocked in a send or receive shows there."))
    return Problem(
        verdict="insufficient-evidence", process_group="", process_group_desc="", group_ranks=(),
        collective_seq=None, op="", culprit_ranks=tuple(empty), culprit_hosts=_host_list(empty, hosts),
        waiting_ranks=(), consequence_ranks=(), explanation=text, confidence=0.5,
        missing_records=tuple(records),
    )


def _incomplete(ranks: list[int], warnings: list[FileWarning], hosts: dict[int, str],
                records: list[str]) -> Problem:
    """No problem among the readable dumps, but some ranks are unknown: health is not established."""
    reasons = [f"{w.file}: {w.message}" for w in warnings if w.rank in ranks][:2]
    text = (f"The readable dumps show no problem, but {_unreadable_sentence(ranks)[:-len(' state unknown.')]} "
            f"({'; '.join(reasons)}). Whether the job is healthy cannot be told: "
            f"{'those ranks are' if len(ranks) > 1 else 'that rank is'} the suspect"
            f"{'s' if len(ranks) > 1 else ''}; check {'their' if len(ranks) > 1 else 'its'} logs and stacks, or "
            "gather the dumps again.")
    return Problem(
        verdict="incomplete", process_group="", process_group_desc="", group_ranks=(), collective_seq=None,
        op="", culprit_ranks=tuple(ranks), culprit_hosts=_host_list(ranks, hosts), waiting_ranks=(),
        consequence_ranks=(), explanation=text, confidence=0.5, missing_records=tuple(records),
    )


def _read_all(files: dict[int, list[Path]], progress: Callable[[int, int], None] | None,
              ) -> Iterable[Dump | FileWarning]:
    """Each rank's first candidate file that reads as a dump; a warning per rejected candidate."""
    total = len(files)
    for done, rank in enumerate(sorted(files), 1):
        failed: list[FileWarning] = []
        dump: Dump | None = None
        for p in files[rank]:
            try:
                dump = read_dump(p, rank)
                break
            except DumpError as exc:
                failed.append(FileWarning(p.name, str(exc)))
        # rejected files are worth a warning only when they were meant as dumps
        if dump is None:
            failed = [FileWarning(w.file, w.message, rank) for w in failed]
        yield from (w for w in failed if dump is None or w.file.endswith((".pkl", ".pickle", ".json")))
        if dump is not None:
            yield dump
        if progress is not None:
            progress(done, total)


class NoDumpsError(InputError):
    """The path holds no flight-recorder dump (the CLI then reads its text logs instead)."""


def diagnose_path(
    path: str | Path,
    rank_hosts: dict[int, str] | None = None,
    *,
    world_size: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> LocalizationReport:
    """Localize a hang or desync from the dumps in ``path``.

    ``path``: a directory of dumps (rank = the file name's trailing number), one dump file, a run
    directory (its newest ``diagnostics/attempt-<k>/`` with dumps) or such an attempt directory. Hosts
    come from ``rank_hosts``, else from the run's events. Raises `InputError` when nothing is readable,
    `NoDumpsError` when ``path`` holds no dump at all.
    """
    p = Path(path)
    if not os.path.lexists(p):
        raise InputError(f"{p}: no such file or directory")
    warnings: list[FileWarning] = []
    if not p.is_dir():
        rank = rank_from_name(p.name)
        if rank is None:
            raise NoDumpsError(f"{p}: no rank in the file name (expected a trailing number, e.g. fr_trace_rank_3)")
        try:
            check_rank(rank, "the file name")
        except DumpError as exc:
            raise InputError(f"{p}: {exc}") from None
        files, directory, root, attempt = {rank: [p]}, p.parent, None, None
    else:
        root, attempt, directory = _run_root(p)
        refused: list[tuple[str, str]] = []
        try:
            files = find_dump_files(directory, refused)
        except OSError as exc:
            raise InputError(f"{directory}: cannot list: {exc.strerror or exc}") from None
        warnings.extend(FileWarning(name, reason) for name, reason in refused[:_MAX_RANK_WARNINGS])
        if not files:
            why = f" ({refused[0][0]}: {refused[0][1]})" if refused else ""
            raise NoDumpsError(f"{directory}: no flight-recorder dumps (expected files named <prefix><rank>, "
                             f"e.g. fr_trace_rank_0.pkl){why}")
    hosts: dict[int, str] = {}
    if root is not None:
        hosts, events_world = _from_events(root, attempt, warnings)
        world_size = max(world_size, events_world)
    hosts.update(rank_hosts or {})
    return analyze(_read_all(files, progress), rank_hosts=hosts, world_size=world_size,
                   directory=directory, path=str(p), warnings=warnings)
