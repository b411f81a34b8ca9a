"""Store values are signed with the job's secret; forged ones and planted secrets are refused."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest

from trainguard.errors import UsageError
from trainguard.launch.store_auth import SECRET_ENV, SECRET_FILE, StoreSigner, job_signer
from trainguard.stragglers.handover import StoreHandover


def test_sign_and_verify_round_trip_and_forgeries_fail() -> None:
    s = StoreSigner(b"a-secret-of-sixteen+")
    raw = s.sign("k", {"node": "h1", "reason": "slow"})
    assert s.verify("k", raw, ("node", "reason")) == {"node": "h1", "reason": "slow"}
    assert s.verify("other-key", raw, ("node", "reason")) is None  # replayed under another key
    forged = json.dumps({"node": "h1", "reason": "slow", "mac": "0" * 64}).encode()
    assert s.verify("k", forged, ("node", "reason")) is None
    assert s.verify("k", json.dumps({"node": "h1", "reason": "slow"}).encode(), ("node", "reason")) is None
    assert s.verify("k", b"\xff not json", ("node",)) is None
    tampered = json.loads(raw)
    tampered["node"] = "h2"
    assert s.verify("k", json.dumps(tampered).encode(), ("node", "reason")) is None
    assert StoreSigner(b"another-secret-16+").verify("k", raw, ("node", "reason")) is None


def test_claim_keys_depend_on_the_secret() -> None:
    a, b = StoreSigner(b"secret-number-one!"), StoreSigner(b"secret-number-two!")
    base = "trainguard/run/failure/1"
    assert a.claim_key(base).startswith(base + "/") and a.claim_key(base) == a.claim_key(base)
    assert a.claim_key(base) != b.claim_key(base)


def test_the_run_dir_secret_is_made_once_0600_and_shared(tmp_path: Path) -> None:
    first = job_signer(tmp_path, environ={})
    path = tmp_path / SECRET_FILE
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert job_signer(tmp_path, environ={}).key == first.key


def test_planted_or_readable_secrets_are_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("attacker-known-secret-value")
    os.symlink(tmp_path / "elsewhere", tmp_path / SECRET_FILE)
    with pytest.raises(UsageError, match="refusing the job secret"):
        job_signer(tmp_path, environ={})
    other = tmp_path / "b"
    other.mkdir()
    (other / SECRET_FILE).write_text("attacker-known-secret-value")
    os.chmod(other / SECRET_FILE, 0o644)
    with pytest.raises(UsageError, match="regular 0600 file"):
        job_signer(other, environ={})


def test_the_environment_secret_wins_and_must_be_long(tmp_path: Path) -> None:
    assert job_signer(tmp_path, environ={SECRET_ENV: "x" * 16}).key == b"x" * 16
    assert not (tmp_path / SECRET_FILE).exists()
    with pytest.raises(UsageError, match="16 to 1024 characters"):
        job_signer(tmp_path, environ={SECRET_ENV: "short"})


def test_an_unsigned_announcement_in_a_real_store_is_ignored() -> None:
    torch_dist = pytest.importorskip("torch.distributed")
    store = torch_dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    ours = StoreHandover(lambda: store, "run", object(), StoreSigner(b"the-job-secret-1234"))
    store.set("trainguard/run/straggler-leave/0", json.dumps({"node": "h1", "reason": "forged"}))
    assert ours.announced(0) is None
    ours.announce(1, "h1", "rank 3 is 1.3x slower")
    assert ours.announced(1) == ("h1", "rank 3 is 1.3x slower")
