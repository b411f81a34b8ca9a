"""The signed rendezvous backend: states it writes carry the job's HMAC, and a state in the store that is
unsigned, signed with another key or undecodable is refused before torch could unpickle it."""

from __future__ import annotations

import base64
import logging
import pickle
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

from trainguard.launch.signed_rendezvous import MAGIC, REFUSED, SignedStateBackend, c10d_raw_read
from trainguard.launch.store_auth import StoreSigner

RUN = "job"
KEY = f"torch.rendezvous.{RUN}"
OURS = StoreSigner(b"the-job-secret-0123456789")


class _Marker:
    """A pickle that creates a file when loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


@pytest.fixture
def store() -> Any:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))


def _backend(store: Any, signer: StoreSigner = OURS) -> SignedStateBackend:
    return SignedStateBackend(C10dRendezvousBackend(store, RUN), signer, RUN, c10d_raw_read(store, RUN))


def _forge(store: Any, marker: Path) -> None:
    store.set(KEY, base64.b64encode(pickle.dumps(_Marker(marker))).decode())


@pytest.mark.timeout(30)
def test_states_are_signed_and_read_back(store: Any) -> None:
    backend = _backend(store)
    assert backend.get_state() is None
    state, token, has_set = backend.set_state(b"state-1") or (b"", None, False)
    assert (state, has_set) == (b"state-1", True)
    raw = base64.b64decode(store.get(KEY))
    assert raw.startswith(MAGIC) and raw.endswith(b"state-1") and raw != MAGIC + b"state-1"
    assert _backend(store).get_state() == (b"state-1", token)  # another agent with the same secret
    assert backend.name == "c10d" and not backend.refusals


@pytest.mark.timeout(30)
def test_a_forged_state_is_never_unpickled_and_is_overwritten(store: Any, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    backend = _backend(store)
    backend.set_state(b"good")
    marker = tmp_path / "pwned"
    for _ in range(3):
        _forge(store, marker)
        with caplog.at_level(logging.DEBUG, "trainguard.launch.signed_rendezvous"):
            state, token = backend.get_state() or (b"", None)
        assert state == b"good"  # the last verified state, with the forgery's token...
        got = backend.set_state(b"good", token)  # ...so torch's next compare-and-set replaces the forgery
        assert got is not None and got[0] == b"good" and got[2] is True
    assert not marker.exists()
    assert backend.refusals == {"unsigned": 3}
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and REFUSED in errors[0].getMessage()  # once per kind, not per forgery


@pytest.mark.timeout(30)
def test_a_forgery_before_any_good_state_reads_as_none_and_is_replaced(store: Any, tmp_path: Path) -> None:
    backend = _backend(store)
    _forge(store, tmp_path / "pwned")
    assert backend.get_state() is None
    # torch writes its first state with no token; it replaces exactly the refused value.
    assert backend.set_state(b"first", None) == (b"first", store.get(KEY), True)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.timeout(30)
def test_another_key_and_garbage_are_refused(store: Any) -> None:
    theirs = _backend(store, StoreSigner(b"another-secret-0123456789"))
    theirs.set_state(b"theirs")
    backend = _backend(store)
    assert backend.get_state() is None
    assert backend.refusals == {"forged": 1}
    assert backend.set_state(b"ours")[2] is True  # type: ignore[index]
    store.set(KEY, "abc")  # not base64: torch's backend cannot decode it
    state, token = backend.get_state() or (b"", None)
    assert (state, token) == (b"ours", b"abc")
    assert backend.refusals == {"forged": 1, "undecodable": 1}
    assert backend.set_state(b"again", token)[2] is True  # type: ignore[index]


@pytest.mark.timeout(60)
def test_torchs_handler_keeps_working_over_a_forgery(store: Any, tmp_path: Path) -> None:
    """torch's own handler syncs through the wrapper: a forged state never reaches its unpickler."""
    params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{store.port}", run_id=RUN,
                                  min_nodes=1, max_nodes=1)
    backend = _backend(store)
    handler = create_handler(store, backend, params)
    assert handler.num_nodes_waiting() == 0
    marker = tmp_path / "pwned"
    _forge(store, marker)
    deadline = time.monotonic() + 30
    while not backend.refusals:  # torch caches the state for a second: ask until it reads the store again
        assert handler.num_nodes_waiting() == 0
        assert time.monotonic() < deadline, "the handler never read the store again"
        time.sleep(0.05)
    assert not marker.exists()


@pytest.mark.timeout(30)
def test_binary_garbage_is_refused_without_an_exception(store: Any) -> None:
    backend = _backend(store)
    backend.set_state(b"ours")
    store.set(KEY, b"\xffabcd")  # decodes as base64, but torch's c10d backend cannot use it as a token
    state, token = backend.get_state() or (b"", None)
    assert (state, token) == (b"ours", b"\xffabcd")
    assert backend.set_state(b"ours", token) == (b"ours", b"\xffabcd", False)
    assert backend.refusals == {"unsigned": 1, "undecodable": 1}
