"""Bringing the keys service's topics back to what Postgres holds when Postgres is *behind* them
(restored to an older point: docs/backup.md), as part of its republish.

The rule: a restore never brings back a credential ended or turned off after the backup. Each
object's restored state is the stricter of the backup's row and Kafka's newest state; everything
else (names, rules, roles) is the backup's. In the one republish transaction
(services/keys/service.py):
- `move_past` (first): a row whose object Kafka holds at a higher version (changed after the
  backup) takes a version above it, so its republished state wins on every edge, which keeps
  the highest version (contracts/events.py, order_of); a user's `sessions_not_before` is never
  earlier than Kafka's newest (a password change or a removal after the backup ended sessions).
- the `keep_*` steps (before each topic's rows are published): where Kafka's state is the
  stricter, Postgres takes it through the store's own writes, audited as the operator's: a key
  Kafka holds deleted (or forgot by its tombstone) is deleted, one it holds disabled at a newer
  version than the row is disabled, a token it holds revoked is revoked, a user it holds removed
  is removed (with its keys, as a member's removal does). Ends are final, so Kafka's end wins
  whatever the versions; a disable only when Kafka's state is the newer (the key's row was
  behind it). A key's expiry is the earlier of the row's and Kafka's newest state's (a rotation
  after the backup gave the replaced key one: it must not live for ever). An account Kafka holds
  deleted is deleted (`deleted_at`: every later republish, a refill's too, publishes it deleted,
  and its e-mail is free again), and its users are removed with their keys.
- the `ghost_*` ends (last): an object live in Kafka that Postgres does not hold live (made
  after the backup) gets its end at a version above Kafka's: a key deleted and a service token
  revoked (each with its tombstone), a user removed, an account deleted. Every edge, running or
  rebuilding, then refuses it, and compaction keeps the end.
"""

from collections.abc import Collection, Iterable
from datetime import datetime
from uuid import UUID, uuid4

from contracts.audit import AuditAction, AuditContext
from contracts.common import KeyStatus
from contracts.events import AccountState, KeyState, ServiceTokenState, UserState
from contracts.topics import ACCOUNTS, AUDIT, KEYS, SERVICE_TOKENS, USERS
from services.keys import service_tokens
from services.keys.published import RECONCILED_TOPICS, KeysHeld, Published, S, TopicHeld
from services.keys.store import KeysTx, Row

# Who the audit log names for what a restore kept from Kafka (the operator ran `tollgate republish`)
RESTORE = AuditContext(operator=True, user_agent="tollgate-republish")


async def move_past(tx: KeysTx, published: Published, topics: Collection[str]) -> dict[str, set[UUID]]:
    """Rows behind Kafka's highest version of their object take the version after it (in the
    writers' locking order: accounts, users, keys, service tokens); per topic, the ids of those
    rows (Kafka's state of them is newer than the backup's)."""
    behind: dict[str, set[UUID]] = {}
    for topic in RECONCILED_TOPICS:
        if topic in topics:
            behind[topic] = await tx.raise_versions(topic, published.top_versions(topic))
            if topic == USERS.name:  # sessions ended after the backup stay ended, as logouts do
                await tx.keep_sessions_ended(published.users.sessions_ended)
    return behind


def stricter_in_kafka(kafka: KeysHeld, key_id: UUID, status: KeyStatus, behind: Collection[UUID]) -> str | None:
    """What Kafka (or the shared store's revocation entry) holds of a key live in Postgres with
    `status` that is stricter than the row: "deleted" (its newest state, a tombstone or a deleted
    entry: a deletion is final), "disabled" (the newest of its state and entry, when newer than
    the row, i.e. the row was `behind` it), or None: the row stands."""
    if kafka.ended(key_id):
        return "deleted"
    if status is KeyStatus.ENABLED and key_id in behind and kafka.disabled(key_id):
        return "disabled"
    return None


def earlier_expiry_in_kafka(kafka: KeysHeld, key_id: UUID, expires_at: datetime | None) -> datetime | None:
    """Kafka's newest expiry of a key, when it is earlier than the row's `expires_at` (None: no
    expiry). A rotation after the backup set it (the replaced key's grace): an expiry only ever
    comes closer, so the earlier one is kept whatever the versions, as an end is."""
    newest = kafka.newest.get(key_id)
    if newest is None or newest.expires_at is None:
        return None
    if expires_at is None or newest.expires_at < expires_at:
        return newest.expires_at
    return None


async def _audit(
    tx: KeysTx, account_id: UUID, now: datetime, action: AuditAction, target: tuple[str, UUID], **details: object
) -> None:
    entry = RESTORE.entry(account_id, now, action, target[0], target[1], kept_from_kafka=True, **details)
    await tx.publish(AUDIT, str(account_id).encode(), entry.model_dump_json().encode())


async def keep_keys_ended(
    tx: KeysTx, published: Published, behind: Collection[UUID], live_keys: list[Row], now: datetime
) -> tuple[list[Row], list[Row]]:
    """Each live key (`all_live_keys` rows) Kafka holds deleted is deleted, each it holds disabled
    (newer than the row) is disabled, as the owner's DELETE and toggle do, and each it holds with
    an earlier expiry takes it (its `delete_at` stays the row's: the key is listed as expired,
    and may be rotated again, its successor having ended with the restore): (the rows still
    live, the rows deleted), with their creator's role."""
    live: list[Row] = []
    deleted: list[Row] = []
    for row in live_keys:
        key_id, role = row["id"], row["creator_role"]
        stricter = stricter_in_kafka(published.keys, key_id, KeyStatus(row["status"]), behind)
        if stricter == "deleted" or published.accounts.ended(row["account_id"]):  # an account's end ends its keys
            deleted.append({**await tx.mark_deleted(key_id, now), "creator_role": role})
            await _audit(tx, row["account_id"], now, AuditAction.API_KEY_DELETED, ("api_key", key_id), name=row["name"])
            continue
        if stricter == "disabled":
            row = {**await tx.set_status(key_id, KeyStatus.DISABLED.value), "creator_role": role}
            await _audit(tx, row["account_id"], now, AuditAction.API_KEY_TOGGLED, ("api_key", key_id), status=row["status"])
        expires_at = earlier_expiry_in_kafka(published.keys, key_id, row["expires_at"])
        if expires_at is not None:
            row = {**await tx.set_expiry(key_id, expires_at, row["delete_at"]), "creator_role": role}
            await _audit(
                tx, row["account_id"], now, AuditAction.API_KEY_UPDATED, ("api_key", key_id), expires_at=expires_at.isoformat()
            )
        live.append(row)
    return live, deleted


async def keep_accounts_deleted(tx: KeysTx, published: Published, accounts: list[Row], now: datetime) -> list[Row]:
    """Each account Kafka holds deleted is deleted in Postgres too, audited: every account row, as
    it is now. (There is no account DELETE: an account ends only by a reconcile, as one made after
    a backup, which Kafka then holds deleted for any later restore.)"""
    rows: list[Row] = []
    for account in accounts:
        if account["deleted_at"] is None and published.accounts.ended(account["id"]):
            account = await tx.mark_account_deleted(account["id"], now)
            await _audit(tx, account["id"], now, AuditAction.ACCOUNT_DELETED, ("account", account["id"]), email=account["email"])
        rows.append(account)
    return rows


async def keep_users_removed(tx: KeysTx, published: Published, users: list[Row], now: datetime) -> tuple[list[Row], list[Row]]:
    """Each user Kafka holds removed, or of an account it holds deleted, is removed, with its live
    keys, as a member's removal does: (every user row, as it is now; the keys deleted, with their
    creator's role)."""
    rows: list[Row] = []
    deleted: list[Row] = []
    for user in users:
        ended = published.users.ended(user["id"]) or published.accounts.ended(user["account_id"])
        if user["removed_at"] is None and ended:
            removed = await tx.remove_user(user["id"], now)
            assert removed is not None  # the row is locked (all_users: FOR SHARE)
            await _audit(tx, user["account_id"], now, AuditAction.MEMBER_REMOVED, ("user", user["id"]), email=user["email"])
            for key in await tx.live_keys_created_by(user["account_id"], user["id"]):
                deleted.append({**await tx.mark_deleted(key["id"], now), "creator_role": user["role"]})
            user = removed
        rows.append(user)
    return rows, deleted


async def keep_tokens_revoked(tx: KeysTx, published: Published, now: datetime) -> list[ServiceTokenState]:
    """Each live service token Kafka holds revoked (or forgot) is revoked, as the operator's
    revocation does (its state and tombstone published, audited): their revoked states."""
    revoked: list[ServiceTokenState] = []
    for row in await tx.live_service_tokens():
        if published.service_tokens.ended(row["id"]):
            state = await service_tokens.revoke(tx, row["id"], now, RESTORE)
            assert state is not None  # the row is there (locked)
            revoked.append(state)
    return revoked


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
