"""The exception tree of trainguard, and the exit codes of the command line.

Every error a user can cause (a bad argument, a bad file, a full disk) is a `TrainguardError` with a
one-line message. Errors carry no exit code: only the CLI maps them to one (`trainguard.cli.exit_code_for`);
the codes live here so that every verb shares one table (docs/cli.md).
"""

from __future__ import annotations

# Exit codes shared by every verb (documented in docs/cli.md).
EXIT_OK = 0
EXIT_FAILURE = 1  # the verb ran and found a problem (failed check, failed job, unhealthy node)
EXIT_USAGE = 2  # bad command-line arguments
EXIT_INPUT = 3  # missing, unreadable, corrupt or too-new input files
EXIT_STORAGE = 4  # cannot write results: full disk, permission denied, read-only file system
EXIT_EXCLUDED = 5  # `run`: this node was excluded (health check, lemon list); the job may go on elsewhere
EXIT_UNSUPPORTED = 6  # `run`, `demo`: the installed torch lacks what the verb cannot do without
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_INTERNAL = 70  # a bug in trainguard (the message says how to get the traceback)


class TrainguardError(Exception):
    """Base of all errors trainguard raises on purpose."""


class UsageError(TrainguardError):
    """An argument or configuration value is invalid (absurd size, unknown option value)."""


class InputError(TrainguardError):
    """An input file or directory is missing, unreadable or malformed."""


class EventFormatError(InputError):
    """A line of an event file is not a valid event record."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


class SchemaVersionError(InputError):
    """An event file was written by a newer trainguard whose schema this one cannot read."""

    def __init__(self, path: str, line: int, found: int, supported: int) -> None:
        super().__init__(
            f"{path}:{line}: event schema version {found} is newer than this trainguard "
            f"supports ({supported}); upgrade trainguard to read it"
        )
        self.path = path
        self.line = line
        self.found = found
        self.supported = supported


class StorageError(TrainguardError):
    """Results could not be written (disk full, permission denied)."""


class CheckpointError(TrainguardError):
    """A checkpoint could not be saved, committed, verified or restored (the message says why)."""


class UnsupportedTorchError(TrainguardError):
    """The installed torch lacks a part the verb cannot work without (docs/compatibility.md)."""
