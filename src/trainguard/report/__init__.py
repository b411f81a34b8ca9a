"""Faces that present analysis results: the terminal report, the data of a run's charts (`view`), used by the
dashboard (`trainguard.web`), the self-contained HTML report (`html`), and `inert`: run data made safe to
print on a terminal."""
