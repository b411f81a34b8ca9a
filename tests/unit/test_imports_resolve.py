"""Every trainguard import written anywhere in src/ or tests/ names something that exists, lazy imports too.

Lazy imports inside functions (and inside ``try: ... except Exception`` in the worker, where a wrong name
would silently turn a feature off) are not seen by mypy when the package has a module ``__getattr__``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _trainguard_imports() -> list[tuple[str, int, str, str | None]]:
    """(file, line, module, name or None) of every absolute import of a trainguard module."""
    out: list[tuple[str, int, str, str | None]] = []
    for folder in ("src", "tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if isinstance(node, ast.Import):
                    out.extend((rel, node.lineno, a.name, None) for a in node.names
                               if a.name.split(".")[0] == "trainguard")
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                        and node.module.split(".")[0] == "trainguard":
                    out.extend((rel, node.lineno, node.module, a.name) for a in node.names)
    return out


def _resolves(module: str, name: str | None) -> bool:
    spec = importlib.util.find_spec(module)
    if spec is None:
        return False
    if name is None or name == "*":
        return True
    if spec.submodule_search_locations is not None \
            and importlib.util.find_spec(f"{module}.{name}") is not None:
        return True  # a submodule of a package
    return hasattr(importlib.import_module(module), name)


def test_the_scan_sees_lazy_imports() -> None:
    found = _trainguard_imports()
    assert len(found) > 500
    assert any(f.endswith("worker/autohooks.py") and m == "trainguard.sdc" for f, _, m, _ in found)


def test_every_trainguard_import_resolves() -> None:
    broken = [f"{f}:{line} from {m} import {n}" if n else f"{f}:{line} import {m}"
              for f, line, m, n in _trainguard_imports() if not _resolves(m, n)]
    assert not broken, "\n".join(broken)
