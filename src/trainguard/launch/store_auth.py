"""Authenticated keys in the rendezvous store: torch's TCPStore lets any local user read and write it.

Every key trainguard writes there for a decision (a node leaving for a spare, the one node that records a
failure) is bound to a per-job secret: decisions carry an HMAC-SHA256 tag over their content, and claim keys
have the tag in their name, so a user without the secret can neither forge a decision nor guess a claim.
The secret is ``$TRAINGUARD_JOB_SECRET`` when the launcher or scheduler sets it (several nodes without a
shared run directory need that), else a 0600 file in the run directory that the first agent creates and
the others read. A file that is a link, not ours, or readable by others is refused: whoever planted it would
know the key. docs/security.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.errors import UsageError

log = logging.getLogger(__name__)

SECRET_ENV = "TRAINGUARD_JOB_SECRET"
"""A job secret set by the launcher or scheduler (at least 16 characters); wins over the file."""
SECRET_FILE = ".job-secret"
"""The secret's file in the run directory (0600, created once, O_EXCL)."""
MIN_SECRET_CHARS = 16
MAX_SECRET_CHARS = 1024
ENV_PREFIX = b"TRAINGUARD_"


def check_environment(environb: dict[bytes, bytes] | None = None) -> None:
    """`UsageError` (one line) unless every ``TRAINGUARD_*`` variable is UTF-8 and the job secret, if set, is
    well formed. Called before anything is created on disk: a bad value otherwise fails deep inside a run."""
    env = os.environb if environb is None else environb
    for name, value in sorted(env.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        shown = name.decode("ascii", "backslashreplace")
        try:
            name.decode("utf-8")
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"${shown} is not valid UTF-8 text") from None
        if name == SECRET_ENV.encode():
            check_secret(text)


def check_secret(secret: str) -> None:
    """A job secret: 16 to 1024 printable characters, no spaces (it travels on lines and through pipes)."""
    if not MIN_SECRET_CHARS <= len(secret) <= MAX_SECRET_CHARS:
        raise UsageError(f"${SECRET_ENV} must have {MIN_SECRET_CHARS} to {MAX_SECRET_CHARS} characters")
    if not secret.isprintable() or any(c.isspace() for c in secret):
        raise UsageError(f"${SECRET_ENV} must be printable characters without spaces (e.g. openssl rand -hex 32)")


@dataclass(frozen=True)
class StoreSigner:
    """Tags and checks trainguard's store values with the job's secret."""

    key: bytes
    """The secret (never logged or written anywhere but its own file)."""

    def tag(self, *parts: str) -> str:
        """HMAC-SHA256 of ``parts`` (joined unambiguously), hex."""
        message = "\x1f".join(f"{len(p)}:{p}" for p in parts).encode()
        return hmac.new(self.key, message, hashlib.sha256).hexdigest()

    def claim_key(self, base: str) -> str:
        """A store key under ``base`` that only holders of the secret can name."""
        return f"{base}/{self.tag('claim', base)[:32]}"

    def sign(self, context: str, fields: dict[str, str]) -> bytes:
        """``fields`` as JSON with a ``mac`` over ``context`` and every field (``context`` names the key)."""
        mac = self.tag(context, *(f"{k}={fields[k]}" for k in sorted(fields)))
        return json.dumps({**fields, "mac": mac}).encode()

    def verify(self, context: str, raw: bytes, names: tuple[str, ...], report: bool = True) -> dict[str, str] | None:
        """The fields of a value `sign` made for ``context``, or None (with an error logged unless not
        ``report``) when it is malformed, lacks a field of ``names``, or its tag does not verify."""
        try:
            data: Any = json.loads(bytes(raw).decode())
        except (ValueError, UnicodeDecodeError):
            data = None
        # Errors, not warnings: someone else writes into this job's store, and the console must say so.
        if not isinstance(data, dict) or not all(isinstance(data.get(n), str) for n in (*names, "mac")):
            if report:
                log.error("ignored a malformed value under %s in the rendezvous store", context)
            return None
        fields = {n: data[n] for n in names}
        expected = self.tag(context, *(f"{k}={fields[k]}" for k in sorted(fields)))
        if not hmac.compare_digest(expected, data["mac"]):
            if report:
                log.error("ignored an unsigned or forged value under %s in the rendezvous store "
                          "(another local user may be writing to it)", context)
            return None
        return fields


def job_signer(run_dir: Path, environ: dict[str, str] | None = None) -> StoreSigner:
    """The job's signer: from `SECRET_ENV`, else the run directory's `SECRET_FILE` (made if missing)."""
    env = os.environ if environ is None else environ
    given = env.get(SECRET_ENV)
    if given is not None:
        try:
            key = given.encode()
        except UnicodeEncodeError:  # os.environ keeps undecodable bytes as surrogates
            raise UsageError(f"${SECRET_ENV} is not valid UTF-8 text") from None
        check_secret(given)
        return StoreSigner(key)
    return StoreSigner(_secret_file(run_dir / SECRET_FILE))


def _secret_file(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read_secret(path)
    except OSError as exc:
        raise UsageError(f"cannot create the job secret {path}: {exc.strerror}") from None
    secret = secrets.token_hex(32).encode()
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, secret)
        os.fsync(fd)
    finally:
        os.close(fd)
    return secret


def _read_secret(path: Path) -> bytes:
    for _ in range(50):  # another agent of this run may be writing it right now
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise UsageError(f"refusing the job secret {path}: {exc.strerror} (a link?)") from None
        with contextlib.closing(os.fdopen(fd, "rb")) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise UsageError(f"refusing the job secret {path}: it must be a regular 0600 file of this user")
            data = f.read(256)
        if len(data) >= MIN_SECRET_CHARS:
            return data
        import time

        time.sleep(0.02)
    raise UsageError(f"refusing the job secret {path}: it is empty")
