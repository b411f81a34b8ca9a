"""No module outside `trainguard.torch_api` names a private torch symbol.

The set of torch's private names is read from the installed torch itself (the modules trainguard builds
on: elastic agent, process contexts, rendezvous, c10d, DCP), so a name torch adds in a later release is
caught without editing this test. A private name counts when trainguard's code imports it, imports a
module whose path has a private part, reaches it as an attribute, defines it in a subclass of a torch
class, or spells it in a string (``getattr(obj, "_x")``).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "trainguard"
OWNER = SRC / "torch_api"

TORCH_MODULES = (
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.agent.server.local_elastic_agent",
    "torch.distributed.elastic.multiprocessing.api",
    "torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler",
    "torch.distributed.elastic.rendezvous.api",
    "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
    "torch.distributed.elastic.rendezvous.static_tcp_rendezvous",
    "torch.distributed.launcher.api",
    "torch.distributed.run",
    "torch.distributed.distributed_c10d",
    "torch.distributed.checkpoint.state_dict_saver",
    "torch.distributed.checkpoint.state_dict_loader",
    "torch.distributed.checkpoint.filesystem",
)


def _private(name: str) -> bool:
    return len(name) > 1 and name.startswith("_") and not name.startswith("__") and name.isidentifier()


def _names_in(source: str) -> set[str]:
    """Private names a piece of torch source defines or uses: functions, classes, attributes, globals."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and _private(node.name):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _private(node.id):
            names.add(node.id)
    return names


@cache
def _class_private_names(module: str, name: str) -> frozenset[str]:
    """The private names of torch class ``module.name`` and every torch class above it."""
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return frozenset()
    if not isinstance(cls, type):
        return frozenset()
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] == "torch":
            try:
                names |= _names_in(textwrap.dedent(inspect.getsource(klass)))
            except (OSError, TypeError):
                names |= {n for n in vars(klass) if _private(n)}
    return frozenset(names)


@cache
def torch_private_names() -> frozenset[str]:
    """Every private name torch defines in the modules above: functions, methods, attributes, classes,
    and the members of ``torch._C._distributed_c10d``."""
    names: set[str] = set()
    for mod_name in TORCH_MODULES:
        try:
            names |= _names_in(inspect.getsource(importlib.import_module(mod_name)))
        except (ImportError, OSError, TypeError):
            continue
    c10d = importlib.import_module("torch._C._distributed_c10d")
    names.update(n for n in dir(c10d) if _private(n))
    return frozenset(names)


def _imports(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Local name -> (module, name) for every absolute ``from M import X``: a base class imported from
    anywhere (``trainguard.torch_api`` too) is resolved to find the torch classes above it."""
    return {a.asname or a.name: (node.module or "", a.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
            and node.module.split(".")[0] in ("torch", "trainguard") for a in node.names}


def violations(path: Path) -> list[str]:
    """``file:line: what`` for every private torch name ``path`` uses."""
    tree = ast.parse(path.read_text(), filename=str(path))
    private = torch_private_names()
    imported = _imports(tree)
    found: list[str] = []

    def hit(node: ast.AST, what: str) -> None:
        found.append(f"{path.relative_to(SRC.parent)}:{getattr(node, 'lineno', 0)}: {what}")

    # Inside a subclass of a torch class, ``self._x`` and ``def _x`` are torch's when torch's class has _x.
    inherited: dict[int, frozenset[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            base_names: frozenset[str] = frozenset()
            for b in node.bases:
                if isinstance(b, ast.Name) and b.id in imported:
                    base_names |= _class_private_names(*imported[b.id])
            if base_names:
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name in base_names:
                        hit(item, f"overrides torch's {item.name}")
                inherited.update((id(n), base_names) for n in ast.walk(node))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for m in modules:
                if m.split(".")[0] == "torch" and any(_private(part) for part in m.split(".")):
                    hit(node, f"imports private module {m}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
                for a in node.names:
                    if _private(a.name):
                        hit(node, f"imports private {a.name}")
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if (node.attr in inherited.get(id(node), ())) if on_self else (node.attr in private):
                hit(node, f"reaches private {node.attr}")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and _private(node.value)
              and node.value in private):
            hit(node, f"spells private {node.value!r}")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("torch.")
              and any(_private(p) for p in node.value.split(".")) and " " not in node.value):
            hit(node, f"names private module {node.value!r}")
    return found


def test_the_scan_sees_torch_private_names() -> None:
    # The scan is only as good as the name set: it must hold the names trainguard is known to need.
    names = torch_private_names()
    for known in ("_monitor_workers", "_pcontext", "_remaining_restarts", "_state_holder", "_dump_fr_trace"):
        assert known in names, known


def test_the_scan_flags_each_kind_of_use(tmp_path: Path) -> None:
    sample = SRC / "launch" / "_scan_sample.py"
    sample.write_text(
        "import torch._C._distributed_c10d as c10d\n"
        "from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent\n"
        "from torch.distributed.checkpoint._nested_dict import flatten_state_dict\n"
        "class A(LocalElasticAgent):\n"
        "    def _monitor_workers(self, wg):\n"
        "        return self._pcontext\n"
        "from trainguard.torch_api.elastic import ElasticAgentBase\n"
        "class B(ElasticAgentBase):\n"
        "    def on_monitor(self, wg):\n"
        "        return self._remaining_restarts\n"
        "def f(agent, h):\n"
        "    agent._remaining_restarts -= 1\n"
        "    return getattr(h, '_state_holder', None), 'torch._inductor.config'\n")
    try:
        found = "\n".join(violations(sample))
    finally:
        sample.unlink()
    for expected in ("imports private module torch._C._distributed_c10d", "imports private module "
                     "torch.distributed.checkpoint._nested_dict", "overrides torch's _monitor_workers",
                     "reaches private _pcontext", "reaches private _remaining_restarts",
                     "_scan_sample.py:10: reaches private _remaining_restarts",
                     "spells private '_state_holder'", "names private module 'torch._inductor.config'"):
        assert expected in found, expected


def test_no_private_torch_name_outside_torch_api() -> None:
    files = [p for p in SRC.rglob("*.py") if OWNER not in p.parents]
    found = [v for p in sorted(files) for v in violations(p)]
    assert not found, "private torch names outside trainguard.torch_api:\n" + "\n".join(found)
