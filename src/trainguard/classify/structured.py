"""Structured inputs read as data: JSON documents and CSV tables (telemetry series, per-replica checksums, DCGM
exports) become one ``key=value`` line per record, its time first, so the line rules and the cross-line analyses
(a sensor's jump, one diverging replica) read them like log lines."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime
from typing import Any

MAX_RECORDS = 100_000
"""Records rendered per document at most (a telemetry export can be long; the analyses keep their first lines)."""

_TIME_KEYS = ("timestamp", "time", "ts", "@timestamp", "datetime", "date", "Timestamp", "Time")
_SLASHED = re.compile(r"^(\d{4})/(\d\d)/(\d\d)[ T](\d\d:\d\d:\d\d(?:\.\d+)?)$")
_ISO = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")
# a key that names one rank, replica or GPU ("rank3", "gpu_3", "3"): a mapping of them is a per-replica table
_REPLICA_KEY = re.compile(r"^(?:(rank|replica|dp_rank|gpu|GPU|device)[_ -]?)?(\d+)$")
_CSV_HEADER = re.compile(r"^\s*[A-Za-z_#@][\w .\[\]()/%#@-]*(?:[,\t]\s*[A-Za-z_@][\w .\[\]()/%#@-]*)+\s*$")


def _time_text(value: Any) -> str | None:
    """A record's time as ISO 8601 (what the classifier's time stamps read), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        # epoch seconds, or milliseconds when too large for seconds
        seconds = value / 1000.0 if value > 1e11 else float(value)
        if not 1e8 < seconds < 1e10:
            return None
        return datetime.fromtimestamp(seconds, tz=UTC).isoformat(timespec="milliseconds").replace(
            "+00:00", "Z")
    if isinstance(value, str):
        text = value.strip()
        m = _SLASHED.match(text)
        if m:  # nvidia-smi's query output: 2024/05/01 10:00:00.123
            return f"{m.group(1)}-{m.group(2)}-{m.group(3)}T{m.group(4)}"
        if _ISO.match(text):
            return text.replace(" ", "T", 1)
    return None


def _scalar(v: Any) -> bool:
    return isinstance(v, (str, int, float)) and not isinstance(v, bool)


def record_line(record: dict[str, Any], prefix: str = "") -> str | None:
    """One record as ``[time ]key=value ...`` (scalars only, one level of nested objects as ``a.b``), or None
    when it holds fewer than two values (a lone value is no record)."""
    fields: list[tuple[str, Any]] = []
    for k, v in record.items():
        if _scalar(v):
            fields.append((str(k), v))
        elif isinstance(v, dict) and _replica_rows(str(k), v) is None:  # a per-replica table gets its own rows
            fields += [(f"{k}.{kk}", vv) for kk, vv in v.items() if _scalar(vv)]
    if len(fields) < 2:
        return None
    when = next((t for k, v in fields if k in _TIME_KEYS and (t := _time_text(v))), None)
    body = " ".join(f"{k}={str(v).strip()}" for k, v in fields if k not in _TIME_KEYS or when is None)
    return " ".join(p for p in (when, prefix, body) if p)


def _replica_rows(name: str, mapping: dict[str, Any]) -> list[str] | None:
    """``{"rank0": "9f3a...", "rank1": ...}`` under ``name``: one ``rank N name=value`` line per entry."""
    rows = []
    for k, v in mapping.items():
        m = _REPLICA_KEY.match(str(k))
        if m is None or not _scalar(v):
            return None
        rows.append(f"{m.group(1) or 'rank'} {m.group(2)} {name or 'value'}={v}")
    return rows if len(rows) >= 2 else None


def json_records(doc: Any) -> list[str]:
    """The record lines of a JSON document, in document order."""
    out: list[str] = []

    def walk(value: Any, name: str, context: str) -> None:
        if len(out) >= MAX_RECORDS:
            return
        if isinstance(value, list):
            for v in value:
                walk(v, name, context)
        elif isinstance(value, dict):
            rows = _replica_rows(name, value)
            if rows is not None:
                out.extend(f"{context} {r}".strip() for r in rows)
                return
            line = record_line(value, context)
            if line is not None:
                out.append(line)
            # an object's scalars give the context (a step, a host) of the tables inside it
            here = " ".join(f"{k}={v}" for k, v in value.items() if _scalar(v) and k not in _TIME_KEYS)[:200]
            for k, v in value.items():
                if isinstance(v, (list, dict)):
                    walk(v, str(k), here or context)

    walk(doc, "", "")
    return out


def is_table_header(line: str) -> bool:
    """Whether ``line`` reads as a CSV/TSV header: two or more names, no values."""
    # a field holding a number ("Epoch 1, loss 0.5") is a value: that line is a log's, not a header
    return _CSV_HEADER.match(line) is not None and not re.search(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])", line)


def csv_records(text: str) -> list[str] | None:
    """A CSV or TSV table (a header row of names, then rows) as one record line per row, the header kept as its
    first line so line numbers stay those of the file; None when the text is no such table."""
    if not is_table_header(text.split("\n", 1)[0]):
        return None
    lines = text.splitlines()
    if len(lines) < 2:
        return None
    delimiter = "\t" if "\t" in lines[0] else ","
    rows = list(csv.reader(io.StringIO(text), delimiter=delimiter, skipinitialspace=True))
    header = [h.strip() for h in rows[0]]
    body = [r for r in rows[1:] if r]
    if not body or sum(len(r) == len(header) for r in body) < max(1, len(body) * 9 // 10):
        return None
    out = [lines[0]]
    for r in rows[1:MAX_RECORDS + 1]:
        line = record_line(dict(zip(header, r, strict=False))) if len(r) == len(header) else None
        out.append(line if line is not None else delimiter.join(r))
    return out


_MD_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)+\|?\s*$")
_MD_ROW = re.compile(r"^\s*\|.*\|\s*$")
_GROUPED_DIGITS = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?![\w,])")
_VALUE_HEADERS = {"value", "values", "count", "reading", "result", "status"}


def _md_cells(line: str) -> list[str]:
    """A markdown table row's cells: code marks dropped, grouped digits joined (``54,731`` -> ``54731``)."""
    cells = line.strip().strip("|").split("|")
    return [_GROUPED_DIGITS.sub(lambda m: m.group(0).replace(",", ""), c.strip().replace("`", "")) for c in cells]


def markdown_records(text: str) -> list[str] | None:
    """The lines of ``text`` with every markdown table's rows as records, or None when it holds no table (a header
    row of cells, then a ``|---|---|`` row: nvidia-smi's boxes, ``+---+`` and ``|===|``, are no such table). A
    two-column table of names and values (``| Field | Value |``) gives one ``name=value`` line per row, any other
    one record per row under the header's names. Other lines stay as they are, and the line count too, so
    evidence points at the pasted text's own lines."""
    lines = text.split("\n")
    out = list(lines)
    found = False
    i = 1
    while i < len(lines):
        if _MD_SEPARATOR.match(lines[i]) and _MD_ROW.match(lines[i - 1]):
            header = _md_cells(lines[i - 1])
            pairs = len(header) == 2 and header[1].lower() in _VALUE_HEADERS
            j = i + 1
            while j < len(lines) and _MD_ROW.match(lines[j]):
                cells = _md_cells(lines[j])
                if pairs and len(cells) == 2 and cells[0]:
                    out[j] = f"{cells[0].replace(' ', '_')}={cells[1]}"
                elif len(cells) == len(header):
                    out[j] = record_line(dict(zip(header, cells, strict=True))) or lines[j]
                j += 1
            found = found or j > i + 1
            i = j
        i += 1
    return out if found else None


def _json_strings(value: Any, out: list[str]) -> None:
    """Every string of a JSON document, in document order, tracebacks first for torchelastic files."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for k in sorted(value, key=lambda k: k != "py_callstack"):
            _json_strings(value[k], out)
    elif isinstance(value, list):
        for v in value:
            _json_strings(v, out)


def json_text(doc: Any) -> str:
    """What the scanner reads of a JSON document: its strings (messages, tracebacks), then its records."""
    parts: list[str] = []
    _json_strings(doc, parts)
    return "\n".join(parts + json_records(doc))


def as_structured(text: str) -> str | None:
    """The text to scan when ``text`` is a JSON document, a CSV table or text holding markdown tables (pasted
    diagnostics), else None (a log: read it as lines)."""
    head = text.lstrip()[:1]
    if head in ("{", "["):
        try:
            return json_text(json.loads(text))
        except (ValueError, RecursionError):
            return None  # a log line that starts with a bracket
    rows = csv_records(text)
    if rows is None:
        rows = markdown_records(text)
    return "\n".join(rows) if rows is not None else None
