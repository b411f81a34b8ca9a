"""``python -m trainguard`` runs the command line."""

from trainguard.cli import entry_point

entry_point()
