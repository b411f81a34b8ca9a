"""The human-readable report: the verdict and top suspects first, then each problem with evidence."""

from __future__ import annotations

from trainguard.localize.model import LocalizationReport, Problem

_MAX_RANKS = 16


def _ranks(ranks: tuple[int, ...]) -> str:
    shown = ", ".join(str(r) for r in ranks[:_MAX_RANKS])
    return shown + (f" (+{len(ranks) - _MAX_RANKS} more)" if len(ranks) > _MAX_RANKS else "")


def _problem_lines(i: int, p: Problem, *, verbose: bool) -> list[str]:
    group = p.process_group + (f" ({p.process_group_desc})" if p.process_group_desc else "")
    seq = "unknown" if p.collective_seq is None else p.collective_seq
    where = f"in group {group}, seq {seq}, op {p.op}" if p.process_group else "(not tied to a group)"
    lines = [f"[{i + 1}] {p.verdict.upper()} {where}"]
    lines.append(f"    culprit ranks: {_ranks(p.culprit_ranks) or '(none identified)'}"
                 + (f"   hosts: {', '.join(p.culprit_hosts)}" if p.culprit_hosts else ""))
    if p.waiting_ranks:
        lines.append(f"    waiting ranks: {_ranks(p.waiting_ranks)}")
    if p.consequence_ranks:
        lines.append(f"    lost as a consequence: {_ranks(p.consequence_ranks)}")
    if p.blocked_by:
        lines.append(f"    explained by: {', '.join(f'[{j + 1}]' for j in p.blocked_by)}")
    lines.append(f"    {p.explanation}")
    for ev in p.evidence[: 6 if verbose else 3]:
        state = "completed" if ev.completed else ev.state or "?"
        lines.append(f"    - rank {ev.rank} record {ev.record_id}: {ev.profiling_name} seq {ev.seq} "
                     f"{state} in={ev.input_sizes} {ev.input_dtypes or ''}".rstrip())
        frames = [f for f in ev.frames if "/torch/" not in f] or list(ev.frames)
        for f in frames[: 6 if verbose else 2]:
            lines.append(f"        {f}")
    for f in p.evidence_files[: 4 if verbose else 2]:
        lines.append(f"    - {f[:300]}")
    for m in p.missing_records[: 8 if verbose else 3]:
        lines.append(f"    not recorded: {m}")
    return lines


def render_text(report: LocalizationReport, *, verbose: bool = False) -> str:
    """The report as terminal text; the top suspects come first."""
    out = [f"verdict: {report.verdict}"]
    if report.culprit_ranks or report.culprit_hosts:
        out.append(f"culprit ranks: {_ranks(report.culprit_ranks)}"
                   + (f"   hosts: {', '.join(report.culprit_hosts)}" if report.culprit_hosts else ""))
    if report.verdict != "healthy" and report.process_group is not None:
        seq = "unknown" if report.collective_seq is None else report.collective_seq
        out.append(f"where: group {report.process_group}, collective seq {seq}, op {report.op}")
    if report.unreadable_ranks:
        out.append(f"unreadable ranks: {_ranks(report.unreadable_ranks)}   (state unknown; see the warnings)")
    out.append(report.explanation)
    if report.missing_records:
        out.append("not recorded in the dumps:")
        out.extend(f"  - {m}" for m in report.missing_records[: 16 if verbose else 4])
    out.append(f"({len(report.ranks_analyzed)} rank dumps, backend {report.backend}, format "
               f"{', '.join(report.format_versions) or '?'}, {report.seconds:.2f} s)")
    if report.problems:
        out.append("")
        out.append(f"problems ({len(report.problems)}, causes first):")
        for i, p in enumerate(report.problems):
            out.extend(_problem_lines(i, p, verbose=verbose))
    if report.warnings:
        out.append("")
        out.append(f"warnings ({len(report.warnings)}):")
        out.extend(f"  {w.file}: {w.message}" for w in report.warnings[: 50 if verbose else 12])
        if len(report.warnings) > (50 if verbose else 12):
            out.append("  ...")
    return "\n".join(out)
