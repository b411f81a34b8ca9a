"""``trainguard --help`` lists exactly the verbs that exist, and each of them answers ``--help``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
from pathlib import Path

import pytest

import trainguard.cli as cli

CLI_DIR = Path(cli.__file__).parent


def _verb_module_names() -> set[str]:
    """Modules of the cli package that define a verb (``HELP``, ``add_arguments``, ``run``)."""
    names = set()
    for path in CLI_DIR.glob("*.py"):
        if path.stem == "__init__":
            continue
        module = importlib.import_module(f"trainguard.cli.{path.stem}")
        if all(hasattr(module, attr) for attr in ("HELP", "add_arguments", "run")):
            names.add(path.stem)
    return names


def test_the_verbs_listed_are_the_verb_modules() -> None:
    assert set(cli.VERBS) == _verb_module_names()
    assert len(cli.VERBS) == len(set(cli.VERBS))


def test_help_lists_every_verb_in_order_and_nothing_else() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(cli.VERBS)
    text = parser.format_help()
    # verb lines are indented by exactly four spaces (wrapped help text by more)
    listed = [line.split()[0] for line in text.splitlines() if line.startswith("    ") and line[4:5].isalpha()]
    assert listed == list(cli.VERBS)


@pytest.mark.parametrize("verb", cli.VERBS)
def test_each_verb_answers_help(verb: str) -> None:
    out = io.StringIO()
    with pytest.raises(SystemExit) as stop, contextlib.redirect_stdout(out):
        cli.main([verb, "--help"])
    assert stop.value.code == 0
    assert out.getvalue().startswith(f"usage: trainguard {verb}")
