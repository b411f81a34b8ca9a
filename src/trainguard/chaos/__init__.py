"""Fault injection: the ``--inject`` grammar, its pre-launch check and the in-rank injector."""
