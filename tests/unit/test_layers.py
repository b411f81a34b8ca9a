"""The layer rules of docs/architecture.md, checked on the imports of every module (top level and lazy).

* `trainguard.core` (the event language) imports nothing of trainguard but itself and `trainguard.errors`;
* pure analysis and the core import neither torch (nor `trainguard.torch_api`) nor the web stack;
* nothing but the faces (cli, report, web) imports a face;
* the package root holds only `__init__`, `__main__` and `errors`;
* reports work without numpy (the `sim` extra);
* only `trainguard.torch_api` names torch's private API (tests/unit/test_torch_private_names.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "trainguard"

PURE = (
    "core", "errors", "accounting", "health.lemon", "health.fleetdb", "sdc.verdict", "telemetry",
    "localize", "classify", "sim", "stragglers.analysis", "stragglers.flight", "launch.watchdog", "launch.blame",
    "launch.policy", "launch.budget", "launch.settings", "launch.attempts",
)
"""Modules (or packages) that must run without torch and without the web stack."""
HEAVY = ("torch", "trainguard.torch_api", "starlette", "uvicorn", "jinja2", "plotly", "prometheus_client")
FACES = ("trainguard.cli", "trainguard.report", "trainguard.web")
ROOT_MODULES = {"__init__.py", "__main__.py", "errors.py", "py.typed"}
"""All the package root may hold besides packages (docs/architecture.md)."""


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


def test_core_imports_nothing_of_the_features() -> None:
    allowed = ("trainguard.core", "trainguard.errors")
    found = [f"{name}:{line} imports {imp}" for name, path in _modules() if _under(name, ("trainguard.core",))
             for line, imp in _imports(path)
             if _under(imp, ("trainguard",)) and not _under(imp, allowed) and imp != "trainguard"]
    assert not found, "\n".join(found)


def test_the_package_root_holds_only_the_entry_points_and_errors() -> None:
    files = {p.name for p in SRC.iterdir() if p.is_file()}
    assert files == ROOT_MODULES, sorted(files ^ ROOT_MODULES)


def test_a_report_needs_no_numpy(tmp_path: Path) -> None:
    """numpy is the `sim` extra: `trainguard report` (text and HTML) runs with numpy made unimportable."""
    import subprocess
    import sys

    from trainguard.samples import SAMPLE_RUN

    script = (
        "import sys; sys.modules['numpy'] = None\n"  # any `import numpy` now raises ImportError
        "from trainguard.cli import main\n"
        f"sys.exit(main(['report', {str(SAMPLE_RUN)!r}, '--html', {str(tmp_path / 'r.html')!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "r.html").stat().st_size > 10_000
