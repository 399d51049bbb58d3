"""Bringing the keys service's topics back to what Postgres holds when Postgres is *behind* them
(restored to an older point: docs/backup.md), as part of its republish.

Two steps around the republish itself, in the one transaction (services/keys/service.py):
- `move_past` (before): a row whose object Kafka holds at a higher version (changed after the
  backup) takes a version above it, so its republished state wins on every edge, which keeps
  the highest version (contracts/events.py, order_of): the restore's state, not the lost one;
  but a user's `sessions_not_before` is never earlier than Kafka's newest (a password change or
  a removal after the backup ended sessions that the restored row would let back in).
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
from services.keys.published import RECONCILED_TOPICS, Published, S, TopicHeld
from services.keys.store import KeysTx


async def move_past(tx: KeysTx, published: Published, topics: Collection[str]) -> None:
    """Rows behind Kafka's highest version of their object take the version after it (in the
    writers' locking order: accounts, users, keys, service tokens)."""
    for topic in RECONCILED_TOPICS:
        if topic in topics:
            await tx.raise_versions(topic, published.top_versions(topic))
            if topic == USERS.name:  # sessions ended after the backup stay ended, as logouts do
                await tx.keep_sessions_ended(published.users.sessions_ended)


def _ended(
    published: Published, topic: str, kafka: TopicHeld[S], held: Iterable[UUID], now: datetime, end: dict[str, object]
) -> list[S]:
    """The end (`end`: the fields that say so) of each object live in `kafka` but not `held` in
    Postgres, at a version above the highest `topic` carried for it."""
    known, top = set(held), published.top_versions(topic)
    return [
        s.model_copy(update={"id": uuid4(), "time": now, **end, "version": top.get(object_id, 0) + 1})
        for object_id, s in sorted(kafka.live.items())
        if object_id not in known
    ]


def ghost_keys(published: Published, live: Iterable[UUID], now: datetime) -> list[KeyState]:
    return _ended(published, KEYS.name, published.keys, live, now, {"deleted": True})


def ghost_accounts(published: Published, held: Iterable[UUID], now: datetime) -> list[AccountState]:
    return _ended(published, ACCOUNTS.name, published.accounts, held, now, {"deleted": True})


def ghost_users(published: Published, held: Iterable[UUID], now: datetime) -> list[UserState]:
    return _ended(published, USERS.name, published.users, held, now, {"removed": True, "sessions_not_before": now})


def ghost_service_tokens(published: Published, live: Iterable[UUID], now: datetime) -> list[ServiceTokenState]:
    return _ended(published, SERVICE_TOKENS.name, published.service_tokens, live, now, {"revoked": True})
