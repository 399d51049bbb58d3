"""Fakes of the ports the use cases take (cosmicpython's fakes): no I/O, so the unit suite runs
every use case in milliseconds. One section per service; the shared ones first."""

from datetime import UTC, datetime, timedelta


class FakeClock:
    """A Clock (contracts/clock.py) that stands still until told to move."""

    def __init__(self, now: datetime | None = None) -> None:
        self.now = now or datetime(2026, 11, 15, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


# ---- keys ----
# The keys service's ports (services/keys/service.py: Store, LocalEdge) in memory.
import copy  # noqa: E402
from collections.abc import AsyncIterator  # noqa: E402
from contextlib import asynccontextmanager  # noqa: E402
from typing import Any  # noqa: E402
from uuid import UUID  # noqa: E402

from contracts.topics import Topic  # noqa: E402

_KEY_COLUMNS = (
    "id",
    "account_id",
    "name",
    "hash",
    "masked_key",
    "status",
    "expires_at",
    "delete_at",
    "created_at",
    "last_used_at",
    "created_by",
)


class FakeKeysStore:
    """services/keys/store.py's KeysStore and KeysTx in one: the same methods on dicts. A
    transaction that raises is rolled back (its rows and outbox rows too), as Postgres would."""

    def __init__(self) -> None:
        self.accounts: dict[UUID, dict[str, Any]] = {}
        self.keys: dict[UUID, dict[str, Any]] = {}
        self.tokens: dict[UUID, dict[str, Any]] = {}
        self.users: dict[UUID, dict[str, Any]] = {}
        self.outbox: list[tuple[str, bytes, bytes | None]] = []  # (topic, key, value) committed or in flight

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator["FakeKeysStore"]:
        saved = copy.deepcopy((self.accounts, self.keys, self.tokens, self.users, self.outbox))
        try:
            yield self
        except BaseException:
            self.accounts, self.keys, self.tokens, self.users, self.outbox = saved
            raise

    async def publish(self, topic: Topic, key: bytes, value: bytes | None) -> None:
        self.outbox.append((topic.name, key, value))

    # ---- accounts
    async def insert_account(
        self, *, account_id: UUID, email: str, password_hash: str, name: str, user_type: str, roles: list[str]
    ) -> dict[str, Any] | None:
        if any(a["email"].lower() == email.lower() for a in self.accounts.values()):
            return None
        self.accounts[account_id] = {
            "id": account_id,
            "email": email,
            "password_hash": password_hash,
            "name": name,
            "user_type": user_type,
            "roles": list(roles),
            "plan": "free",
            "plan_time": None,
            "created_at": datetime(2026, 1, 1, tzinfo=UTC),
            "sessions_not_before": None,
        }
        return dict(self.accounts[account_id])

    async def account_by_email(self, email: str) -> dict[str, Any] | None:
        return next((dict(a) for a in self.accounts.values() if a["email"].lower() == email.lower()), None)

    async def account_by_id(self, account_id: UUID, *, for_update: bool = False) -> dict[str, Any] | None:
        row = self.accounts.get(account_id)
        return None if row is None else dict(row)

    async def _update_account(self, account_id: UUID, **values: Any) -> dict[str, Any] | None:
        row = self.accounts.get(account_id)
        if row is None:
            return None
        row.update(values)
        return dict(row)

    async def set_password_hash(self, account_id: UUID, password_hash: str) -> None:
        await self._update_account(account_id, password_hash=password_hash)

    async def set_password(self, account_id: UUID, password_hash: str, sessions_not_before: datetime) -> dict[str, Any] | None:
        return await self._update_account(account_id, password_hash=password_hash, sessions_not_before=sessions_not_before)

    async def set_user_type(self, account_id: UUID, user_type: str) -> dict[str, Any] | None:
        return await self._update_account(account_id, user_type=user_type)

    async def set_roles(self, account_id: UUID, roles: list[str]) -> dict[str, Any] | None:
        return await self._update_account(account_id, roles=list(roles))

    async def set_plan(self, account_id: UUID, plan: str, time: datetime) -> None:
        row = self.accounts.get(account_id)
        if row is not None and (row["plan_time"] is None or row["plan_time"] < time):
            row.update(plan=plan, plan_time=time)

    # ---- users
    async def insert_user(
        self, *, user_id: UUID, account_id: UUID, email: str, password_hash: str, name: str, role: str, created_at: datetime
    ) -> dict[str, Any] | None:
        if any(u["email"].lower() == email.lower() and u["removed_at"] is None for u in self.users.values()):
            return None
        self.users[user_id] = {
            "id": user_id,
            "account_id": account_id,
            "email": email,
            "password_hash": password_hash,
            "name": name,
            "role": role,
            "sessions_not_before": None,
            "created_at": created_at,
            "removed_at": None,
        }
        return dict(self.users[user_id])

    async def user_by_email(self, email: str) -> dict[str, Any] | None:
        found = (u for u in self.users.values() if u["email"].lower() == email.lower() and u["removed_at"] is None)
        return next((dict(u) for u in found), None)

    async def user_by_id(self, user_id: UUID) -> dict[str, Any] | None:
        row = self.users.get(user_id)
        return None if row is None else dict(row)

    async def set_user_password_hash(self, user_id: UUID, password_hash: str) -> None:
        self.users[user_id]["password_hash"] = password_hash

    async def set_user_password(self, user_id: UUID, password_hash: str, sessions_not_before: datetime) -> dict[str, Any] | None:
        return await self._update_user(user_id, password_hash=password_hash, sessions_not_before=sessions_not_before)

    async def _update_user(self, user_id: UUID, **values: Any) -> dict[str, Any] | None:
        row = self.users.get(user_id)
        if row is None:
            return None
        row.update(values)
        return dict(row)

    async def members_of(self, account_id: UUID) -> list[dict[str, Any]]:
        live = [u for u in self.users.values() if u["account_id"] == account_id and u["removed_at"] is None]
        return [dict(u) for u in sorted(live, key=lambda u: (u["created_at"], str(u["id"])))]

    async def members_for_update(self, account_id: UUID) -> list[dict[str, Any]]:
        return await self.members_of(account_id)

    async def set_user_role(self, user_id: UUID, role: str) -> dict[str, Any] | None:
        return await self._update_user(user_id, role=role)

    async def remove_user(self, user_id: UUID, now: datetime) -> dict[str, Any] | None:
        return await self._update_user(user_id, removed_at=now, sessions_not_before=now)

    async def live_keys_created_by(self, account_id: UUID, user_id: UUID) -> list[dict[str, Any]]:
        return [self._key(k) for k in self._live(account_id) if k["created_by"] == user_id]

    # ---- API keys
    @staticmethod
    def _key(row: dict[str, Any]) -> dict[str, Any]:
        return {c: row[c] for c in _KEY_COLUMNS}

    def _live(self, account_id: UUID) -> list[dict[str, Any]]:
        rows = [k for k in self.keys.values() if k["account_id"] == account_id and k["deleted_at"] is None]
        return sorted(rows, key=lambda k: (k["created_at"], str(k["id"])))

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
    ) -> dict[str, Any]:
        self.keys[key_id] = {
            "created_by": created_by,
            "id": key_id,
            "account_id": account_id,
            "name": name,
            "hash": digest,
            "masked_key": masked_key,
            "status": status,
            "expires_at": expires_at,
            "delete_at": None,
            "deleted_at": None,
            "created_at": created_at,
            "last_used_at": None,
        }
        return self._key(self.keys[key_id])

    async def key_for_update(self, account_id: UUID, key_id: UUID) -> dict[str, Any] | None:
        row = self.keys.get(key_id)
        if row is None or row["account_id"] != account_id or row["deleted_at"] is not None:
            return None
        return self._key(row)

    async def list_keys(self, account_id: UUID) -> list[dict[str, Any]]:
        return [self._key(k) for k in self._live(account_id)]

    async def live_keys_of(self, account_id: UUID) -> list[dict[str, Any]]:
        return [self._key(k) for k in self._live(account_id)]

    async def set_status(self, key_id: UUID, status: str) -> None:
        self.keys[key_id]["status"] = status

    async def set_expiry(self, key_id: UUID, expires_at: datetime, delete_at: datetime) -> None:
        self.keys[key_id].update(expires_at=expires_at, delete_at=delete_at)

    async def mark_deleted(self, key_id: UUID, now: datetime) -> None:
        self.keys[key_id]["deleted_at"] = now

    async def due_for_deletion(self, now: datetime, limit: int = 200) -> list[dict[str, Any]]:
        due = [k for k in self.keys.values() if k["deleted_at"] is None and k["delete_at"] is not None and k["delete_at"] <= now]
        return [self._key(k) for k in sorted(due, key=lambda k: k["delete_at"])[:limit]]

    async def touch_last_used(self, used: dict[UUID, datetime]) -> None:
        for key_id, at in used.items():
            row = self.keys.get(key_id)
            if row is not None and (row["last_used_at"] is None or row["last_used_at"] < at):
                row["last_used_at"] = at

    # ---- service tokens
    async def insert_service_token(
        self, *, token_id: UUID, name: str, digest: str, scopes: list[str], created_at: datetime
    ) -> dict[str, Any]:
        self.tokens[token_id] = {
            "id": token_id,
            "name": name,
            "hash": digest,
            "scopes": list(scopes),
            "created_at": created_at,
            "last_used_at": None,
            "revoked_at": None,
        }
        return dict(self.tokens[token_id])

    async def list_service_tokens(self) -> list[dict[str, Any]]:
        return [dict(t) for t in sorted(self.tokens.values(), key=lambda t: (t["created_at"], str(t["id"])))]

    async def service_token_is_live(self, token_id: UUID) -> bool:
        row = self.tokens.get(token_id)
        return row is not None and row["revoked_at"] is None

    async def revoke_service_token(self, token_id: UUID, now: datetime) -> dict[str, Any] | None:
        row = self.tokens.get(token_id)
        if row is None:
            return None
        row["revoked_at"] = row["revoked_at"] or now
        return dict(row)

    async def touch_service_tokens(self, used: dict[UUID, datetime]) -> None:
        for token_id, at in used.items():
            row = self.tokens.get(token_id)
            if row is not None and (row["last_used_at"] is None or row["last_used_at"] < at):
                row["last_used_at"] = at


class FakeLocalEdge:
    """services/keys/service.py's LocalEdge: records what was delivered, issues readable sessions."""

    def __init__(self) -> None:
        self.delivered: list[Any] = []  # the Changes of each delivery, in order
        self.accounts: set[UUID] = set()
        self.uses: dict[UUID, datetime] = {}

    async def deliver(self, changes: Any) -> None:
        self.delivered.append(changes)
        self.accounts.update(a.account_id for a in changes.accounts)

    def knows_account(self, account_id: UUID) -> bool:
        return account_id in self.accounts

    def issue_session(self, account_id: UUID, session_id: str, now: datetime, user_id: UUID) -> str:
        return f"tg1.{account_id}.{user_id}.{session_id}"

    def drain_service_token_uses(self) -> dict[UUID, datetime]:
        used, self.uses = self.uses, {}
        return used

    def note_service_token_use(self, token_id: UUID, at: datetime) -> None:
        if token_id not in self.uses or self.uses[token_id] < at:
            self.uses[token_id] = at
