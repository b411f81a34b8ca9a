"""Classification rules as data: load, validate and merge the TOML rule files.

The built-in rules live in ``rules.toml`` next to this module; users extend or override them with
their own file (``trainguard classify --rules FILE``). See docs/classify.md for the format.
"""

from __future__ import annotations

import logging
import re
import tomllib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import re2

from trainguard.classify.crossline import EXPLAIN_SCOPES, CrossLine, Explains, parse_crossline
from trainguard.classify.tiers import TIERS, default_tier
from trainguard.core.taxonomy import TABLE5_GROUPS
from trainguard.errors import InputError

log = logging.getLogger(__name__)

BUILTIN_RULES = Path(__file__).with_name("rules.toml")
_CONTEXT_GROUPS: dict[str, tuple[str, ...]] = {
    "line": ("host",), "device": ("device",), "source": ("host",), "section": ("gpu",),
    "bridge": ("device", "lo", "hi")}
"""[[context]] scopes and the named groups each needs."""


class TextMatch(Protocol):
    """What the classifier reads from a match (Python's ``re.Match`` and RE2's match both fit)."""

    def group(self, name: str, /) -> Any: ...
    def groupdict(self) -> dict[str, Any]: ...
    def end(self) -> int: ...


class TextPattern(Protocol):
    """A compiled pattern: Python ``re`` for the built-in rules, RE2 (linear time) for user rules."""

    @property
    def pattern(self) -> Any: ...
    @property
    def groupindex(self) -> Mapping[str, int]: ...
    def search(self, string: str, /) -> TextMatch | None: ...


def _re2_options(*, ignore_case: bool = False, latin1: bool = False) -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would print its own copy of the error to stderr
    options.case_sensitive = not ignore_case
    if latin1:  # byte patterns over raw log blocks: one character per byte, like Python's bytes patterns
        options.encoding = re2.Options.Encoding.LATIN1
    return options


def _re2_reason(exc: Exception) -> str:
    arg = exc.args[0] if exc.args else exc
    return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)


def compile_user_bytes(pattern: bytes, *, max_mem: int | None = None) -> Any:
    """A byte pattern over raw log blocks (one character per byte), compiled with RE2 (raises ``re2.error``)."""
    options = _re2_options(latin1=True)
    if max_mem is not None:
        options.max_mem = max_mem
    return re2.compile(pattern, options)


@dataclass(frozen=True)
class Rule:
    """One line-level pattern that is evidence for a category."""

    id: str
    """Unique name; a user rule with the id of a built-in one replaces it."""
    category: str
    """Table 5 category, or ``Unknown`` for partial evidence that names no cause."""
    confidence: float
    """How sure one matching line makes us, 0..1."""
    tier: str
    """Precedence tier (see `TIERS`)."""
    pattern: TextPattern
    """Searched in each candidate line; named groups ``gpu`` and ``host`` locate the suspect."""
    keywords: tuple[str, ...] = ()
    """Literal strings of which one must occur in the line (a fast pre-filter); empty = use pattern."""
    unless: TextPattern | None = None
    """A line that also matches this is not evidence for this rule."""
    ignore_case: bool = False
    """``pattern`` and ``unless`` ignore case (``keywords`` never do)."""
    explain: str = ""
    """What a matching line means, for the verdict's explanation."""
    yields_to: tuple[str, ...] = ()
    """Categories this rule's lines support instead when they have evidence of their own (a generic
    CUDA ECC message supports an SRAM XID rather than competing with it)."""
    builtin: bool = True
    """From the built-in file (Python ``re``); False for a user file's rule (compiled with RE2)."""
    explains: Explains | None = None
    """Later errors this rule's lines are the cause of (cause before consequence, by time and topology)."""
    supersedes: tuple[str, ...] = ()
    """Ids of rules that do not count a line this rule matches (a 503 from an object store printed as a Python
    exception is a failed dependency, not also a software bug)."""
    keep: int = 5
    """Matching lines kept as hits (more are only counted); a `crossline` analysis that reads a series (sensor
    readings, per-replica checksums) needs more."""
    keep_last: bool = False
    """Keep the last ``keep`` matching lines of each file rather than the first of the source: an analysis that
    wants the work nearest before a later failure (a long run saves a checkpoint hundreds of times before the one
    that matters)."""
    keep_before: tuple[str, ...] = ()
    """With ``keep_last``: a file's kept lines stop changing at its first line of one of these categories, so the
    lines after a failure cannot push out those before it."""
    detail: str = ""
    """A ``str.format`` template over the pattern's named groups, appended to ``explain`` (after ": ") when every
    group it names matched: the versions of a mismatch, the architecture missing from a build."""


@dataclass(frozen=True)
class XidRule:
    """What a set of NVIDIA XID codes means."""

    codes: frozenset[int]
    """The XID codes this entry gives the meaning of."""
    category: str
    confidence: float
    tier: str
    explain: str = ""
    qualifiers: tuple[tuple[TextPattern, str, str], ...] = ()
    """(pattern, category, explain): the first qualifier matching the line's text overrides."""
    explains: Explains | None = None
    """Later errors these XIDs are the cause of (a GSP timeout before the driver's lost-GPU lines)."""


@dataclass(frozen=True)
class VerdictRule:
    """What a localization verdict adds as evidence."""

    verdict: str
    category: str
    confidence: float
    tier: str
    explain: str = ""


@dataclass(frozen=True)
class RuleSet:
    """Everything the classifier needs, loaded from one or more rule files."""

    rules: tuple[Rule, ...]
    xid_pattern: TextPattern
    """Finds an XID line; groups ``code`` (required) and ``gpu``/``host`` (optional)."""
    xids: tuple[XidRule, ...]
    unknown_xid_confidence: float
    verdicts: tuple[VerdictRule, ...]
    line_hosts: tuple[TextPattern, ...] = ()
    """Patterns whose ``host`` group names the host of the line they match (syslog prefixes)."""
    line_devices: tuple[TextPattern, ...] = ()
    """Patterns whose ``device`` group names the PCI device a kernel line is about (``mlx5_core 0000:4b:00.0:``),
    for evidence lines whose rule names none."""
    source_hosts: tuple[TextPattern, ...] = ()
    """Patterns whose ``host`` group names the host the whole log is from (torchelastic summaries)."""
    source_host_keywords: tuple[str, ...] = ()
    strong_confidence: float = 0.5
    """Signals below this confidence are weak: they win only when nothing strong is present."""
    sources: tuple[str, ...] = field(default_factory=tuple)
    xid_pattern_builtin: bool = True
    """False when a user file set ``xid_pattern`` (then it is an RE2 pattern)."""
    sections: tuple[TextPattern, ...] = ()
    """Header lines whose ``gpu`` group names the GPU the following lines are about (``nvidia-smi -q``)."""
    section_keywords: tuple[str, ...] = ()
    bridges: tuple[TextPattern, ...] = ()
    """Lines giving a PCI bridge's bus range (groups ``device``, ``lo``, ``hi``): the topology of the host."""
    bridge_keywords: tuple[str, ...] = ()
    explain_window_s: float = 600.0
    """A consequence must follow its cause within this many seconds when both lines carry comparable times."""
    crosslines: tuple[CrossLine, ...] = ()
    """Analyses of several lines together (simultaneity, sensor jumps, replica divergence)."""

    def xid_rule(self, code: int) -> XidRule | None:
        for r in self.xids:
            if code in r.codes:
                return r
        return None


def _fail(where: str, msg: str) -> InputError:
    return InputError(f"{where}: {msg}")


def _regex(where: str, text: Any, ignore_case: bool = False, *, user: bool = False) -> TextPattern:
    """Compile a rule's pattern: built-in ones with Python ``re``; a user's with RE2, whose matching time
    is linear in the line length, so no pattern (``^(a+)+$``) can make a log take forever."""
    if not isinstance(text, str) or not text:
        raise _fail(where, "pattern must be a non-empty string")
    try:
        with warnings.catch_warnings():  # Python's hints about RE2-valid syntax ([[:alpha:]]) are noise here
            warnings.simplefilter("ignore", FutureWarning)
            compiled = re.compile(text, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise _fail(where, f"bad regular expression: {exc}") from None
    if not user:
        return compiled
    try:
        return re2.compile(text, _re2_options(ignore_case=ignore_case))
    except re2.error as exc:
        raise _fail(where, f"pattern {text[:80]!r} is not supported ({_re2_reason(exc)}): user rules use RE2 "
                           "syntax, without backreferences or lookaround") from None


def _category(where: str, value: Any) -> str:
    if value not in TABLE5_GROUPS:
        raise _fail(where, f"unknown category {value!r} (use a Table 5 name or 'Unknown')")
    return str(value)


def _confidence(where: str, value: Any) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise _fail(where, f"confidence must be a number in 0..1, got {value!r}")
    return float(value)


def _tier(where: str, value: Any, category: str) -> str:
    if value is None:
        return default_tier(category)
    if value not in TIERS:
        raise _fail(where, f"unknown tier {value!r} (one of {', '.join(TIERS)})")
    return str(value)


def _check_embeddable(where: str, pattern: str) -> None:
    """A rule without keywords puts its pattern into the scanner's RE2 pre-filter; make sure it fits there."""
    stripped = re.sub(r"\(\?P<\w+>", "(?:", pattern)
    try:
        compile_user_bytes(b"(?:" + stripped.encode() + b")|x")
    except re2.error as exc:
        raise _fail(where, f"pattern cannot be used without keywords ({_re2_reason(exc)}); add keywords, use "
                           "ignore_case instead of inline flags, and avoid backreferences and lookaround") from None


def _explains(where: str, value: Any) -> Explains | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _fail(where, "explains must be a table: {categories = [...], scope = ..., min_devices = N}")
    cats = value.get("categories")
    if not isinstance(cats, list) or not cats:
        raise _fail(where, "explains.categories must be a non-empty list of categories")
    scope = value.get("scope", "below")
    if scope not in EXPLAIN_SCOPES:
        raise _fail(where, f"explains.scope must be one of {', '.join(EXPLAIN_SCOPES)}, got {scope!r}")
    n = value.get("min_devices", 1)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise _fail(where, f"explains.min_devices must be an integer >= 1, got {n!r}")
    only = value.get("rules", [])
    if not isinstance(only, list) or not all(isinstance(x, str) and x for x in only):
        raise _fail(where, "explains.rules must be a list of rule ids")
    unknown_keys = set(value) - {"categories", "scope", "min_devices", "rules", "within_s"}
    if unknown_keys:
        raise _fail(where, f"explains has unknown key(s) {', '.join(sorted(unknown_keys))}")
    within = value.get("within_s")
    if within is not None and (not isinstance(within, (int, float)) or isinstance(within, bool) or within < 0):
        raise _fail(where, f"explains.within_s must be a number >= 0, got {within!r}")
    return Explains(tuple(_category(where, c) for c in cats), str(scope), n, tuple(only),
                    float(within) if within is not None else None)


def _parse_rule(where: str, d: dict[str, Any], user: bool) -> Rule:
    rid = d.get("id")
    if not isinstance(rid, str) or not rid:
        raise _fail(where, "every [[rule]] needs an id")
    where = f"{where}: rule {rid!r}"
    category = _category(where, d.get("category"))
    ignore_case = bool(d.get("ignore_case", False))
    keywords = d.get("keywords", [])
    if not isinstance(keywords, list) or not all(isinstance(k, str) and k for k in keywords):
        raise _fail(where, "keywords must be a list of non-empty strings")
    unless = d.get("unless")
    pattern = _regex(where, d.get("pattern"), ignore_case, user=user)
    if not keywords:
        _check_embeddable(where, pattern.pattern)
    supersedes = d.get("supersedes", [])
    if not isinstance(supersedes, list) or not all(isinstance(x, str) and x for x in supersedes):
        raise _fail(where, "supersedes must be a list of rule ids")
    return Rule(
        id=rid,
        category=category,
        confidence=_confidence(where, d.get("confidence")),
        tier=_tier(where, d.get("tier"), category),
        pattern=pattern,
        keywords=tuple(keywords),
        unless=_regex(where, unless, ignore_case, user=user) if unless is not None else None,
        ignore_case=ignore_case,
        explain=str(d.get("explain", "")),
        yields_to=_categories(where, d, "yields_to"),
        builtin=not user,
        explains=_explains(where, d.get("explains")),
        supersedes=tuple(supersedes),
        keep=_keep(where, d.get("keep", 5)),
        keep_last=_flag(where, d, "keep_last"),
        keep_before=_categories(where, d, "keep_before"),
        detail=_detail(where, d.get("detail", ""), pattern.pattern),
    )


def _detail(where: str, value: Any, pattern: str) -> str:
    """A rule's ``detail`` template, checked against the groups its pattern names."""
    if not isinstance(value, str):
        raise _fail(where, "detail must be a string")
    fields = set(re.findall(r"\{(\w+)\}", value))
    named = set(re.findall(r"\(\?P<(\w+)>", pattern))
    if fields - named:
        raise _fail(where, f"detail names group(s) the pattern lacks: {', '.join(sorted(fields - named))}")
    return value


def _categories(where: str, d: dict[str, Any], key: str) -> tuple[str, ...]:
    """A rule's list of categories under ``key`` (``yields_to``, ``keep_before``), each checked."""
    value = d.get(key, [])
    if not isinstance(value, list):
        raise _fail(where, f"{key} must be a list of categories")
    return tuple(_category(where, c) for c in value)


def _flag(where: str, d: dict[str, Any], key: str) -> bool:
    value = d.get(key, False)
    if not isinstance(value, bool):
        raise _fail(where, f"{key} must be true or false, got {value!r}")
    return value


def _keep(where: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 4096:
        raise _fail(where, f"keep must be an integer in 1..4096, got {value!r}")
    return value


def _parse_xid(where: str, d: dict[str, Any], user: bool) -> XidRule:
    codes = d.get("codes")
    if not isinstance(codes, list) or not codes or not all(isinstance(c, int) for c in codes):
        raise _fail(where, "every [[xid]] needs codes = [integers]")
    where = f"{where}: xid {codes}"
    category = _category(where, d.get("category"))
    quals = []
    for q in d.get("qualifier", []):
        if not isinstance(q, dict):
            raise _fail(where, "every [[xid.qualifier]] must be a table")
        quals.append((_regex(where, q.get("pattern"), user=user), _category(where, q.get("category")),
                      str(q.get("explain", ""))))
    return XidRule(
        codes=frozenset(codes),
        category=category,
        confidence=_confidence(where, d.get("confidence")),
        tier=_tier(where, d.get("tier"), category),
        explain=str(d.get("explain", "")),
        qualifiers=tuple(quals),
        explains=_explains(where, d.get("explains")),
    )


def _tables(where: str, data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """``data[key]`` as a list of tables (``[[key]]``), or an error naming the file."""
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(d, dict) for d in value):
        raise _fail(where, f"{key} must be written as [[{key}]] tables")
    return value


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise InputError(f"{path}: no such rules file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not a valid TOML rules file ({exc})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the rules file ({exc})") from None


class _RuleSetBuilder:
    """The rule set as loaded so far: each file adds to it or, with ``replace = true``, starts it anew."""

    def __init__(self) -> None:
        self.reset()
        self.xid_pattern: TextPattern | None = None
        self.xid_builtin = True
        self.unknown_xid = 0.2
        self.strong = 0.5
        self.window = 600.0

    def reset(self) -> None:
        """Drop the rules, XID meanings, verdicts and context patterns (settings stay)."""
        self.rules: dict[str, Rule] = {}
        self.xids: list[XidRule] = []
        self.verdicts: dict[str, VerdictRule] = {}
        self.context: dict[str, list[TextPattern]] = {scope: [] for scope in _CONTEXT_GROUPS}
        self.keywords: dict[str, list[str]] = {scope: [] for scope in _CONTEXT_GROUPS}
        self.crosslines: dict[str, CrossLine] = {}

    def add_file(self, path: Path) -> None:
        data = _read_toml(path)
        where = str(path)
        user = path != BUILTIN_RULES
        if data.get("replace"):
            self.reset()
        self._add_rules(where, data, user)
        for d in _tables(where, data, "xid"):
            x = _parse_xid(where, d, user)
            self.xids = [old for old in self.xids if not old.codes <= x.codes]
            self.xids.insert(0, x)  # newer files win on overlapping codes
        for d in _tables(where, data, "verdict"):
            name = d.get("verdict")
            category = _category(where, d.get("category"))
            self.verdicts[str(name)] = VerdictRule(
                str(name), category, _confidence(where, d.get("confidence")),
                _tier(where, d.get("tier"), category), str(d.get("explain", "")))
        for d in _tables(where, data, "context"):
            self._add_context(where, d, user)
        for d in _tables(where, data, "crossline"):
            c = parse_crossline(where, d, _explains, self.rules)
            self.crosslines[c.id] = c
        self._apply_settings(where, data, user)

    def _add_rules(self, where: str, data: dict[str, Any], user: bool) -> None:
        for d in _tables(where, data, "rule"):
            r = _parse_rule(where, d, user)
            self.rules.pop(r.id, None)
            self.rules[r.id] = r
        for r in self.rules.values():
            unknown = [x for x in r.supersedes if x not in self.rules]
            if unknown:
                raise _fail(where, f"rule {r.id!r} supersedes unknown rule(s) {', '.join(map(repr, unknown))}")

    def _add_context(self, where: str, d: dict[str, Any], user: bool) -> None:
        pattern = _regex(where, d.get("pattern"), user=user)
        scope = d.get("scope", "line")
        if scope not in _CONTEXT_GROUPS:
            raise _fail(where, f"[[context]] scope must be one of {', '.join(_CONTEXT_GROUPS)}, got {scope!r}")
        missing = [g for g in _CONTEXT_GROUPS[scope] if g not in pattern.groupindex]
        if missing:
            raise _fail(where, f"a [[context]] with scope = {scope!r} needs the group(s) "
                               + ", ".join(f"(?P<{g}>...)" for g in missing))
        if scope not in ("line", "device"):  # whole-log scopes are found by keyword first, for speed
            keywords = d.get("keywords")
            if not isinstance(keywords, list) or not keywords or not all(isinstance(k, str) and k for k in keywords):
                raise _fail(where, f"a [[context]] with scope = {scope!r} needs keywords")
            self.keywords[scope].extend(keywords)
        self.context[scope].append(pattern)

    def _apply_settings(self, where: str, data: dict[str, Any], user: bool) -> None:
        settings = data.get("settings", {})
        if not isinstance(settings, dict):
            raise _fail(where, "settings must be a [settings] table")
        if "xid_pattern" in settings:
            self.xid_pattern = _regex(where, settings["xid_pattern"], user=user)
            self.xid_builtin = not user
            if "code" not in self.xid_pattern.groupindex:
                raise _fail(where, "settings.xid_pattern needs a (?P<code>...) group")
        if "unknown_xid_confidence" in settings:
            self.unknown_xid = _confidence(where, settings["unknown_xid_confidence"])
        if "strong_confidence" in settings:
            self.strong = _confidence(where, settings["strong_confidence"])
        if "explain_window_s" in settings:
            w = settings["explain_window_s"]
            if not isinstance(w, (int, float)) or isinstance(w, bool) or w < 0:
                raise _fail(where, f"settings.explain_window_s must be a number >= 0, got {w!r}")
            self.window = float(w)

    def build(self, paths: list[Path]) -> RuleSet:
        if self.xid_pattern is None:
            raise InputError("rules: no settings.xid_pattern defined")
        return RuleSet(
            rules=tuple(self.rules.values()),
            xid_pattern=self.xid_pattern,
            xids=tuple(self.xids),
            unknown_xid_confidence=self.unknown_xid,
            verdicts=tuple(self.verdicts.values()),
            line_hosts=tuple(self.context["line"]),
            line_devices=tuple(self.context["device"]),
            source_hosts=tuple(self.context["source"]),
            source_host_keywords=tuple(self.keywords["source"]),
            strong_confidence=self.strong,
            sources=tuple(str(p) for p in paths),
            xid_pattern_builtin=self.xid_builtin,
            sections=tuple(self.context["section"]),
            section_keywords=tuple(self.keywords["section"]),
            bridges=tuple(self.context["bridge"]),
            bridge_keywords=tuple(self.keywords["bridge"]),
            explain_window_s=self.window,
            crosslines=tuple(self.crosslines.values()),
        )


def load_rules(*extra: str | Path, builtin: bool = True) -> RuleSet:
    """The built-in rules, extended/overridden by each file in ``extra`` in order.

    A user file's ``[[rule]]`` with an existing id replaces that rule; ``[[xid]]`` entries override
    the built-in meaning of their codes; ``[[verdict]]`` entries replace the same verdict. A file with
    ``replace = true`` at the top drops everything loaded before it. Raises `InputError` on bad files.
    """
    paths = ([BUILTIN_RULES] if builtin else []) + [Path(p) for p in extra]
    builder = _RuleSetBuilder()
    for path in paths:
        builder.add_file(path)
    return builder.build(paths)
