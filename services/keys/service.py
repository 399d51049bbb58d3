"""The keys service's use cases: each change commits with its outbox rows, then (for the calls
that must take effect "at once") waits for the relay's Kafka ack and applies the new state to
this process's edge, so the serving process already judges by it when the response leaves."""

import asyncio
import hmac
import logging
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import cast
from uuid import UUID, uuid4

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from psycopg_pool import AsyncConnectionPool

from contracts.common import KeyStatus, Role, ServiceScope, Tier, UserType
from contracts.errors import ErrorCode
from contracts.events import AccountState, KeyState, ServiceTokenState, SessionRevoked, UserState, UserTypeChanged
from contracts.keys_api import RegisterRequest
from contracts.plans import user_type_may_take
from contracts.topics import ACCOUNTS, BILLING, KEYS, SESSIONS, USERS
from services.edge.edge import Edge
from services.edge.errors import ApiError, not_found
from services.edge.principal import Principal
from services.keys import domain, service_tokens, store
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.settings import Settings

log = logging.getLogger(__name__)
DELIVERY_TIMEOUT_S = 10.0
# Service tokens' last_used_at is written at most this often (approximate to it, by design).
SERVICE_TOKEN_USES_EVERY_S = 5.0


@dataclass
class _Changes:
    """The states a transaction published, applied to this process's edge after delivery."""

    keys: list[KeyState] = field(default_factory=list)
    accounts: list[AccountState] = field(default_factory=list)
    service_tokens: list[ServiceTokenState] = field(default_factory=list)
    users: list[UserState] = field(default_factory=list)
    sessions: list[SessionRevoked] = field(default_factory=list)


def _invalid_login() -> ApiError:
    return ApiError(401, ErrorCode.INVALID_CREDENTIALS, "The e-mail or the password is wrong.")


class KeysService:
    def __init__(self, pool: AsyncConnectionPool, settings: Settings, edge: Edge) -> None:
        self.pool = cast("AsyncConnectionPool[store.Conn]", pool)  # the host opens it with dict rows
        self.settings = settings
        self.edge = edge
        self.relay = OutboxRelay(pool, settings, "keys", on_tick=self._tick)
        self._uses_written_at = time.monotonic()
        self.hasher = PasswordHasher()
        # Verified against when the e-mail is unknown, so both failures cost the same time.
        self._dummy_hash = self.hasher.hash(secrets.token_urlsafe(16))

    # ---- publishing ------------------------------------------------------------------------
    async def _emit_key(self, conn: store.Conn, state: KeyState, changes: _Changes) -> None:
        key = str(state.key_id).encode()
        await self.relay.add(conn, KEYS, key, state.model_dump_json().encode())
        if state.deleted:
            await self.relay.add(conn, KEYS, key, None)  # tombstone: compaction forgets the key
        changes.keys.append(state)

    async def _emit_account(self, conn: store.Conn, row: store.Row, now: datetime, changes: _Changes) -> None:
        state = domain.account_state(
            account_id=row["id"], roles=[Role(r) for r in row["roles"]], user_type=UserType(row["user_type"]), now=now
        )
        await self.relay.add(conn, ACCOUNTS, str(row["id"]).encode(), state.model_dump_json().encode())
        changes.accounts.append(state)

    async def _emit_user(self, conn: store.Conn, row: store.Row, now: datetime, changes: _Changes) -> None:
        state = domain.user_state(
            account_id=row["id"], roles=[Role(r) for r in row["roles"]], sessions_not_before=row["sessions_not_before"], now=now
        )
        await self.relay.add(conn, USERS, str(state.user_id).encode(), state.model_dump_json().encode())
        changes.users.append(state)

    async def _deliver(self, changes: _Changes) -> None:
        """Wait for Kafka's ack of the committed rows, then make this process judge by them."""
        try:
            async with asyncio.timeout(DELIVERY_TIMEOUT_S):
                while await self.relay.flush() > 0:
                    pass
        except Exception as exc:
            log.warning("outbox delivery delayed; the relay will retry", exc_info=True)
            raise ApiError(
                503, ErrorCode.SERVICE_UNAVAILABLE, "The change is saved but not yet in effect everywhere; it will be shortly."
            ) from exc
        for account in changes.accounts:
            self.edge.accounts.apply(account)
        for key in changes.keys:
            self.edge.keys.apply(key)
        for token in changes.service_tokens:
            self.edge.service_tokens.apply(token)
        for user in changes.users:
            self.edge.users.apply(user)
        for revoked in changes.sessions:
            self.edge.revoked_sessions.apply(revoked, datetime.now(UTC))

    async def _tick(self) -> None:
        await self.sweep_rotated()
        if time.monotonic() - self._uses_written_at >= SERVICE_TOKEN_USES_EVERY_S:
            self._uses_written_at = time.monotonic()
            await self.write_service_token_uses()

    # ---- accounts ----------------------------------------------------------------------------
    async def register(self, body: RegisterRequest) -> store.Row:
        password_hash = await asyncio.to_thread(self.hasher.hash, body.password)
        now = datetime.now(UTC)
        changes = _Changes()
        async with self.pool.connection() as conn:
            row = await store.insert_account(
                conn,
                account_id=uuid4(),
                email=domain.normalize_email(body.email),
                password_hash=password_hash,
                name=body.name,
                user_type=body.user_type.value,
                roles=[r.value for r in domain.OWNER_ROLES],
            )
            if row is None:
                raise ApiError(409, ErrorCode.CONFLICT, "An account with this e-mail already exists.")
            await self._emit_account(conn, row, now, changes)
            await self._emit_user(conn, row, now, changes)
        await self._deliver(changes)
        return row

    async def login(self, email: str, password: str) -> tuple[str, int]:
        async with self.pool.connection() as conn:
            row = await store.account_by_email(conn, domain.normalize_email(email))
        stored = row["password_hash"] if row is not None else self._dummy_hash
        try:
            await asyncio.to_thread(self.hasher.verify, stored, password)
        except (VerificationError, InvalidHashError):
            raise _invalid_login() from None
        if row is None:
            raise _invalid_login()
        if self.hasher.check_needs_rehash(stored):
            new_hash = await asyncio.to_thread(self.hasher.hash, password)
            async with self.pool.connection() as conn:
                await store.set_password_hash(conn, row["id"], new_hash)
        if self.edge.accounts.get(row["id"]) is None:
            await self.republish_account(row["id"])  # e.g. accounts.v1 was recreated: heal it
        now = datetime.now(UTC)
        token = self.edge.issue_session(row["id"], secrets.token_urlsafe(16), now)
        return token, self.settings.session_ttl_seconds

    async def logout(self, principal: Principal) -> None:
        """sessions.v1: the session is refused by every edge; this one already when we answer."""
        assert principal.session_id is not None  # a console-only route
        now = datetime.now(UTC)
        event = SessionRevoked(
            time=now,
            account_id=principal.account_id,
            session_id=principal.session_id,
            user_id=principal.account_id,
            revoked_at=now,
        )  # user id = account id (one user)
        changes = _Changes(sessions=[event])
        async with self.pool.connection() as conn:
            await self.relay.add(conn, SESSIONS, event.session_id.encode(), event.model_dump_json().encode())
        await self._deliver(changes)

    async def change_password(self, account_id: UUID, current_password: str, new_password: str) -> None:
        """A new password; users.v1 `sessions_not_before = now` ends every session of the user."""
        if hmac.compare_digest(current_password.encode(), new_password.encode()):
            raise ApiError(
                422,
                ErrorCode.VALIDATION_ERROR,
                "The request is not valid.",
                details=[{"field": "new_password", "message": "must differ from the current password", "type": "value_error"}],
            )
        async with self.pool.connection() as conn:
            row = await store.account_by_id(conn, account_id)
        if row is None:
            raise not_found("account")
        try:
            await asyncio.to_thread(self.hasher.verify, row["password_hash"], current_password)
        except (VerificationError, InvalidHashError):
            raise ApiError(403, ErrorCode.PERMISSION_DENIED, "The current password is wrong.") from None
        new_hash = await asyncio.to_thread(self.hasher.hash, new_password)
        now = datetime.now(UTC)
        changes = _Changes()
        async with self.pool.connection() as conn:
            updated = await store.set_password(conn, account_id, new_hash, now)
            if updated is None:
                raise not_found("account")
            await self._emit_user(conn, updated, now, changes)
        await self._deliver(changes)

    async def account(self, account_id: UUID) -> store.Row:
        async with self.pool.connection() as conn:
            row = await store.account_by_id(conn, account_id)
        if row is None:
            raise not_found("account")
        return row

    async def republish_account(self, account_id: UUID) -> None:
        changes = _Changes()
        async with self.pool.connection() as conn:
            row = await store.account_by_id(conn, account_id)
            if row is None:
                return
            await self._emit_account(conn, row, datetime.now(UTC), changes)
        await self._deliver(changes)

    async def change_user_type(self, account_id: UUID, user_type: UserType) -> store.Row:
        now = datetime.now(UTC)
        changes = _Changes()
        async with self.pool.connection() as conn:
            current = await store.account_by_id(conn, account_id, for_update=True)
            if current is None:
                raise not_found("account")
            if not user_type_may_take(user_type, Tier(current["plan"])):
                raise ApiError(
                    409,
                    ErrorCode.USER_TYPE_PLAN_MISMATCH,
                    "An individual user cannot be on the enterprise plan; change the plan first.",
                )
            if current["user_type"] == user_type.value:
                return current
            row = await store.set_user_type(conn, account_id, user_type.value)
            assert row is not None
            await self._emit_account(conn, row, now, changes)
            event = UserTypeChanged(time=now, account_id=account_id, user_type=user_type)
            await self.relay.add(conn, BILLING, str(account_id).encode(), event.model_dump_json().encode())
        await self._deliver(changes)
        return row

    async def set_roles(self, account_id: UUID, roles: list[Role]) -> store.Row:
        """Operator call: new roles for the account and every live key of it, at once."""
        now = datetime.now(UTC)
        changes = _Changes()
        unique = [r.value for r in Role if r in roles]
        async with self.pool.connection() as conn:
            row = await store.set_roles(conn, account_id, unique)
            if row is None:
                raise not_found("account")
            await self._emit_account(conn, row, now, changes)
            await self._emit_user(conn, row, now, changes)
            for key in await store.live_keys_of(conn, account_id):
                await self._emit_key(conn, self._state(key, [Role(r) for r in unique], now), changes)
        await self._deliver(changes)
        return row

    async def set_plan(self, account_id: UUID, plan: Tier, time: datetime) -> None:
        async with self.pool.connection() as conn:
            await store.set_plan(conn, account_id, plan.value, time)

    # ---- API keys ------------------------------------------------------------------------------
    @staticmethod
    def _state(row: store.Row, roles: list[Role], now: datetime, *, deleted: bool = False) -> KeyState:
        return domain.key_state(
            key_id=row["id"],
            account_id=row["account_id"],
            digest=row["hash"].strip(),
            status=KeyStatus(row["status"]),
            expires_at=row["expires_at"],
            roles=roles,
            now=now,
            masked_key=row["masked_key"],  # metering's activity log shows it
            deleted=deleted,
        ).model_copy(update={"created_at": row.get("created_at")})  # alerts' rotation reminder (keys.v1)

    async def _roles(self, conn: store.Conn, account_id: UUID) -> list[Role]:
        account = await store.account_by_id(conn, account_id)
        if account is None:
            raise not_found("account")
        return [Role(r) for r in account["roles"]]

    async def _insert_new_key(
        self, conn: store.Conn, account_id: UUID, name: str, expires_at: datetime | None, now: datetime, changes: _Changes
    ) -> tuple[store.Row, str]:
        secret = domain.new_secret()
        row = await store.insert_key(
            conn,
            key_id=uuid4(),
            account_id=account_id,
            name=name,
            digest=domain.digest(secret),
            masked_key=domain.mask(secret),
            status=KeyStatus.ENABLED.value,
            expires_at=expires_at,
            created_at=now,
        )
        await self._emit_key(conn, self._state(row, await self._roles(conn, account_id), now), changes)
        return row, secret

    async def create_key(self, account_id: UUID, name: str, expires_at: datetime | None) -> tuple[store.Row, str]:
        now = datetime.now(UTC)
        if expires_at is not None and expires_at <= now:
            raise ApiError(
                422,
                ErrorCode.VALIDATION_ERROR,
                "The request is not valid.",
                details=[{"field": "expires_at", "message": "must be in the future", "type": "value_error"}],
            )
        changes = _Changes()
        async with self.pool.connection() as conn:
            row, secret = await self._insert_new_key(conn, account_id, name, expires_at, now, changes)
        await self._deliver(changes)
        return row, secret

    async def list_keys(self, account_id: UUID) -> list[store.Row]:
        async with self.pool.connection() as conn:
            return await store.list_keys(conn, account_id)

    async def toggle(self, account_id: UUID, key_id: UUID) -> store.Row:
        now = datetime.now(UTC)
        changes = _Changes()
        async with self.pool.connection() as conn:
            row = await store.key_for_update(conn, account_id, key_id)
            if row is None:
                raise not_found("API key")
            row["status"] = domain.toggled(KeyStatus(row["status"])).value
            await store.set_status(conn, key_id, row["status"])
            await self._emit_key(conn, self._state(row, await self._roles(conn, account_id), now), changes)
        await self._deliver(changes)
        return row

    async def delete(self, account_id: UUID, key_id: UUID) -> None:
        now = datetime.now(UTC)
        changes = _Changes()
        async with self.pool.connection() as conn:
            row = await store.key_for_update(conn, account_id, key_id)
            if row is None:
                raise not_found("API key")
            await store.mark_deleted(conn, key_id, now)
            await self._emit_key(conn, self._state(row, await self._roles(conn, account_id), now, deleted=True), changes)
        await self._deliver(changes)

    async def rotate(self, account_id: UUID, key_id: UUID, grace_seconds: int) -> tuple[store.Row, str]:
        now = datetime.now(UTC)
        changes = _Changes()
        async with self.pool.connection() as conn:
            old = await store.key_for_update(conn, account_id, key_id)
            if old is None:
                raise not_found("API key")
            roles = await self._roles(conn, account_id)
            if grace_seconds == 0:
                await store.mark_deleted(conn, key_id, now)
                await self._emit_key(conn, self._state(old, roles, now, deleted=True), changes)
            else:
                old["expires_at"] = domain.rotation_expiry(old["expires_at"], now, grace_seconds)
                await store.set_expiry(conn, key_id, old["expires_at"], old["expires_at"])
                await self._emit_key(conn, self._state(old, roles, now), changes)
            row, secret = await self._insert_new_key(conn, account_id, old["name"], None, now, changes)
        await self._deliver(changes)
        return row, secret

    async def sweep_rotated(self) -> None:
        """Delete for good the rotated keys whose grace period is over (the relay then sends)."""
        now = datetime.now(UTC)
        changes = _Changes()
        async with self.pool.connection() as conn:
            for row in await store.due_for_deletion(conn, now):
                await store.mark_deleted(conn, row["id"], now)
                await self._emit_key(
                    conn, self._state(row, await self._roles(conn, row["account_id"]), now, deleted=True), changes
                )

    async def note_calls(self, used: dict[UUID, datetime]) -> None:
        async with self.pool.connection() as conn:
            await store.touch_last_used(conn, used)

    # ---- service tokens (operator) -----------------------------------------------------------
    async def create_service_token(self, name: str, scopes: list[ServiceScope]) -> tuple[store.Row, str]:
        changes = _Changes()
        async with self.pool.connection() as conn:
            row, token, state = await service_tokens.create(conn, self.relay, name, scopes, datetime.now(UTC))
            changes.service_tokens.append(state)
        await self._deliver(changes)
        return row, token

    async def list_service_tokens(self) -> list[store.Row]:
        async with self.pool.connection() as conn:
            return await service_tokens.list_all(conn)

    async def revoke_service_token(self, token_id: UUID) -> None:
        """Answers after the revocation is in Kafka and in force in this process."""
        changes = _Changes()
        async with self.pool.connection() as conn:
            state = await service_tokens.revoke(conn, self.relay, token_id, datetime.now(UTC))
            if state is None:
                raise not_found("service token")
            changes.service_tokens.append(state)
        await self._deliver(changes)

    async def write_service_token_uses(self) -> None:
        """The uses this process's edge noted, in one UPDATE (kept for the next try if it fails)."""
        used = self.edge.service_tokens.drain_uses()
        if not used:
            return
        try:
            async with self.pool.connection() as conn:
                await store.touch_service_tokens(conn, used)
        except Exception:
            for token_id, at in used.items():
                self.edge.service_tokens.note_use(token_id, at)
            raise
