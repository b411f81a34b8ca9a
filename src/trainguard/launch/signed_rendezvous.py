"""torch's c10d and etcd-v2 rendezvous with signed state: each state this job writes carries an HMAC-SHA256 tag
with the job secret, and a state in the store without a valid tag is refused before torch unpickles it."""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousParameters, RendezvousStateError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token, create_handler

from trainguard.launch.store_auth import StoreSigner

log = logging.getLogger(__name__)

MAGIC = b"trainguard-rdzv-1:"
"""What every signed state starts with; the tag (32 bytes) follows, then torch's pickled state."""
TAG_BYTES = 32
REFUSED = "rendezvous state in the store was not signed by this job: ignored"
"""The console line's start for a refused state (an error: someone else writes into the job's store)."""
_WHY = {
    "unsigned": "it carries no signature; another user, or a launcher without trainguard, wrote it",
    "forged": "its signature does not verify; another user wrote it, or an agent of this job has another "
              "secret (all agents need the same $TRAINGUARD_JOB_SECRET or a shared run directory)",
    "undecodable": "it is not even a rendezvous state (garbage in the store)",
}

RawRead = Callable[[], tuple[bytes, Token] | None]
"""Reads the store's raw value and its fencing token when the inner backend cannot decode it (c10d only)."""


class SignedStateBackend(RendezvousBackend):
    """A torch rendezvous backend whose states are signed with the job secret, around torch's own backend.

    A refused state is never handed to torch: the handler sees the last state that verified (or no state
    when none did yet) with the fencing token of the value now in the store, so its next compare-and-set
    (every keep-alive writes) replaces the forgery with a signed state and training goes on."""

    def __init__(self, inner: RendezvousBackend, signer: StoreSigner, run_id: str,
                 raw_read: RawRead | None = None) -> None:
        self.inner = inner
        self.signer = signer
        self.context = f"torch-rendezvous-state\x1f{inner.name}\x1f{run_id}\x1f".encode()
        self.raw_read = raw_read
        self.last_good: bytes | None = None
        """The last state that verified (torch's pickled bytes), handed back in place of a forgery."""
        self.forged_token: Token = None
        """The token of the refused value in the store while no state verified yet (None: none refused)."""
        self.refusals: dict[str, int] = {}
        """How many values of each kind (``unsigned``, ``forged``, ``undecodable``) were refused."""

    @property
    def name(self) -> str:
        return str(self.inner.name)

    # --- the envelope ----------------------------------------------------------------------------------------

    def tag(self, state: bytes) -> bytes:
        return hmac.new(self.signer.key, self.context + state, hashlib.sha256).digest()

    def seal(self, state: bytes) -> bytes:
        """``state`` (torch's pickled bytes) with the magic and its tag in front."""
        return MAGIC + self.tag(state) + state

    def open(self, raw: bytes) -> bytes | None:
        """The state inside ``raw`` when its tag verifies; None (refusal recorded) otherwise. Nothing of
        ``raw`` is interpreted before the tag verifies."""
        raw = bytes(raw)
        if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + TAG_BYTES:
            self.refuse("unsigned")
            return None
        tag, state = raw[len(MAGIC):len(MAGIC) + TAG_BYTES], raw[len(MAGIC) + TAG_BYTES:]
        if not hmac.compare_digest(tag, self.tag(state)):
            self.refuse("forged")
            return None
        return state

    def refuse(self, kind: str) -> None:
        count = self.refusals[kind] = self.refusals.get(kind, 0) + 1
        if count == 1:  # once per kind: a forger writing in a loop must not flood the console
            log.error("%s (%s backend: %s)", REFUSED, self.name, _WHY[kind])
        else:
            log.debug("%s again (%s, %d times)", REFUSED, kind, count)

    # --- torch's backend protocol ----------------------------------------------------------------------------

    def get_state(self) -> tuple[bytes, Token] | None:
        try:
            got = self.inner.get_state()
        except RendezvousStateError:
            return self._undecodable()
        if got is None:
            self.forged_token = None
            return None
        raw, token = got
        state = self.open(raw)
        if state is None:
            return self._instead(token)
        self._good(state)
        return state, token

    def set_state(self, state: bytes, token: Token | None = None) -> tuple[bytes, Token, bool] | None:
        if token is None and self.forged_token is not None:
            token = self.forged_token  # "no state" was a refused value: replace exactly that one
        try:
            got = self.inner.set_state(self.seal(state), token)
        except (RendezvousStateError, UnicodeDecodeError):  # c10d: the refused value, its token, is not text
            instead = self._undecodable()
            return None if instead is None else (*instead, False)
        if got is None:
            self.forged_token = None
            return None
        raw, new_token, has_set = got
        current = self.open(raw)
        if current is None:
            instead = self._instead(new_token)
            return None if instead is None else (*instead, False)
        self._good(current)
        return current, new_token, bool(has_set)

    def _good(self, state: bytes) -> None:
        self.last_good = state
        self.forged_token = None

    def _instead(self, token: Token) -> tuple[bytes, Token] | None:
        """What torch sees in place of a refused value that has fencing token ``token``."""
        if self.last_good is None:
            self.forged_token = token
            return None
        self.forged_token = None
        return self.last_good, token

    def _undecodable(self) -> tuple[bytes, Token] | None:
        """The inner backend could not even decode the value: refused, when its raw token can be read."""
        if self.raw_read is None:
            raise RendezvousStateError(f"{REFUSED}: the {self.name} backend cannot decode the value in the store")
        got = self.raw_read()
        if got is None:
            self.forged_token = None
            return None
        self.refuse("undecodable")
        return self._instead(got[1])


C10D_STATE_KEY = "torch.rendezvous."
"""torch's c10d backend keeps the state under this prefix and the run id (its documented key)."""


def c10d_raw_read(store: Any, run_id: str) -> RawRead:
    """Reads the c10d state key as it is: torch's c10d backend uses the stored value as its fencing token.
    Only called after torch's backend failed to decode that value, so it is never torch's "no state" mark."""

    def read() -> tuple[bytes, Token] | None:
        raw = bytes(store.get(C10D_STATE_KEY + run_id))
        return raw, raw

    return read


def signed_handler(params: RendezvousParameters, signer: StoreSigner, loopback: str | None = None) -> Any:
    """torch's dynamic rendezvous handler for ``params`` (c10d or etcd-v2) over a signed backend; a c10d
    store on the loopback address ``loopback`` is bound to it (`trainguard.launch.local_rendezvous`)."""
    backend: Any
    if params.backend == "etcd-v2":
        from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import create_backend as etcd_backend

        backend, store = etcd_backend(params)
        return create_handler(store, SignedStateBackend(backend, signer, params.run_id), params)
    if params.backend != "c10d":
        raise ValueError(f"signed rendezvous: backend {params.backend!r} keeps no state to sign")
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend as c10d_backend

    if loopback is not None:
        from trainguard.launch.local_rendezvous import loopback_store

        store = loopback_store(params, loopback)
        backend = C10dRendezvousBackend(store, params.run_id)
    else:
        backend, store = c10d_backend(params)
    wrapped = SignedStateBackend(backend, signer, params.run_id, c10d_raw_read(store, params.run_id))
    return create_handler(store, wrapped, params)
