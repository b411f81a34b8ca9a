"""docs/compatibility.md's support matrix says of the installed torch exactly what `probe()` finds."""

from __future__ import annotations

from pathlib import Path

from trainguard.torch_api.features import probe

DOC = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"


def matrix() -> dict[str, dict[str, bool]]:
    """torch minor version ("2.13") -> capability -> documented availability."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "support-matrix" in line) + 1
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows: dict[str, dict[str, bool]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = {name: value == "yes" for name, value in zip(header[2:], cells[2:], strict=True)}
    return rows


def test_the_matrix_has_a_row_per_supported_minor_version() -> None:
    assert list(matrix()) == ["2.11", "2.12", "2.13", "2.14", "2.15"]


def test_the_installed_torch_row_matches_what_probe_finds() -> None:
    support = probe()
    minor = ".".join(support.version.split("+")[0].split(".")[:2])
    row = matrix()[minor]
    assert row == support.to_json()["features"]
