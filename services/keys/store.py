"""Postgres adapter of the keys service (schema `keys`): ALL its SQL. A use case opens one
`transaction()` and gets a `KeysTx`: every method runs in it, and `publish` queues an outbox row
in it, so the change and its events commit together (the relay sends them to Kafka after)."""

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, cast
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from contracts.audit import AuditRecorded
from contracts.topics import ACCOUNTS, KEYS, SERVICE_TOKENS, SESSIONS, USERS, Topic
from services.runtime.platform.outbox_relay import OutboxRelay

Conn = AsyncConnection[DictRow]
Row = dict[str, Any]

_KEY_COLUMNS = (
    "id, account_id, name, hash, masked_key, status, expires_at, delete_at, created_at, last_used_at, created_by, version, rules,"
    " lineage_id"
)
_ST_COLUMNS = "id, name, hash, scopes, created_at, last_used_at, revoked_at, version"
# the table of each topic's objects, whose `version` their states carry
_VERSIONED_TABLES = {
    ACCOUNTS.name: "keys.accounts",
    USERS.name: "keys.users",
    KEYS.name: "keys.api_keys",
    SERVICE_TOKENS.name: "keys.service_tokens",
}


class KeysStore:
    def __init__(self, pool: AsyncConnectionPool, relay: OutboxRelay) -> None:
        self._pool = cast("AsyncConnectionPool[Conn]", pool)  # the host opens it with dict rows
        self._relay = relay

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator["KeysTx"]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        async with self._pool.connection() as conn:
            yield KeysTx(conn, self._relay)


class KeysTx:
    """Every write that changes a published state (keys.v1, accounts.v1, users.v1,
    service-tokens.v1) bumps the row's `version` in its own UPDATE and returns the row: the
    version is taken under the row lock, so the order of versions is the order of the writes."""

    def __init__(self, conn: Conn, relay: OutboxRelay) -> None:
        self.conn = conn
        self._relay = relay

    async def _one(self, query: str, params: tuple[Any, ...]) -> Row | None:
        cur = await self.conn.execute(query, params)
        return await cur.fetchone()

    async def _all(self, query: str, params: tuple[Any, ...] | dict[str, Any]) -> list[Row]:
        cur = await self.conn.execute(query, params)
        return await cur.fetchall()

    async def publish(self, topic: Topic, key: bytes, value: bytes | None) -> None:
        """An outbox row in this transaction (None: a tombstone)."""
        await self._relay.add(self.conn, topic, key, value)

    # ---- accounts ---------------------------------------------------------------------------------
    async def insert_account(
        self, *, account_id: UUID, email: str, password_hash: str, name: str, user_type: str, roles: list[str]
    ) -> Row | None:
        """The new account, or None if the e-mail is taken (case-insensitive)."""
        return await self._one(
            """INSERT INTO keys.accounts (id, email, password_hash, name, user_type, roles)
               VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING *""",
            (account_id, email, password_hash, name, user_type, roles),
        )

    async def account_by_email(self, email: str) -> Row | None:
        """The live account registered with this e-mail (a deleted one's is free again)."""
        return await self._one("SELECT * FROM keys.accounts WHERE lower(email) = lower(%s) AND deleted_at IS NULL", (email,))

    async def mark_account_deleted(self, account_id: UUID, now: datetime) -> Row:
        """The account ended (its e-mail free again: migration 0012), at its next version."""
        row = await self._one(
            "UPDATE keys.accounts SET deleted_at = %s, version = version + 1 WHERE id = %s RETURNING *", (now, account_id)
        )
        assert row is not None  # the caller holds the row (all_accounts: FOR SHARE)
        return row

    async def account_by_id(self, account_id: UUID, *, for_update: bool = False) -> Row | None:
        lock = " FOR UPDATE" if for_update else ""
        return await self._one("SELECT * FROM keys.accounts WHERE id = %s" + lock, (account_id,))

    async def set_password_hash(self, account_id: UUID, password_hash: str) -> None:
        await self.conn.execute("UPDATE keys.accounts SET password_hash = %s WHERE id = %s", (password_hash, account_id))

    async def set_password(self, account_id: UUID, password_hash: str, sessions_not_before: datetime) -> Row | None:
        """A new password; every session issued before `sessions_not_before` ends."""
        return await self._one(
            "UPDATE keys.accounts SET password_hash = %s, sessions_not_before = %s WHERE id = %s RETURNING *",
            (password_hash, sessions_not_before, account_id),
        )

    async def set_user_type(self, account_id: UUID, user_type: str) -> Row | None:
        return await self._one(
            "UPDATE keys.accounts SET user_type = %s, version = version + 1 WHERE id = %s RETURNING *", (user_type, account_id)
        )

    async def set_roles(self, account_id: UUID, roles: list[str]) -> Row | None:
        return await self._one(
            "UPDATE keys.accounts SET roles = %s, version = version + 1 WHERE id = %s RETURNING *", (roles, account_id)
        )

    async def set_plan(self, account_id: UUID, plan: str, time: datetime, version: int) -> None:
        """Newest plan wins (billing's version, then time: contracts/events.py, order_of); a
        redelivered or older event changes nothing."""
        await self.conn.execute(
            """UPDATE keys.accounts SET plan = %s, plan_time = %s, plan_version = %s
               WHERE id = %s AND (plan_time IS NULL OR (plan_version, plan_time) < (%s, %s))""",
            (plan, time, version, account_id, version, time),
        )

    # ---- users (members, v2) ----------------------------------------------------------------------
    async def insert_user(
        self, *, user_id: UUID, account_id: UUID, email: str, password_hash: str, name: str, role: str, created_at: datetime
    ) -> Row | None:
        """The new user, or None if a live user has the e-mail (case-insensitive)."""
        return await self._one(
            """INSERT INTO keys.users (id, account_id, email, password_hash, name, role, created_at)
               VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING *""",
            (user_id, account_id, email, password_hash, name, role, created_at),
        )

    async def user_by_email(self, email: str) -> Row | None:
        """The live user who logs in with this e-mail."""
        return await self._one("SELECT * FROM keys.users WHERE lower(email) = lower(%s) AND removed_at IS NULL", (email,))

    async def user_by_id(self, user_id: UUID, *, for_update: bool = False) -> Row | None:
        """The user, removed or not."""
        lock = " FOR UPDATE" if for_update else ""
        return await self._one("SELECT * FROM keys.users WHERE id = %s" + lock, (user_id,))

    async def keep_password_hash(self, user_id: UUID, verified_hash: str, rehashed: str | None) -> Row | None:
        """The user, locked until the transaction ends (a password change waits), if its password
        hash is still `verified_hash`; `rehashed`, if given, replaces it then (a password change that
        landed meanwhile is never overwritten). None: the hash changed."""
        if rehashed is None:
            return await self._one(
                "SELECT * FROM keys.users WHERE id = %s AND password_hash = %s FOR SHARE", (user_id, verified_hash)
            )
        return await self._one(
            "UPDATE keys.users SET password_hash = %s WHERE id = %s AND password_hash = %s RETURNING *",
            (rehashed, user_id, verified_hash),
        )

    async def set_user_password(self, user_id: UUID, password_hash: str, sessions_not_before: datetime) -> Row | None:
        """A new password; every session of the user issued before `sessions_not_before` ends."""
        return await self._one(
            "UPDATE keys.users SET password_hash = %s, sessions_not_before = %s, version = version + 1 WHERE id = %s RETURNING *",
            (password_hash, sessions_not_before, user_id),
        )

    async def members_of(self, account_id: UUID) -> list[Row]:
        return await self._all(
            "SELECT * FROM keys.users WHERE account_id = %s AND removed_at IS NULL ORDER BY created_at, id", (account_id,)
        )

    async def members_for_update(self, account_id: UUID) -> list[Row]:
        """The account's live users, locked: concurrent role changes cannot both remove the last owner."""
        return await self._all(
            "SELECT * FROM keys.users WHERE account_id = %s AND removed_at IS NULL ORDER BY created_at, id FOR UPDATE",
            (account_id,),
        )

    async def set_user_role(self, user_id: UUID, role: str) -> Row | None:
        return await self._one(
            "UPDATE keys.users SET role = %s, version = version + 1 WHERE id = %s RETURNING *", (role, user_id)
        )

    async def remove_user(self, user_id: UUID, now: datetime) -> Row | None:
        return await self._one(
            """UPDATE keys.users SET removed_at = %s, sessions_not_before = %s, version = version + 1
               WHERE id = %s RETURNING *""",
            (now, now, user_id),
        )

    async def live_keys_created_by(self, account_id: UUID, user_id: UUID) -> list[Row]:
        return await self._all(
            f"""SELECT {_KEY_COLUMNS} FROM keys.api_keys
                WHERE account_id = %s AND created_by = %s AND deleted_at IS NULL FOR UPDATE""",
            (account_id, user_id),
        )

    async def restamp_keys_created_by(self, account_id: UUID, user_id: UUID) -> list[Row]:
        """The user's live keys, locked, each at its next version: their keys.v1 states change
        with the user (its role)."""
        return await self._all(
            f"""UPDATE keys.api_keys SET version = version + 1
                WHERE account_id = %s AND created_by = %s AND deleted_at IS NULL RETURNING {_KEY_COLUMNS}""",
            (account_id, user_id),
        )

    # ---- API keys ---------------------------------------------------------------------------------
    async def insert_key(
        self,
        *,
        key_id: UUID,
        account_id: UUID,
        name: str,
        digest: str,
        masked_key: str,
        status: str,
        expires_at: datetime | None,
        created_at: datetime,
        created_by: UUID,
        rules: dict[str, Any],
        lineage_id: UUID,
    ) -> Row:
        row = await self._one(
            f"""INSERT INTO keys.api_keys
                    (id, account_id, name, hash, masked_key, status, expires_at, created_at, created_by, rules, lineage_id)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING {_KEY_COLUMNS}""",
            (key_id, account_id, name, digest, masked_key, status, expires_at, created_at, created_by, Jsonb(rules), lineage_id),
        )
        assert row is not None
        return row

    async def key_for_update(self, account_id: UUID, key_id: UUID) -> Row | None:
        """A live key of this account, locked; None for unknown, deleted or another account's key."""
        return await self._one(
            f"""SELECT {_KEY_COLUMNS} FROM keys.api_keys
                WHERE id = %s AND account_id = %s AND deleted_at IS NULL FOR UPDATE""",
            (key_id, account_id),
        )

    async def list_keys(self, account_id: UUID) -> list[Row]:
        return await self._all(
            f"""SELECT {_KEY_COLUMNS} FROM keys.api_keys
                WHERE account_id = %s AND deleted_at IS NULL ORDER BY created_at, id""",
            (account_id,),
        )

    async def live_keys_of(self, account_id: UUID) -> list[Row]:
        return await self._all(
            f"SELECT {_KEY_COLUMNS} FROM keys.api_keys WHERE account_id = %s AND deleted_at IS NULL FOR UPDATE",
            (account_id,),
        )

    async def _update_key(self, key_id: UUID, assignments: str, params: tuple[Any, ...]) -> Row:
        row = await self._one(
            f"UPDATE keys.api_keys SET {assignments}, version = version + 1 WHERE id = %s RETURNING {_KEY_COLUMNS}",
            (*params, key_id),
        )
        assert row is not None  # the caller holds the key's row lock
        return row

    async def set_status(self, key_id: UUID, status: str) -> Row:
        return await self._update_key(key_id, "status = %s", (status,))

    async def set_expiry(self, key_id: UUID, expires_at: datetime, delete_at: datetime | None) -> Row:
        return await self._update_key(key_id, "expires_at = %s, delete_at = %s", (expires_at, delete_at))

    async def set_rules(self, key_id: UUID, name: str, rules: dict[str, Any]) -> Row:
        """(v4) The key's name and own rules (KeyRules as JSON)."""
        return await self._update_key(key_id, "name = %s, rules = %s", (name, Jsonb(rules)))

    async def mark_deleted(self, key_id: UUID, now: datetime) -> Row:
        return await self._update_key(key_id, "deleted_at = %s", (now,))

    async def due_for_deletion(self, now: datetime, limit: int = 200) -> list[Row]:
        """Rotated keys whose grace period is over, locked (replicas skip each other's)."""
        return await self._all(
            f"""SELECT {_KEY_COLUMNS} FROM keys.api_keys
                WHERE deleted_at IS NULL AND delete_at <= %s ORDER BY delete_at LIMIT %s FOR UPDATE SKIP LOCKED""",
            (now, limit),
        )

    async def touch_last_used(self, used: dict[UUID, datetime]) -> None:
        """One statement for a whole batch of calls; never moves last_used_at backwards."""
        if not used:
            return
        ids = list(used)
        await self.conn.execute(
            """UPDATE keys.api_keys AS k SET last_used_at = GREATEST(k.last_used_at, u.t)
               FROM unnest(%s::uuid[], %s::timestamptz[]) AS u(id, t) WHERE k.id = u.id""",
            (ids, [used[i] for i in ids]),
        )

    # ---- service tokens (v2) ------------------------------------------------------------------------

    async def insert_service_token(
        self, *, token_id: UUID, name: str, digest: str, scopes: list[str], created_at: datetime
    ) -> Row:
        row = await self._one(
            f"""INSERT INTO keys.service_tokens (id, name, hash, scopes, created_at)
                VALUES (%s, %s, %s, %s, %s) RETURNING {_ST_COLUMNS}""",
            (token_id, name, digest, scopes, created_at),
        )
        assert row is not None
        return row

    async def list_service_tokens(self) -> list[Row]:
        return await self._all(f"SELECT {_ST_COLUMNS} FROM keys.service_tokens ORDER BY created_at, id", ())

    async def service_token_is_live(self, token_id: UUID) -> bool:
        """Whether the token exists and is not revoked."""
        live = await self._one("SELECT 1 AS live FROM keys.service_tokens WHERE id = %s AND revoked_at IS NULL", (token_id,))
        return live is not None

    async def revoke_service_token(self, token_id: UUID, now: datetime) -> Row | None:
        """The token, revoked now (or when it first was: revoking twice changes nothing); None if unknown."""
        return await self._one(
            f"""UPDATE keys.service_tokens SET revoked_at = COALESCE(revoked_at, %s), version = version + 1
                WHERE id = %s RETURNING {_ST_COLUMNS}""",
            (now, token_id),
        )

    async def touch_service_tokens(self, used: dict[UUID, datetime]) -> None:
        """One statement per batch of uses; never moves last_used_at backwards."""
        if not used:
            return
        ids = list(used)
        await self.conn.execute(
            """UPDATE keys.service_tokens AS t SET last_used_at = GREATEST(t.last_used_at, u.t)
               FROM unnest(%s::uuid[], %s::timestamptz[]) AS u(id, t) WHERE t.id = u.id""",
            (ids, [used[i] for i in ids]),
        )

    # ---- logged-out sessions (sessions.v1) -----------------------------------------------------------
    async def insert_session_revocation(self, account_id: UUID, user_id: UUID, session_id: str, revoked_at: datetime) -> None:
        await self.conn.execute(
            """INSERT INTO keys.session_revocations (user_id, session_id, account_id, revoked_at)
               VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING""",
            (user_id, session_id, account_id, revoked_at),
        )

    # ---- republishing every state (docs/architecture.md, "Kafka is transport") ----------------------
    # FOR SHARE: a write of one of these rows waits until the republish commits, so its own
    # outbox row comes after the republished one and compaction keeps the newer state.
    async def all_accounts(self) -> list[Row]:
        return await self._all("SELECT * FROM keys.accounts ORDER BY id FOR SHARE", ())

    async def all_users(self) -> list[Row]:
        """Removed users too: their state (`removed`) ends their sessions."""
        return await self._all("SELECT * FROM keys.users ORDER BY id FOR SHARE", ())

    async def all_live_keys(self) -> list[Row]:
        """Every live key with its creator's current role (`creator_role`; NULL: no such user)."""
        return await self._all(
            f"""SELECT {", ".join("k." + c.strip() for c in _KEY_COLUMNS.split(","))}, u.role AS creator_role
                FROM keys.api_keys AS k LEFT JOIN keys.users AS u ON u.id = COALESCE(k.created_by, k.account_id)
                WHERE k.deleted_at IS NULL ORDER BY k.id FOR SHARE OF k""",
            (),
        )

    async def raise_versions(self, topic: str, kafka_versions: Mapping[UUID, int]) -> set[UUID]:
        """Each row of `topic`'s objects whose version is below the one Kafka holds of it takes the
        version after Kafka's (a Postgres restored to an older point: services/keys/reconcile.py);
        the ids of those rows (Kafka's state of them is newer)."""
        if not kafka_versions:
            return set()
        ids, versions = zip(*kafka_versions.items(), strict=True)
        rows = await self._all(
            f"""UPDATE {_VERSIONED_TABLES[topic]} AS t SET version = k.version + 1
                FROM unnest(%s::uuid[], %s::bigint[]) AS k(id, version)
                WHERE t.id = k.id AND t.version < k.version RETURNING t.id""",
            (list(ids), list(versions)),
        )
        return {row["id"] for row in rows}

    async def keep_sessions_ended(self, ended: Mapping[UUID, datetime]) -> None:
        """Each user's sessions_not_before at least the instant `ended` names (what Kafka's states
        of it ended: services/keys/reconcile.py), its version moved on where it changes."""
        if not ended:
            return
        ids, instants = zip(*ended.items(), strict=True)
        await self.conn.execute(
            """UPDATE keys.users AS u SET sessions_not_before = k.ended, version = u.version + 1
                FROM unnest(%s::uuid[], %s::timestamptz[]) AS k(id, ended)
                WHERE u.id = k.id AND (u.sessions_not_before IS NULL OR u.sessions_not_before < k.ended)""",
            (list(ids), list(instants)),
        )

    async def live_service_tokens(self) -> list[Row]:
        return await self._all(
            f"SELECT {_ST_COLUMNS} FROM keys.service_tokens WHERE revoked_at IS NULL ORDER BY id FOR SHARE", ()
        )

    async def session_revocations_since(self, since: datetime) -> list[Row]:
        return await self._all(
            "SELECT * FROM keys.session_revocations WHERE revoked_at > %s ORDER BY revoked_at, user_id, session_id", (since,)
        )

    async def state_counts(self, sessions_since: datetime) -> dict[str, int]:
        """How many live states each topic of the keys service should hold (topic name -> count):
        what `republish` re-emits (a key only with its creator), so a republish always satisfies it."""
        row = await self._one(
            """SELECT (SELECT count(*) FROM keys.api_keys AS k JOIN keys.users AS u ON u.id = COALESCE(k.created_by, k.account_id)
                       WHERE k.deleted_at IS NULL) AS keys,
                      (SELECT count(*) FROM keys.accounts) AS accounts,
                      (SELECT count(*) FROM keys.users) AS users,
                      (SELECT count(*) FROM keys.service_tokens WHERE revoked_at IS NULL) AS tokens,
                      (SELECT count(*) FROM keys.session_revocations WHERE revoked_at > %s) AS sessions""",
            (sessions_since,),
        )
        assert row is not None
        return {
            KEYS.name: row["keys"],
            ACCOUNTS.name: row["accounts"],
            USERS.name: row["users"],
            SERVICE_TOKENS.name: row["tokens"],
            SESSIONS.name: row["sessions"],
        }

    # ---- the audit log (v2) -------------------------------------------------------------------------
    async def insert_audit_entry(self, event: AuditRecorded) -> bool:
        """Store one audit.v1 event with its actor's e-mail as of now; False if its id is stored already."""
        actor = event.actor
        row = await self._one(
            """INSERT INTO keys.audit_log (id, account_id, time, actor_user_id, actor_email, actor_api_key_id,
                   actor_operator, action, target_type, target_id, ip, user_agent, details)
               VALUES (%s, %s, %s, %s, (SELECT email FROM keys.users WHERE id = %s), %s, %s, %s, %s, %s, %s, %s, %s)
               ON CONFLICT (id) DO NOTHING RETURNING id""",
            (
                event.id,
                event.account_id,
                event.time,
                actor.user_id,
                actor.user_id,
                actor.api_key_id,
                actor.operator,
                event.action.value,
                event.target.type,
                event.target.id,
                event.ip,
                event.user_agent,
                Jsonb(event.details),
            ),
        )
        return row is not None

    async def audit_entries(
        self,
        account_id: UUID,
        *,
        start: datetime | None,
        end: datetime | None,
        action: str | None,
        before: tuple[datetime, UUID] | None,
        limit: int,
    ) -> list[Row]:
        """Newest first, by keyset: the entries strictly before `before` (time, id), in [start, end)."""
        cursor_time, cursor_id = before if before is not None else (None, None)
        return await self._all(
            """SELECT * FROM keys.audit_log
               WHERE account_id = %(account)s
                 AND (%(start)s::timestamptz IS NULL OR time >= %(start)s)
                 AND (%(end)s::timestamptz IS NULL OR time < %(end)s)
                 AND (%(action)s::text IS NULL OR action = %(action)s)
                 AND (%(ct)s::timestamptz IS NULL OR (time, id) < (%(ct)s, %(cid)s::uuid))
               ORDER BY time DESC, id DESC LIMIT %(limit)s""",
            {
                "account": account_id,
                "start": start,
                "end": end,
                "action": action,
                "ct": cursor_time,
                "cid": cursor_id,
                "limit": limit,
            },
        )
