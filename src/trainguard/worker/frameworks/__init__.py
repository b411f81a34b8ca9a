"""Framework adapters: exact steps, resume points and checkpoint times from the framework's own callbacks.

`trainguard.worker.bootstrap` watches the modules in `MODULES` as it watches ``torch.optim``: right after the
script imports one of them, `on_import` installs that framework's adapter, which gives every trainer the
framework builds a callback of the framework's own kind (a ``TrainerCallback``, a Lightning ``Callback``).
No script change; ``TRAINGUARD_FRAMEWORKS=0`` in the workers' environment (``trainguard run
--no-framework-adapters``) turns the adapters off, and steps are then counted by the optimizer hooks alone.

The adapters report through `trainguard.worker.frameworks.reporter`; what each reports is in its module and
in docs/run.md ("Frameworks"). A framework version an adapter does not recognise (no trainer class, no
callback list) gets no adapter: the optimizer hooks count its steps, as for any script.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from types import ModuleType

log = logging.getLogger(__name__)

ENV = "TRAINGUARD_FRAMEWORKS"
"""``0`` turns the framework adapters off (anything else, or unset: on)."""
MODULES = {
    "transformers.trainer": "transformers",
    "lightning.pytorch.trainer.trainer": "lightning",
    "pytorch_lightning.trainer.trainer": "lightning",
}
"""Module whose import installs an adapter -> the framework."""


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the adapters are on in this process (``TRAINGUARD_FRAMEWORKS`` is not ``0``)."""
    env = os.environ if environ is None else environ
    return env.get(ENV, "1").strip() != "0"


def on_import(name: str, module: ModuleType) -> bool:
    """Install the adapter of the framework whose module ``name`` was just imported; never raises."""
    framework = MODULES.get(name)
    if framework is None or not enabled():
        return False
    try:
        if framework == "transformers":
            from trainguard.worker.frameworks import hf

            return hf.install(module)
        from trainguard.worker.frameworks import lightning

        return lightning.install(module)
    except Exception as exc:  # an adapter must never break the script's import of its framework
        log.warning("trainguard: no %s adapter (%s); steps come from the optimizer hooks", framework, exc)
        return False
