"""Faces that present analysis results: the terminal report, the data of a run's charts (`view`), used by the
dashboard (`trainguard.web`), and the self-contained HTML report (`html`)."""
