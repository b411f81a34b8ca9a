"""trainguard's start-up hook for workers: installs the post-import finder, then runs any other sitecustomize.

Python imports the first ``sitecustomize`` on ``sys.path``; this folder is first on a worker's path, so
this file runs the one it shadows (a distribution's or the user's) too. Everything here is guarded: a
failure is silent and leaves the interpreter as if this file did not exist.
"""

import os
import sys


def _trainguard_bootstrap() -> None:
    if os.environ.get("TRAINGUARD_AUTO") != "1" or not os.environ.get("TRAINGUARD_AGENT_PID"):
        return
    # Load bootstrap.py by path: importing it as trainguard.worker.bootstrap would import the trainguard
    # package at every interpreter start, torch job or not.
    from importlib.machinery import ModuleSpec, SourceFileLoader

    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(os.path.dirname(here), "bootstrap.py")
    name = "_trainguard_bootstrap"
    loader = SourceFileLoader(name, path)
    module = type(sys)(name)
    module.__file__ = path
    module.__loader__ = loader
    module.__spec__ = ModuleSpec(name, loader, origin=path)
    sys.modules[name] = module
    try:
        loader.exec_module(module)
        module.install()
    except Exception:
        sys.modules.pop(name, None)


def _chain_next_sitecustomize() -> None:
    from importlib.machinery import PathFinder

    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    entries = [p for p in sys.path if isinstance(p, str)]
    mine = [i for i, p in enumerate(entries) if os.path.realpath(p or os.curdir) == here]
    later = entries[mine[0] + 1:] if mine else [p for p in entries if os.path.realpath(p or os.curdir) != here]
    spec = PathFinder.find_spec("sitecustomize", later)
    if spec is None or spec.loader is None:
        return
    module = type(sys)("sitecustomize")
    module.__file__ = spec.origin
    module.__loader__ = spec.loader
    module.__spec__ = spec
    spec.loader.exec_module(module)
    # It is now the process's sitecustomize, as it would have been without this folder.
    sys.modules["sitecustomize"] = module


try:  # noqa: SIM105 - contextlib is not loaded at start-up; importing it would cost ~2 ms
    _trainguard_bootstrap()
except Exception:
    pass
_chain_next_sitecustomize()
