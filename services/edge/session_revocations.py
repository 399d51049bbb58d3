"""What ends console sessions before their expiry, projected from users.v1 and sessions.v1.

- users.v1 (compacted, key = user id): a user's `sessions_not_before` (a password change moves it
  to now) and `removed`; a session issued before that instant, or of a removed user, is refused.
- sessions.v1: one logged-out session id each. Bounded: a revoked session would expire anyway at
  most SESSION_TTL_SECONDS after it was issued, hence after `revoked_at`; the id is forgotten then
  (a replay of old events does not even store it). That holds for the TTL of *this* process: the
  edge refuses a token older than the current TTL whatever its own expiry (sessions.verify), so a
  session issued under a longer TTL before a restart does not outlive its forgotten logout. The
  settings keep the TTL within sessions.v1's retention, so a restarted edge reads every logout of
  a session still alive.

These projections alone would keep honouring a session on a replica whose Kafka consumer is
behind or cut off: the writers also share each end in Redis, which every console call asks
(user_revocations.py).
"""

from collections import OrderedDict
from datetime import datetime
from uuid import UUID

from contracts.events import SessionRevoked, UserState, order_of


class UserSessions:
    """user id -> newest UserState, from users.v1."""

    def __init__(self) -> None:
        self._users: dict[UUID, UserState] = {}

    def apply(self, state: UserState) -> None:
        current = self._users.get(state.user_id)
        if current is not None and order_of(current) > order_of(state):
            return  # an older state redelivered after a newer one
        self._users[state.user_id] = state

    def get(self, user_id: UUID) -> UserState | None:
        return self._users.get(user_id)

    def ended(self, user_id: UUID, issued_at: float) -> bool:
        """Whether the user's sessions issued at `issued_at` (unix seconds) are over."""
        state = self._users.get(user_id)
        if state is None:
            return False
        if state.removed:
            return True
        return state.sessions_not_before is not None and issued_at < state.sessions_not_before.timestamp()


class RevokedSessions:
    """Logged-out sessions, (user id, session id) each (ids are random, but a user's own pair can
    never end another user's session), kept until the session could no longer be valid anyway."""

    def __init__(self, session_ttl_seconds: int) -> None:
        self._ttl = session_ttl_seconds
        # (user id, session id) -> unix second after which it is forgotten; insertion order ~ revocation order
        self._forget_at: OrderedDict[tuple[UUID, str], float] = OrderedDict()

    def apply(self, event: SessionRevoked, now: datetime) -> None:
        self.forget_expired(now)
        forget_at = event.revoked_at.timestamp() + self._ttl
        if forget_at <= now.timestamp():
            return  # the session has expired by itself since
        session = (event.user_id, event.session_id)
        if forget_at > self._forget_at.get(session, 0.0):
            self._forget_at[session] = forget_at

    def forget_expired(self, now: datetime) -> None:
        """Drop the entries due from the front (events arrive about in revocation order; an
        out-of-order one is dropped a little later, with the ones before it)."""
        cutoff = now.timestamp()
        while self._forget_at:
            session, forget_at = next(iter(self._forget_at.items()))
            if forget_at > cutoff:
                return
            del self._forget_at[session]

    def __contains__(self, session: tuple[UUID, str]) -> bool:
        return session in self._forget_at

    def __len__(self) -> int:
        return len(self._forget_at)
