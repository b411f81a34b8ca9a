"""Bundled sample data (clearly labeled synthetic) so the tools can be tried before any training."""

from pathlib import Path

SAMPLE_RUN = Path(__file__).parent / "sample-run"
"""A synthetic run directory written by `trainguard.samples.generate`."""
