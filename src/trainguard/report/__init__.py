"""Faces that present analysis results: the terminal report (HTML and dashboard come later)."""
