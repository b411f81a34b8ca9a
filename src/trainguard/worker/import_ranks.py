"""Framework modules known to read a rank's variables at import, and how a rank forked or taken over after they
were loaded ahead gets the value its own import would have computed.

A module that reads ``RANK`` at import and keeps what it saw makes a warm spare or fork server unfit for it
(`trainguard.worker.warm`): loaded ahead, it would keep the server's value in every rank. For the frameworks
below the kept value is one attribute whose derivation is known, so the module is loaded ahead all the same
and the attribute is set again from the rank's own environment when the process becomes that rank, before the
script runs. A module not in this table that reads a rank's variables still loads after the fork.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType

log = logging.getLogger(__name__)


def _lightning_rank(module: ModuleType, env: Mapping[str, str]) -> None:
    """What ``lightning/fabric/utilities/rank_zero.py`` computes at import (Lightning 2.x, also the standalone
    ``lightning_fabric``): ``rank_zero_only.rank`` = the first of ``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID``,
    ``JSM_NAMESPACE_RANK`` that is set, else 0. The function object is lightning_utilities' own, shared by
    ``lightning.pytorch`` and ``lightning.fabric``: it gates every ``rank_zero_info``/``rank_zero_warn``."""
    value = 0
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        if key in env:
            value = int(env[key])
            break
    module.rank_zero_only.rank = value


def _torchmetrics_rank(module: ModuleType, env: Mapping[str, str]) -> None:
    """What ``torchmetrics/utilities/prints.py`` computes at import: its own ``rank_zero_only.rank`` =
    ``LOCAL_RANK``, else 0."""
    module.rank_zero_only.rank = int(env.get("LOCAL_RANK", 0))


@dataclass(frozen=True)
class ImportTimeRead:
    """A module that reads a rank's variables at import and keeps one value derived from them."""

    module: str
    """The module whose code reads the variables (the frame that reads them, not the script's import)."""
    refresh: Callable[[ModuleType, Mapping[str, str]], None]
    """Sets the kept value again from a rank's environment."""


KNOWN: dict[str, ImportTimeRead] = {r.module: r for r in (
    ImportTimeRead("lightning.fabric.utilities.rank_zero", _lightning_rank),
    ImportTimeRead("lightning_fabric.utilities.rank_zero", _lightning_rank),
    ImportTimeRead("torchmetrics.utilities.prints", _torchmetrics_rank),
)}
"""By reading module. Found by watching ``import lightning`` (2.6) read ``RANK``/``LOCAL_RANK``: see
docs/run.md ("Fork server")."""


def _refresh(name: str, module: ModuleType, env: Mapping[str, str]) -> Exception | None:
    """Set ``module``'s kept value from ``env``; the error if this release of it cannot be (renamed attribute)."""
    try:
        KNOWN[name].refresh(module, env)
    except (AttributeError, TypeError, ValueError) as exc:
        return exc
    return None


def covered(reader: str, env: Mapping[str, str]) -> bool:
    """Whether reads by ``reader`` (a module name) can be set right after the fork: it is in `KNOWN` and its
    refresh works on the loaded module (a framework release that renamed the attribute is not covered)."""
    module = sys.modules.get(reader)
    if reader not in KNOWN or module is None:
        return False
    error = _refresh(reader, module, env)
    if error is not None:
        log.debug("import-time rank of %s cannot be set again (%s)", reader, error)
    return error is None


def refresh_loaded(env: Mapping[str, str]) -> list[str]:
    """Set every loaded `KNOWN` module's kept value from ``env`` (the rank's environment); returns their names."""
    done = []
    for name in KNOWN:
        module = sys.modules.get(name)
        if module is None:
            continue
        error = _refresh(name, module, env)
        if error is not None:  # `covered` tried it while loading: not expected
            log.warning("%s keeps the rank it saw while loaded ahead (%s)", name, error)
            continue
        done.append(name)
    return done
