"""Service tokens on the edge: the projection of service-tokens.v1 and the calling service.

Platform services (the AI gateway, the content service...) hold `st-` tokens; customers never
do. The projection is a dict by SHA-256 of the token, like the key projection, so a lookup
costs the same whatever part of a guess is right. Uses are noted in memory and drained in
batches by the keys service (last_used_at), never written on the request path.
"""

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from contracts.common import ServiceScope
from contracts.events import ServiceTokenState, order_of


@dataclass(frozen=True, slots=True)
class ServicePrincipal:
    """The platform service calling a **service** endpoint."""

    token_id: UUID
    name: str
    scopes: frozenset[ServiceScope]


class ServiceTokenProjection:
    """SHA-256 hex of the token -> its live state, from service-tokens.v1 (revoked or
    tombstoned tokens are forgotten: they are refused like unknown ones)."""

    def __init__(self) -> None:
        self._by_hash: dict[str, tuple[ServiceTokenState, ServicePrincipal]] = {}
        self._hash_by_id: dict[UUID, str] = {}
        self._newest: dict[UUID, tuple[int, datetime]] = {}  # order_of() the newest state per token, revoked ones too
        self._used: dict[UUID, datetime] = {}

    def apply(self, state: ServiceTokenState) -> None:
        seen = self._newest.get(state.token_id)
        if seen is not None and seen > order_of(state):
            return  # an older state redelivered after a newer one
        self._newest[state.token_id] = order_of(state)
        if state.revoked:
            self.remove(state.token_id)
            return
        self.remove(state.token_id)
        principal = ServicePrincipal(token_id=state.token_id, name=state.name, scopes=frozenset(state.scopes))
        self._by_hash[state.hash] = (state, principal)
        self._hash_by_id[state.token_id] = state.hash

    def remove(self, token_id: UUID) -> None:
        digest = self._hash_by_id.pop(token_id, None)
        if digest is not None:
            self._by_hash.pop(digest, None)

    def get(self, digest: str) -> ServicePrincipal | None:
        found = self._by_hash.get(digest)
        return None if found is None else found[1]

    # ---- last_used_at, approximately ---------------------------------------------------------
    def note_use(self, token_id: UUID, at: datetime) -> None:
        current = self._used.get(token_id)
        if current is None or current < at:
            self._used[token_id] = at

    def drain_uses(self) -> dict[UUID, datetime]:
        """The uses noted since the last drain (newest per token), forgotten here."""
        used, self._used = self._used, {}
        return used

    def __len__(self) -> int:
        return len(self._by_hash)
