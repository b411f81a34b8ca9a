"""Streaming scanner: finds rule matches in a byte stream with bounded memory, candidate lines found in C.

One RE2 pattern made of every rule's trigger words (``keywords``, or the whole pattern of a rule without
them) is searched over 1 MiB blocks in RE2's DFA; only the few lines it hits are decoded, and an RE2 set
picks which rules each of them can match, so Python runs on a handful of lines, not on every line.
"""

from __future__ import annotations

import logging
import os
import re
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import re2

from trainguard.classify.context import LineTime, line_time, normalize_pci
from trainguard.classify.links import LINK_KEYWORDS, LinkCollector
from trainguard.classify.rules import Rule, RuleSet, TextMatch, compile_user_bytes
from trainguard.core.taxonomy import UNKNOWN

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
MAX_LINE_BYTES = 64 * 1024
"""Longer lines are cut to this length (the rest of the line is skipped, memory stays bounded)."""
HITS_PER_RULE = 5
XID_HITS_PER_CODE = 16
"""XID lines kept per code: enough to see every GPU of an 8- or 16-GPU host fall off the bus at once."""
CONTEXT_HOSTS = 10
MAX_BRIDGES = 4096
"""PCI bridge ranges kept per source (a host has a few hundred; the bound keeps memory fixed)."""
_TRIGGER_MAX_MEM = 64 << 20
"""RE2's budget for the combined trigger (its DFA cache): a few hundred words need far less."""
WORKERS = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
"""Threads that search blocks ahead of the one being matched (1: no threads)."""
AHEAD_LINES = 32
"""A worker stops after this many candidate lines of a block; the matching thread finds the rest."""


@dataclass(frozen=True)
class _Line:
    """A line assembled across blocks, or the head of an over-long line."""

    data: bytes
    completes: int
    """Lines it ends (0 for the head of a line whose rest is still being skipped)."""
    whole: bool
    """False for the head of an over-long line (already cut; counted as truncated)."""


@dataclass(frozen=True)
class _Skip:
    """The end of an over-long line whose head was scanned: one more line."""


@dataclass(frozen=True)
class _Block:
    """Complete lines ``chunk[start:end]``; ``found`` is their candidate spans or a future of them."""

    chunk: bytes
    start: int
    end: int
    found: Any = None
    """(spans, where the search stopped), or a future of them."""


_Item = _Line | _Skip | _Block


class Readable(Protocol):
    """What `Scanner.scan_stream` reads from: a binary file, a GzipFile, a BytesIO."""

    def read(self, size: int = -1, /) -> bytes: ...


@dataclass(frozen=True)
class Hit:
    """One line that matched one rule."""

    rule: str
    """Rule id (``xid-<code>`` for XIDs)."""
    category: str
    """What the line alone points to."""
    confidence: float
    tier: str
    explain: str
    file: str
    line: int
    """1-based line number in ``file``."""
    text: str
    """The line, stripped, at most 500 characters."""
    order: int
    """Position among all hits of the source (files in order, lines in order)."""
    gpu: str | None = None
    """The GPU the line is about (PCI address ``dddd:bb:dd``), if it names one."""
    host: str | None = None
    device: str | None = None
    """The PCI device the line is about (``dddd:bb:dd``): the GPU of an XID, the port or source of an AER error."""
    time: LineTime | None = None
    """The line's time stamp, if it has one (see `trainguard.classify.context.line_time`)."""
    explained_by: int | None = None
    """``order`` of the upstream hit that explains this one (set by the engine)."""


@dataclass
class Accumulator:
    """What one source's lines produced; bounded in size however long the input."""

    hits: dict[str, list[Hit]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    xids: dict[int, int] = field(default_factory=dict)
    context_hosts: list[str] = field(default_factory=list)
    bridges: dict[str, tuple[int, int]] = field(default_factory=dict)
    """PCI bridge (``dddd:bb:dd``) -> the (first, last) bus under it, from the log's own lines."""
    section_gpu: dict[str, str] = field(default_factory=dict)
    """File -> the GPU its current ``nvidia-smi -q`` section is about."""
    lines: int = 0
    truncated_lines: int = 0
    files: int = 0
    skipped: list[str] = field(default_factory=list)
    links: LinkCollector = field(default_factory=LinkCollector)
    """The link pass: NCCL transport errors, NVLink XIDs and SXids folded into failing pairs."""
    frozen: set[tuple[str, str]] = field(default_factory=set)
    """(rule id, file) of ``keep_last`` rules whose kept lines in that file no longer change (``keep_before``)."""
    _order: int = 0

    def add(self, hit: Hit, cap: int = HITS_PER_RULE, last: bool = False) -> None:
        """Keeps ``hit`` among its rule's first ``cap`` hits (or, with ``last``, the last ``cap`` of its file);
        counts it."""
        self.counts[hit.rule] = self.counts.get(hit.rule, 0) + 1
        kept = self.hits.setdefault(hit.rule, [])
        if not last:
            if len(kept) < cap:
                kept.append(hit)
            return
        same = [i for i, h in enumerate(kept) if h.file == hit.file]
        if len(same) >= cap:
            del kept[same[0]]
        kept.append(hit)

    def next_order(self) -> int:
        self._order += 1
        return self._order


def _literal(word: str) -> bytes:
    """``word`` as an RE2 pattern matching exactly its UTF-8 bytes (each byte spelled out where needed)."""
    return b"".join(bytes([b]) if chr(b).isalnum() and b < 0x80 else b"\\x%02x" % b for b in word.encode())


def _strip_groups(pattern: str) -> str:
    return re.sub(r"\(\?P<\w+>", "(?:", pattern)


def _rule_filter(r: Rule) -> bytes:
    """The RE2 pattern a line must match for ``r`` to be worth trying: one of its keywords, else its pattern."""
    if r.keywords:
        return b"|".join(_literal(k) for k in r.keywords)
    p = _strip_groups(r.pattern.pattern).encode()
    return b"(?i:" + p + b")" if r.ignore_case else b"(?:" + p + b")"


class Scanner:
    """Matches lines against a `RuleSet`."""

    def __init__(self, rules: RuleSet, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.rules = rules
        self.max_line_bytes = max_line_bytes
        # category -> the keep_last rules whose kept lines in a file stop changing at its first line of it
        self._freezes: dict[str, list[str]] = {}
        for r in rules.rules:
            for cat in r.keep_before if r.keep_last else ():
                self._freezes.setdefault(cat, []).append(r.id)
        words = {*rules.source_host_keywords, *rules.section_keywords, *rules.bridge_keywords, *LINK_KEYWORDS}
        patterns: list[bytes] = []
        xid_filter = b"Xid"
        if "Xid" in rules.xid_pattern.pattern:
            words.add("Xid")
        else:  # a user pattern for another XID format (DCGM's metric) joins the pre-filter whole
            xid_filter = b"(?:" + _strip_groups(rules.xid_pattern.pattern).encode() + b")"
            patterns.append(xid_filter)
        for r in rules.rules:
            if r.keywords:
                words.update(r.keywords)
            else:
                patterns.append(_rule_filter(r))
        self.trigger_words: tuple[str, ...] = tuple(sorted(words))
        """Every literal that makes a line a candidate (what ``grep -F`` would need to find the same lines)."""
        self.trigger_patterns: tuple[bytes, ...] = tuple(patterns)
        """Patterns of rules without keywords: they make lines candidates too."""
        self.trigger: Any = compile_user_bytes(
            b"|".join([_literal(w) for w in self.trigger_words] + list(patterns)), max_mem=_TRIGGER_MAX_MEM)
        # Which rules a candidate line can match: one RE2 set entry per rule (its keywords or pattern),
        # then the XID pattern and the context kinds, in that order.
        self._select: Any = re2.Set.SearchSet(_set_options())
        for r in rules.rules:
            self._select.Add(_rule_filter(r))
        n = len(rules.rules)
        self._i_xid = n
        self._select.Add(xid_filter)
        self._i_source = self._add_words(rules.source_host_keywords)
        self._i_section = self._add_words(rules.section_keywords)
        self._i_bridge = self._add_words(rules.bridge_keywords)
        self._i_link = self._add_words(LINK_KEYWORDS)
        self._select.Compile()

    def _add_words(self, words: tuple[str, ...]) -> int:
        """Add a set entry for ``words`` (or one that never matches); return its index."""
        return int(self._select.Add(b"|".join(_literal(w) for w in words) if words else b"[^\\x00-\\xff]"))

    # -- line level --------------------------------------------------------------------------------
    def match_line(self, text: str, file: str, lineno: int, acc: Accumulator) -> None:
        """Record every rule ``text`` (one line, without its newline) is evidence for."""
        self._match_raw(text.encode("utf-8", "replace"), file, lineno, acc)

    def _match_raw(self, raw: bytes, file: str, lineno: int, acc: Accumulator) -> None:
        # Most lines stop at the RE2 pre-filter; only the few candidates pay for the steps below.
        selected = self._select.Match(raw)
        if not selected:
            return
        text = raw.decode("utf-8", "replace").rstrip("\r\n")
        chosen = set(selected)
        self._note_context(chosen, text, file, acc)
        if self._i_link in chosen:
            acc.links.feed(text, file, lineno)
        shown = text.strip()[:500]
        found = self._rules_matching(selected, chosen, text, shown, file, lineno, acc)
        keep = self._worth_keeping(found, file, acc) if found else []
        if keep:
            self._record(keep, found, text, shown, file, lineno, acc)

    def _note_context(self, chosen: set[int], text: str, file: str, acc: Accumulator) -> None:
        """What a line says about the log's host, the GPU of the lines below it, or the PCI topology."""
        rules = self.rules
        if self._i_source in chosen:
            for cp in rules.source_hosts:
                m = cp.search(text)
                if m and len(acc.context_hosts) < CONTEXT_HOSTS:
                    acc.context_hosts.append(m.group("host"))
        if self._i_section in chosen:
            for cp in rules.sections:
                m = cp.search(text)
                if m:
                    acc.section_gpu[file] = normalize_pci(m.group("gpu")) or m.group("gpu")
        if self._i_bridge in chosen:
            for cp in rules.bridges:
                m = cp.search(text)
                if m and len(acc.bridges) < MAX_BRIDGES:
                    dev = normalize_pci(m.group("device"))
                    if dev:
                        acc.bridges[dev] = (int(m.group("lo"), 16), int(m.group("hi"), 16))

    def _rules_matching(self, selected: list[int], chosen: set[int], text: str, shown: str, file: str,
                        lineno: int, acc: Accumulator) -> list[tuple[Rule | None, Any]]:
        """(rule, its match) for each rule the line is evidence for, or (None, the XID hit)."""
        found: list[tuple[Rule | None, Any]] = []
        if self._i_xid in chosen:
            m = self.rules.xid_pattern.search(text)
            if m:
                found.append((None, self._xid_hit(m, text, shown, file, lineno, acc)))
        for i in sorted(selected):
            if i >= self._i_xid:
                break
            r = self.rules.rules[i]
            rm = r.pattern.search(text)
            if rm is not None and (r.unless is None or r.unless.search(text) is None):
                found.append((r, rm))
        return found

    @staticmethod
    def _worth_keeping(found: list[tuple[Rule | None, Any]], file: str,
                       acc: Accumulator) -> list[tuple[Rule | None, Any]]:
        """The matches no other match supersedes, and whose rule has room for another hit (else only counted)."""
        superseded = {x for r, _ in found if r is not None for x in r.supersedes}
        keep: list[tuple[Rule | None, Any]] = []
        for r, x in found:
            rid = x.rule if r is None else r.id
            if rid in superseded:
                continue
            if r is not None and r.keep_last:
                full = (rid, file) in acc.frozen
            else:
                full = len(acc.hits.get(rid, ())) >= (XID_HITS_PER_CODE if r is None else r.keep)
            if full:
                acc.counts[rid] = acc.counts.get(rid, 0) + 1  # counted; no need to build a hit nobody keeps
            else:
                keep.append((r, x))
        return keep

    def _line_host_and_device(self, found: list[tuple[Rule | None, Any]], text: str) -> tuple[str | None, str | None]:
        """The host a line's prefix names, and the device it is about (an XID's GPU, else a PCI address)."""
        host = None
        for cp in self.rules.line_hosts:
            m = cp.search(text)
            if m:
                host = m.group("host")
                break
        # a line's hits share what any of them names (an XID line's GPU is also the GPU of "fallen off the bus")
        line_device = next((x.gpu for r, x in found if r is None and x.gpu), None)
        for cp in self.rules.line_devices if line_device is None else ():
            m = cp.search(text)
            if m:
                line_device = normalize_pci(m.group("device"))
                break
        return host, line_device

    def _record(self, keep: list[tuple[Rule | None, Any]], found: list[tuple[Rule | None, Any]], text: str,
                shown: str, file: str, lineno: int, acc: Accumulator) -> None:
        host, line_device = self._line_host_and_device(found, text)
        when = line_time(text, file)
        section = acc.section_gpu.get(file)
        for r, x in keep:
            for rid in self._freezes.get(x.category if r is None else r.category, ()):
                acc.frozen.add((rid, file))
            if r is None:
                h: Hit = x
                acc.add(replace(h, order=acc.next_order(), host=h.host or host, device=h.device or line_device,
                                time=when), XID_HITS_PER_CODE)
                continue
            groups = x.groupdict()
            gpu = normalize_pci(groups.get("gpu")) or section
            device = normalize_pci(groups.get("device")) or gpu or line_device
            # a rule that captures the module it is about names it (a missing package: which one)
            explain = f"{r.explain}: {groups['module']}" if groups.get("module") else r.explain
            if r.detail:
                explain = _with_detail(explain, r.detail, groups)
            acc.add(Hit(r.id, r.category, r.confidence, r.tier, explain, file, lineno, shown, acc.next_order(),
                        gpu=gpu, host=groups.get("host") or host, device=device, time=when), r.keep, r.keep_last)

    def _xid_hit(self, m: TextMatch, text: str, shown: str, file: str, lineno: int, acc: Accumulator) -> Hit:
        code = int(m.group("code"))
        acc.xids[code] = acc.xids.get(code, 0) + 1
        groups = m.groupdict()
        gpu = normalize_pci(groups.get("gpu"))
        host = groups.get("host")
        xr = self.rules.xid_rule(code)
        if xr is None:
            return Hit(f"xid-{code}", UNKNOWN, self.rules.unknown_xid_confidence, "hint",
                       f"XID {code} (no rule gives its meaning)", file, lineno, shown, 0, gpu=gpu, host=host,
                       device=gpu)
        category, explain = xr.category, xr.explain
        rest = text[m.end():]
        for pattern, qcat, qexplain in xr.qualifiers:
            if pattern.search(rest):
                category, explain = qcat, qexplain or explain
                break
        return Hit(f"xid-{code}", category, xr.confidence, xr.tier, explain, file, lineno, shown, 0,
                   gpu=gpu, host=host, device=gpu)

    # -- stream level ------------------------------------------------------------------------------
    def scan_stream(self, f: Readable, file: str, acc: Accumulator, *, first_line: int = 1) -> None:
        """Scan a binary stream line by line in blocks; memory stays under a few MiB.

        Each block is searched in place (no copy) up to its last newline; only the unfinished last line is
        carried over to the next block, and a line longer than ``max_line_bytes`` is cut there. On inputs of
        more than one block, worker threads search the next blocks (RE2 releases the GIL) while this thread
        matches the candidate lines of the current one, in order."""
        base = first_line - 1  # lines fully consumed so far
        pool: ThreadPoolExecutor | None = None
        pending: deque[_Item] = deque()
        try:
            for item in self._items(f):
                if isinstance(item, _Block):
                    if pool is None and WORKERS > 1 and len(item.chunk) >= CHUNK_BYTES:
                        pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="classify-scan")
                    args = (item.chunk, item.start, item.end)
                    found = pool.submit(self._find, *args, AHEAD_LINES) if pool else self._find(*args)
                    item = _Block(*args, found)
                pending.append(item)
                # a bounded look-ahead: at most WORKERS blocks in flight (memory stays a few MiB)
                while len(pending) > (WORKERS if pool is not None else 0):
                    base = self._consume(pending.popleft(), base, file, acc)
            while pending:
                base = self._consume(pending.popleft(), base, file, acc)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        acc.lines += base - (first_line - 1)

    def _items(self, f: Readable) -> Iterator[_Item]:
        """The stream as work in order: blocks of complete lines, lines assembled across blocks, heads of
        over-long lines and the ends of those lines."""
        tail = b""  # the unfinished line at the end of the previous block
        skipping = False  # inside an over-long line whose head was already scanned
        limit = self.max_line_bytes
        while True:
            chunk = f.read(CHUNK_BYTES)
            if not chunk:
                break
            start = 0
            if skipping or tail:
                nl = chunk.find(b"\n")
                if nl < 0:
                    if not skipping:
                        tail += chunk
                        if len(tail) > limit:
                            yield _Line(tail[:limit], 0, False)
                            tail, skipping = b"", True
                    continue
                yield _Skip() if skipping else _Line(tail + chunk[:nl], 1, True)
                tail, skipping = b"", False
                start = nl + 1
            cut = chunk.rfind(b"\n", start)
            if cut >= 0:
                yield _Block(chunk, start, cut + 1)
                start = cut + 1
            tail = chunk[start:]
            if len(tail) > limit:
                yield _Line(tail[:limit], 0, False)
                tail, skipping = b"", True
        if tail:
            yield _Line(tail, 1, True)
        elif skipping:
            yield _Skip()

    def _consume(self, item: _Item, base: int, file: str, acc: Accumulator) -> int:
        """Match the candidate lines of one work item; returns the line count after it."""
        if isinstance(item, _Skip):
            return base + 1
        if isinstance(item, _Line):
            data = item.data
            if not item.whole or len(data) > self.max_line_bytes:
                acc.truncated_lines += 1
                data = data[: self.max_line_bytes]
            if self.trigger.search(data) is not None:
                self._match_raw(data, file, base + 1, acc)
            return base + item.completes
        block, pos, end = item.chunk, item.start, item.end
        spans, stopped = item.found.result() if isinstance(item.found, Future) else item.found
        if stopped < end:  # the worker left a dense block: find the rest here
            spans = spans + self._find(block, stopped, end)[0]
        counted_to, counted = pos, 0
        limit = self.max_line_bytes
        for start, stop in spans:
            counted += block.count(b"\n", counted_to, start)
            counted_to = start
            line = block[start:stop]
            if len(line) > limit:
                acc.truncated_lines += 1
                line = line[:limit]
            self._match_raw(line, file, base + counted + 1, acc)
        return base + counted + block.count(b"\n", counted_to, end)

    def _find(self, block: bytes, pos: int, end: int, limit: int | None = None) -> tuple[list[tuple[int, int]], int]:
        """(start, end) of the lines of ``block[pos:end]`` the trigger hits (``end`` just after a newline), and
        where the search stopped: at ``end``, or after ``limit`` lines (the caller goes on from there).

        Runs in a worker thread, so it stops early on a block dense with candidates: each search hands the GIL
        back and forth, and the thread matching lines would wait for it; that thread finds the rest itself."""
        search = self.trigger.search
        spans: list[tuple[int, int]] = []
        at = pos
        while limit is None or len(spans) < limit:
            m = search(block, at, end)
            if m is None or m.start() >= end:  # (a user pattern that matches the empty string, at the end)
                return spans, end
            s = m.start()
            stop = block.find(b"\n", s, end)
            spans.append((block.rfind(b"\n", pos, s) + 1 or pos, stop))
            at = stop + 1
        return spans, at


def _set_options() -> Any:
    options = re2.Options()
    options.log_errors = False
    options.encoding = re2.Options.Encoding.LATIN1
    return options


_FIELD = re.compile(r"\{(\w+)\}")


def _with_detail(explain: str, template: str, groups: dict[str, str | None]) -> str:
    """``explain`` with the rule's detail appended, when every group the template names matched."""
    if any(not groups.get(name) for name in _FIELD.findall(template)):
        return explain
    return f"{explain}: {template.format_map(groups)}"
