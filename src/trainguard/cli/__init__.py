"""The ``trainguard`` command line: one module per verb in this package, dispatched from `main`.

A verb module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``. It
imports heavy dependencies (torch, numpy) inside ``run`` so ``trainguard --help`` stays fast.
Only this module configures logging.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from trainguard import __version__
from trainguard.errors import (
    EXIT_FAILURE,
    EXIT_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_STORAGE,
    EXIT_UNSUPPORTED,
    EXIT_USAGE,
    CheckpointError,
    InputError,
    StorageError,
    TrainguardError,
    UnsupportedTorchError,
    UsageError,
)
from trainguard.report.inert import for_terminal

# Order shown in --help. Every verb listed has its module here (tests/unit/test_cli_verbs.py checks it).
VERBS = (
    "run",
    "demo",
    "report",
    "index",
    "diagnose",
    "classify",
    "health",
    "hosts",
    "stragglers",
    "simulate",
    "plan",
    "serve",
)

log = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _verb_modules() -> dict[str, ModuleType]:
    # No verb is skipped quietly: a missing module is a packaging bug and fails loudly.
    return {verb: importlib.import_module(f"trainguard.cli.{verb}") for verb in VERBS}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainguard", description="Keep large training jobs training.")
    parser.add_argument("--version", action="version", version=f"trainguard {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    for verb, module in _verb_modules().items():
        p = sub.add_parser(verb, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


# Only the command line knows exit codes; errors carry none. First match wins (subclasses first).
_EXIT_CODES: tuple[tuple[type[TrainguardError], int], ...] = (
    (UsageError, EXIT_USAGE),
    (InputError, EXIT_INPUT),
    (StorageError, EXIT_STORAGE),
    (CheckpointError, EXIT_STORAGE),
    (UnsupportedTorchError, EXIT_UNSUPPORTED),
)


def exit_code_for(exc: TrainguardError) -> int:
    """The exit code of a verb that ended with ``exc`` (docs/cli.md)."""
    return next((code for kind, code in _EXIT_CODES if isinstance(exc, kind)), EXIT_FAILURE)


def _storage_errno(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


class _InertFormatter(logging.Formatter):
    """Log lines quote run data (host names, paths, record fields): made inert for the terminal like all output."""

    def format(self, record: logging.LogRecord) -> str:
        return for_terminal(super().format(record))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_InertFormatter("trainguard: %(levelname)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    if not args.verb:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args._run(args))
    except TrainguardError as exc:
        print(for_terminal(f"trainguard {args.verb}: error: {exc}"), file=sys.stderr)
        return exit_code_for(exc)
    except KeyboardInterrupt:
        print(f"trainguard {args.verb}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout closed early (e.g. piped into `head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        if args.debug:
            raise
        code = EXIT_STORAGE if _storage_errno(exc) else EXIT_INPUT
        where = f" ({exc.filename})" if exc.filename else ""
        print(for_terminal(f"trainguard {args.verb}: error: {exc.strerror or exc}{where}"), file=sys.stderr)
        return code
    except Exception as exc:
        if args.debug:
            raise
        log.debug("internal error", exc_info=True)
        print(
            for_terminal(f"trainguard {args.verb}: internal error: {exc.__class__.__name__}: {exc} "
                         "(rerun with --debug for the traceback)"),
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def entry_point() -> None:
    sys.exit(main())
