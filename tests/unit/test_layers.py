"""The layer rules of docs/architecture.md, checked on the imports of every module (top level and lazy).

* pure analysis and the event language import neither torch (nor `trainguard.torch_api`) nor the web stack;
* nothing but the faces (cli, report, web, metrics) imports a face;
* only `trainguard.torch_api` names torch's private API (tests/unit/test_torch_private_names.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "trainguard"

PURE = (
    "events", "eventlog", "protocol", "rundir", "names", "safefs", "errors", "clocks", "taxonomy", "goodput",
    "goodput_report", "stepfold",
    "plausibility", "resume", "lemon", "sdc", "thermal", "power", "interval_theory", "localize", "classify", "sim",
    "stragglers.analysis", "stragglers.flight", "launch.watchdog", "launch.blame", "launch.policy",
    "launch.budget",
)
"""Modules (or packages) that must run without torch and without the web stack."""
HEAVY = ("torch", "trainguard.torch_api", "starlette", "uvicorn", "jinja2", "plotly", "prometheus_client")
FACES = ("trainguard.cli", "trainguard.report", "trainguard.web", "trainguard.web.metrics")


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
    return out


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _modules() -> list[tuple[str, Path]]:
    return [(_module_name(p), p) for p in sorted(SRC.rglob("*.py"))]


def test_pure_modules_import_neither_torch_nor_the_web_stack() -> None:
    pure = tuple(f"trainguard.{p}" for p in PURE)
    found = [f"{name}:{line} imports {imp}" for name, path in _modules() if _under(name, pure)
             for line, imp in _imports(path) if _under(imp, HEAVY)]
    assert not found, "\n".join(found)


def test_nothing_but_a_face_imports_a_face() -> None:
    entry = ("trainguard", "trainguard.__main__")  # the package's lazy exports and `python -m trainguard`
    found = [f"{name}:{line} imports {imp}" for name, path in _modules()
             if not _under(name, FACES) and name not in entry
             for line, imp in _imports(path) if _under(imp, FACES)]
    assert not found, "\n".join(found)


def test_the_rules_see_real_modules() -> None:
    names = {name for name, _ in _modules()}
    for p in PURE:
        assert any(n == f"trainguard.{p}" or n.startswith(f"trainguard.{p}.") for n in names), p
