"""The one place in trainguard that names a private torch symbol.

torch has no public API for what a supervisor needs from inside the elastic agent (its per-round hooks, the
worker processes, the restart budget), from the rendezvous (leaving a round, counting waiting spares), from
c10d (flight-recorder dumps, aborting communicators) or from DCP (flattening a nested state dict). Each such
use is wrapped here once, feature-detected rather than compared by version string, and reported by
`trainguard.torch_api.features.probe` so that a torch release that moves one says so in one line at start
instead of failing later. ``tests/unit/test_torch_private_names.py`` fails when any other module names a
private torch symbol; ``tests/unit/test_torch_api.py`` fails when torch moves one of those wrapped here.

Submodules (each imports torch; import them only from the torch edge):

* `trainguard.torch_api.elastic`: `ElasticAgentBase` (torch's LocalElasticAgent with its private hooks as
  named methods), worker process handles;
* `trainguard.torch_api.rendezvous`: leave a c10d rendezvous round, count waiting spares;
* `trainguard.torch_api.c10d`: flight-recorder dumps (gloo and NCCL, pickle and JSON), communicator abort;
* `trainguard.torch_api.dcp`: flattening a nested state dict the way DCP names its entries;
* `trainguard.torch_api.features`: which of the above the installed torch offers (`probe`).
"""

SUPPORTED = ">=2.11,<2.16"
"""The torch range trainguard supports (pyproject's requirement; docs/compatibility.md)."""
