"""Bringing the keys service's topics back to what Postgres holds when Postgres is *behind* them
(restored to an older point: docs/backup.md), as part of its republish.

Two steps around the republish itself, in the one transaction (services/keys/service.py):
- `move_past` (before): a row whose object Kafka holds at a higher version (changed after the
  backup) takes a version above it, so its republished state wins on every edge, which keeps
  the highest version (contracts/events.py, order_of): the restore's state, not the lost one.
- the `ghost_*` ends (after): an object live in Kafka that Postgres does not hold live (made
  after the backup) gets its end at a version above Kafka's: a key deleted and a service token
  revoked (each with its tombstone), a user removed, an account deleted. Every edge, running or
  rebuilding, then refuses it, and compaction keeps the end.
"""

from collections.abc import Collection, Iterable
from datetime import datetime
from uuid import UUID, uuid4

from contracts.events import AccountState, KeyState, ServiceTokenState, UserState
from contracts.topics import ACCOUNTS, KEYS, SERVICE_TOKENS, USERS
from services.keys.published import RECONCILED_TOPICS, Published
from services.keys.store import KeysTx


async def move_past(tx: KeysTx, published: Published, topics: Collection[str]) -> None:
    """Rows behind Kafka's highest version of their object take the version after it (in the
    writers' locking order: accounts, users, keys, service tokens)."""
    for topic in RECONCILED_TOPICS:
        if topic in topics:
            await tx.raise_versions(topic, published.top_versions(topic))


def _above(published: Published, topic: str, object_id: UUID) -> int:
    return published.top_versions(topic).get(object_id, 0) + 1


def ghost_keys(published: Published, live: Iterable[UUID], now: datetime) -> list[KeyState]:
    held = set(live)
    return [
        s.model_copy(update={"id": uuid4(), "time": now, "deleted": True, "version": _above(published, KEYS.name, k)})
        for k, s in sorted(published.keys.live.items())
        if k not in held
    ]


def ghost_accounts(published: Published, held: Iterable[UUID], now: datetime) -> list[AccountState]:
    known = set(held)
    return [
        s.model_copy(update={"id": uuid4(), "time": now, "deleted": True, "version": _above(published, ACCOUNTS.name, a)})
        for a, s in sorted(published.accounts.live.items())
        if a not in known
    ]


def ghost_users(published: Published, held: Iterable[UUID], now: datetime) -> list[UserState]:
    known = set(held)
    return [
        s.model_copy(
            update={
                "id": uuid4(),
                "time": now,
                "removed": True,
                "sessions_not_before": now,
                "version": _above(published, USERS.name, u),
            }
        )
        for u, s in sorted(published.users.live.items())
        if u not in known
    ]


def ghost_service_tokens(published: Published, live: Iterable[UUID], now: datetime) -> list[ServiceTokenState]:
    held = set(live)
    return [
        s.model_copy(update={"id": uuid4(), "time": now, "revoked": True, "version": _above(published, SERVICE_TOKENS.name, t)})
        for t, s in sorted(published.service_tokens.live.items())
        if t not in held
    ]
