"""Training scripts that ship with trainguard: ``train_gpt`` is the demo's reference workload.

Run it as a module under the launcher, e.g. ``trainguard run --nproc-per-node 2 -m trainguard.examples.train_gpt``
(or ``torchrun ... -m trainguard.examples.train_gpt --no-trainguard`` for a baseline).
"""
