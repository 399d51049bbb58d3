"""The keys service's use cases: each change commits with its outbox rows, then (for the calls
that must take effect "at once") waits for the relay's Kafka ack and applies the new state to
this process's edge (`LocalEdge.deliver`), so the serving process already judges by it when the
response leaves. They raise domain errors (services/keys/domain.py) and know nothing of HTTP."""

import asyncio
import hmac
import secrets
import time
from collections.abc import Callable, Collection
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol, TypeVar
from uuid import UUID, uuid4

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from contracts import keyset_cursor
from contracts.audit import AuditAction, AuditContext, AuditLog, AuditRecorded
from contracts.clock import Clock
from contracts.common import KeyStatus, Role, ServiceScope, Tier, UserType
from contracts.credentials import hash_secret, mask, new_api_key, rotation_due
from contracts.domain_errors import NotFound
from contracts.events import (
    AccountState,
    KeyState,
    PlanChanged,
    ServiceTokenState,
    SessionRevoked,
    UserState,
    UserTypeChanged,
    order_of,
)
from contracts.key_limits import KeyRules
from contracts.keys_api import KeyUpdateRequest, RegisterRequest
from contracts.plans import catalogue, user_type_may_take
from contracts.topics import ACCOUNTS, AUDIT, BILLING, KEYS, SERVICE_TOKENS, SESSIONS, USERS
from services.keys import domain, reconcile, service_tokens
from services.keys.domain import EmailTaken, InvalidCredentials, InvalidField, UserTypePlanMismatch, WrongCurrentPassword
from services.keys.published import Published
from services.keys.store import KeysTx, Row

# The topics whose every state the keys service owns and can publish again from Postgres.
T = TypeVar("T")

REPUBLISHED_TOPICS: tuple[str, ...] = (ACCOUNTS.name, USERS.name, KEYS.name, SERVICE_TOKENS.name, SESSIONS.name)

# Service tokens' last_used_at is written at most this often (approximate to it, by design).
SERVICE_TOKEN_USES_EVERY_S = 5.0

# argon2 hashes and checks running at once in this process, whatever arrives: each takes 64 MiB and
# ~0.4 s of a core (argon2-cffi's defaults), so a burst of sign-ups or logins from many addresses
# (each within its throttle) holds at most 256 MiB, and leaves the rest of asyncio's default thread
# pool (min(32, cores + 4) threads, shared with metering's ClickHouse reads) to the other work.
HASHES_IN_FLIGHT = 4


@dataclass(frozen=True)
class UserChange:
    """A user removed or given another role: no replica may judge its sessions or its keys by an
    older users.v1 state of it once the change has answered (LocalEdge.deliver)."""

    user: UserState
    key_ids: list[UUID]  # its live keys (their leased calls were taken with the older role)


@dataclass
class Changes:
    """The states a transaction published, applied to this process's edge after delivery."""

    keys: list[KeyState] = field(default_factory=list)
    accounts: list[AccountState] = field(default_factory=list)
    service_tokens: list[ServiceTokenState] = field(default_factory=list)
    users: list[UserState] = field(default_factory=list)
    sessions: list[SessionRevoked] = field(default_factory=list)
    # (v4) keys whose rules changed: other replicas must not judge them by an older state
    narrowed: list[KeyState] = field(default_factory=list)
    # users removed or given another role: every replica refuses their sessions and keys judged
    # by an older state of them
    user_changes: list[UserChange] = field(default_factory=list)
    # users whose sessions_not_before moved (a password change): every replica refuses their
    # sessions issued before it
    sessions_ended: list[UserState] = field(default_factory=list)


class Store(Protocol):
    """services/keys/store.py's KeysStore (tests: a fake in memory)."""

    def transaction(self) -> AbstractAsyncContextManager[KeysTx]: ...


class LocalEdge(Protocol):
    """This process's edge, as the use cases see it (services/keys/delivery.py)."""

    async def deliver(self, changes: Changes) -> None:
        """Wait for Kafka's ack of the committed outbox rows, then make this process judge by them."""

    def knows_account(self, account_id: UUID) -> bool: ...

    def latest_plan(self, account_id: UUID) -> PlanChanged | None:
        """The newest plan_changed this process's edge holds for the account (None: never changed)."""

    def issue_session(self, account_id: UUID, session_id: str, now: datetime, user_id: UUID) -> str: ...

    def drain_service_token_uses(self) -> dict[UUID, datetime]: ...

    def note_service_token_use(self, token_id: UUID, at: datetime) -> None: ...


class KeysService:
    def __init__(
        self,
        store: Store,
        edge: LocalEdge,
        clock: Clock,
        *,
        session_ttl_seconds: int,
        hasher: PasswordHasher | None = None,
    ) -> None:
        self.store = store
        self.edge = edge
        self.clock = clock
        self.session_ttl_seconds = session_ttl_seconds
        self._uses_written_at = time.monotonic()
        self.hasher = hasher or PasswordHasher()
        self._hashing = asyncio.Semaphore(HASHES_IN_FLIGHT)
        # Verified against when the e-mail is unknown, so both failures cost the same time.
        self._dummy_hash = self.hasher.hash(secrets.token_urlsafe(16))

    async def _argon2(self, work: Callable[..., T], *args: str) -> T:
        """One argon2 hash or check, off the event loop, at most HASHES_IN_FLIGHT at once."""
        async with self._hashing:
            return await asyncio.to_thread(work, *args)

    # ---- publishing ------------------------------------------------------------------------
    async def _emit_key(self, tx: KeysTx, state: KeyState, changes: Changes) -> None:
        key = str(state.key_id).encode()
        await tx.publish(KEYS, key, state.model_dump_json().encode())
        if state.deleted:
            await tx.publish(KEYS, key, None)  # tombstone: compaction forgets the key
        changes.keys.append(state)

    async def _emit_account(self, tx: KeysTx, row: Row, now: datetime, changes: Changes) -> None:
        """The account's state; a deleted row's (`deleted_at`) stays deleted whoever republishes it."""
        state = domain.account_state(
            account_id=row["id"],
            roles=[Role(r) for r in row["roles"]],
            user_type=UserType(row["user_type"]),
            now=now,
            version=row["version"],
        ).model_copy(update={"deleted": row.get("deleted_at") is not None})
        await tx.publish(ACCOUNTS, str(row["id"]).encode(), state.model_dump_json().encode())
        changes.accounts.append(state)

    async def _emit_user(self, tx: KeysTx, user: Row, now: datetime, changes: Changes) -> None:
        state = domain.user_state(user, now)
        await tx.publish(USERS, str(state.user_id).encode(), state.model_dump_json().encode())
        changes.users.append(state)

    @staticmethod
    async def _audit(
        tx: KeysTx,
        audit: AuditContext,
        account_id: UUID,
        now: datetime,
        action: AuditAction,
        target: tuple[str, UUID | str],
        **details: object,
    ) -> None:
        """The write's audit.v1 entry, in the write's own transaction (keyed by account: in order)."""
        entry = audit.entry(account_id, now, action, target[0], target[1], **details)
        await tx.publish(AUDIT, str(account_id).encode(), entry.model_dump_json().encode())

    async def tick(self) -> None:
        """The periodic work (keys/app.py): rotated keys past their grace, service tokens' uses."""
        await self.sweep_rotated()
        if time.monotonic() - self._uses_written_at >= SERVICE_TOKEN_USES_EVERY_S:
            self._uses_written_at = time.monotonic()
            await self.write_service_token_uses()

    # ---- accounts ----------------------------------------------------------------------------
    async def register(self, body: RegisterRequest) -> Row:
        password_hash = await self._argon2(self.hasher.hash, body.password)
        now = self.clock()
        changes = Changes()
        async with self.store.transaction() as tx:
            row = await tx.insert_account(
                account_id=uuid4(),
                email=domain.normalize_email(body.email),
                password_hash=password_hash,
                name=body.name,
                user_type=body.user_type.value,
                roles=[r.value for r in domain.OWNER_ROLES],
            )
            # the registering user: the account's owner, whose user id is the account id
            user = (
                None
                if row is None
                else await tx.insert_user(
                    user_id=row["id"],
                    account_id=row["id"],
                    email=row["email"],
                    password_hash=password_hash,
                    name=body.name,
                    role=Role.OWNER.value,
                    created_at=now,
                )
            )
            if row is None or user is None:
                raise EmailTaken()  # the transaction rolls back the account too
            await self._emit_account(tx, row, now, changes)
            await self._emit_user(tx, user, now, changes)
        await self.edge.deliver(changes)
        return {**row, "role": user["role"], "roles": [user["role"]]}  # as GET /api/account answers its user

    async def login(self, email: str, password: str) -> tuple[str, int]:
        """A console session token and its lifetime in seconds."""
        async with self.store.transaction() as tx:
            row = await tx.user_by_email(domain.normalize_email(email))
        stored = row["password_hash"] if row is not None else self._dummy_hash
        try:
            await self._argon2(self.hasher.verify, stored, password)
        except (VerificationError, InvalidHashError):
            raise InvalidCredentials() from None
        if row is None:
            raise InvalidCredentials()
        rehashed = await self._argon2(self.hasher.hash, password) if self.hasher.check_needs_rehash(stored) else None
        async with self.store.transaction() as tx:
            # A password change may have landed while argon2 verified the old one (tens of ms): the
            # old password then opens no session, and its rehash does not put it back. Else the row
            # stays locked while the session's time is taken, and a change waits for that before it
            # takes its own (change_password): a session the old password opens here is older than
            # the change's sessions_not_before, and ends with it.
            user = await tx.keep_password_hash(row["id"], stored, rehashed)
            if user is None:
                raise InvalidCredentials()
            issued_at = self.clock()
            if user["sessions_not_before"] is not None:  # this replica's clock behind the change's
                issued_at = max(issued_at, user["sessions_not_before"])
        if not self.edge.knows_account(row["account_id"]):
            await self.republish_account(row["account_id"])  # e.g. accounts.v1 was recreated: heal it
        token = self.edge.issue_session(row["account_id"], secrets.token_urlsafe(16), issued_at, row["id"])
        return token, self.session_ttl_seconds

    async def logout(self, account_id: UUID, user_id: UUID, session_id: str, *, audit: AuditContext) -> None:
        """sessions.v1: the session is refused by every edge; this one already when we answer."""
        now = self.clock()
        event = SessionRevoked(time=now, account_id=account_id, session_id=session_id, user_id=user_id, revoked_at=now)
        async with self.store.transaction() as tx:
            await tx.publish(SESSIONS, event.session_id.encode(), event.model_dump_json().encode())
            # kept in Postgres too, so a Kafka that lost sessions.v1 can be given it again (republish)
            await tx.insert_session_revocation(account_id, user_id, session_id, now)
            await self._audit(tx, audit, account_id, now, AuditAction.SESSION_LOGOUT, ("user", user_id))
        await self.edge.deliver(Changes(sessions=[event]))

    async def change_password(self, user_id: UUID, current_password: str, new_password: str, *, audit: AuditContext) -> None:
        """A new password; users.v1 `sessions_not_before = now` ends every session of the user."""
        if hmac.compare_digest(current_password.encode(), new_password.encode()):
            raise InvalidField("new_password", "must differ from the current password")
        async with self.store.transaction() as tx:
            row = await tx.user_by_id(user_id)
        if row is None or row["removed_at"] is not None:
            raise NotFound("account")
        try:
            await self._argon2(self.hasher.verify, row["password_hash"], current_password)
        except (VerificationError, InvalidHashError):
            raise WrongCurrentPassword() from None
        new_hash = await self._argon2(self.hasher.hash, new_password)
        changes = Changes()
        async with self.store.transaction() as tx:
            # The row locked before the change's time is taken: a login that checked the old
            # password took its session's time under its lock (login), so that session is older.
            if await tx.user_by_id(user_id, for_update=True) is None:
                raise NotFound("account")
            now = self.clock()
            updated = await tx.set_user_password(user_id, new_hash, now)
            if updated is None:
                raise NotFound("account")
            await self._emit_user(tx, updated, now, changes)
            changes.sessions_ended.append(changes.users[-1])
            await self._audit(tx, audit, updated["account_id"], now, AuditAction.PASSWORD_CHANGED, ("user", user_id))
        await self.edge.deliver(changes)

    async def account(self, account_id: UUID, user_id: UUID | None = None) -> Row:
        """The account as its user sees it: that user's `role`, and `roles: [role]` for v1 clients."""
        async with self.store.transaction() as tx:
            row = await tx.account_by_id(account_id)
            user = await tx.user_by_id(user_id or account_id)
        if row is None:
            raise NotFound("account")
        if user is None or user["account_id"] != account_id:
            return row
        return {**row, "role": user["role"], "roles": [user["role"]]}

    async def republish_account(self, account_id: UUID) -> None:
        changes = Changes()
        async with self.store.transaction() as tx:
            row = await tx.account_by_id(account_id)
            if row is None:
                return
            await self._emit_account(tx, row, self.clock(), changes)
        await self.edge.deliver(changes)

    # ---- republishing (docs/architecture.md, "Kafka is transport") --------------------------------
    async def republish(self, topics: Collection[str] = REPUBLISHED_TOPICS, published: Published | None = None) -> dict[str, int]:
        """The current state of every object of `topics` again, from Postgres, through the outbox,
        then applied to this process's edge; how many states per topic. Each state keeps its
        row's version, so consumers that hold it already change nothing, and the rows are read
        under a share lock: a write racing this one publishes after it, never before.
        `published`: what those topics hold now (services/keys/published.py). Given it, the
        republish also reconciles Kafka with a Postgres that is behind it (a restore:
        services/keys/reconcile.py): rows behind Kafka's version first move past it, and what
        Kafka holds live but Postgres does not (made after the backup) is ended; those ends are
        counted with the topic's states."""
        unknown = sorted(set(topics) - set(REPUBLISHED_TOPICS))
        if unknown:
            raise ValueError(f"the keys service does not own {unknown}")
        now = self.clock()
        changes = Changes()
        accounts: list[Row] = []
        users: list[Row] = []
        live_keys: list[Row] = []
        ended_keys: list[Row] = []  # deleted by the reconcile: Kafka held them ended
        async with self.store.transaction() as tx:
            behind = await reconcile.move_past(tx, published, topics) if published is not None else {}
            if ACCOUNTS.name in topics:  # the locking order of the writers: account, users, keys
                accounts = await tx.all_accounts()
                if published is not None:
                    accounts = await reconcile.keep_accounts_deleted(tx, published, accounts, now)
                for row in accounts:
                    await self._emit_account(tx, row, now, changes)
            if USERS.name in topics:
                users = await tx.all_users()
                if published is not None:
                    users, ended_keys = await reconcile.keep_users_removed(tx, published, users, now)
                for user in users:
                    await self._emit_user(tx, user, now, changes)
            if KEYS.name in topics:
                live_keys = await tx.all_live_keys()
                if published is not None:
                    live_keys, deleted_keys = await reconcile.keep_keys_ended(tx, published, behind[KEYS.name], live_keys, now)
                    ended_keys += deleted_keys
                for key in live_keys:
                    if key["creator_role"] is not None:  # a key without its user is refused anyway
                        await self._emit_key(tx, self._state(key, [Role(key["creator_role"])], now), changes)
            for key in ended_keys:
                await self._emit_key(tx, self._state(key, [Role(key["creator_role"] or Role.VIEWER)], now, deleted=True), changes)
            if SERVICE_TOKENS.name in topics:
                kept_revoked = await reconcile.keep_tokens_revoked(tx, published, now) if published is not None else []
                changes.service_tokens = kept_revoked + await service_tokens.republish(tx, now)
            if SESSIONS.name in topics:
                for row in await tx.session_revocations_since(self.sessions_matter_since(now)):
                    event = SessionRevoked(
                        time=row["revoked_at"],
                        account_id=row["account_id"],
                        session_id=row["session_id"],
                        user_id=row["user_id"],
                        revoked_at=row["revoked_at"],
                    )
                    await tx.publish(SESSIONS, event.session_id.encode(), event.model_dump_json().encode())
                    changes.sessions.append(event)
            if published is not None:  # after the live states: an account's end after its users' and keys'
                if KEYS.name in topics:
                    for ghost in reconcile.ghost_keys(published, (k["id"] for k in live_keys), now):
                        await self._emit_key(tx, ghost, changes)
                if SERVICE_TOKENS.name in topics:
                    live = [t.token_id for t in changes.service_tokens]
                    for gone in reconcile.ghost_service_tokens(published, live, now):
                        await service_tokens.emit(tx, gone)
                        changes.service_tokens.append(gone)
                if USERS.name in topics:
                    for removed in reconcile.ghost_users(published, (u["id"] for u in users), now):
                        await tx.publish(USERS, str(removed.user_id).encode(), removed.model_dump_json().encode())
                        changes.users.append(removed)
                if ACCOUNTS.name in topics:
                    for deleted in reconcile.ghost_accounts(published, (a["id"] for a in accounts), now):
                        await tx.publish(ACCOUNTS, str(deleted.account_id).encode(), deleted.model_dump_json().encode())
                        changes.accounts.append(deleted)
        await self.edge.deliver(changes)
        counts = {
            ACCOUNTS.name: len(changes.accounts),
            USERS.name: len(changes.users),
            KEYS.name: len(changes.keys),
            SERVICE_TOKENS.name: len(changes.service_tokens),
            SESSIONS.name: len(changes.sessions),
        }
        return {topic: n for topic, n in counts.items() if topic in topics}

    def sessions_matter_since(self, now: datetime) -> datetime:
        """A logout before this instant ended a session that has expired by itself since."""
        return now - timedelta(seconds=self.session_ttl_seconds)

    async def held_states(self) -> dict[str, int]:
        """How many live states each of the service's topics should hold (services/runtime/platform/state_guard.py)."""
        async with self.store.transaction() as tx:
            return await tx.state_counts(self.sessions_matter_since(self.clock()))

    async def change_user_type(self, account_id: UUID, user_type: UserType, *, audit: AuditContext) -> Row:
        now = self.clock()
        changes = Changes()
        async with self.store.transaction() as tx:
            current = await tx.account_by_id(account_id, for_update=True)
            if current is None:
                raise NotFound("account")
            if not user_type_may_take(user_type, self._plan_in_force(current)):
                raise UserTypePlanMismatch()
            if current["user_type"] == user_type.value:
                return current
            row = await tx.set_user_type(account_id, user_type.value)
            assert row is not None
            await self._emit_account(tx, row, now, changes)
            event = UserTypeChanged(time=now, account_id=account_id, user_type=user_type, version=row["version"])
            await tx.publish(BILLING, str(account_id).encode(), event.model_dump_json().encode())
            await self._audit(
                tx,
                audit,
                account_id,
                now,
                AuditAction.USER_TYPE_CHANGED,
                ("account", account_id),
                user_type=user_type.value,
                previous_user_type=current["user_type"],
            )
        await self.edge.deliver(changes)
        return row

    def _plan_in_force(self, account: Row) -> Tier:
        """The newer of the plan keys' billing.v1 consumer stored and the one this process's edge
        holds. A payment is applied to the edge before it answers, while keys' consumer may not have
        seen it yet: judged by the stored plan alone, an account that had just paid for enterprise
        could become individual at once (version 12 broken)."""
        stored = Tier(account["plan"])
        edge = self.edge.latest_plan(account["id"])
        if edge is None:
            return stored
        if account["plan_time"] is None or (account["plan_version"], account["plan_time"]) < order_of(edge):
            return edge.plan
        return stored

    async def set_roles(self, account_id: UUID, roles: list[Role], *, audit: AuditContext) -> Row:
        """Operator call: new roles for the account and every live key of it, at once."""
        now = self.clock()
        changes = Changes()
        unique = [r.value for r in Role if r in roles]
        async with self.store.transaction() as tx:
            current = await tx.account_by_id(account_id, for_update=True)
            if current is None:
                raise NotFound("account")
            row = await tx.set_roles(account_id, unique)
            assert row is not None
            if list(current["roles"]) != unique:
                target = ("account", account_id)
                await self._audit(
                    tx,
                    audit,
                    account_id,
                    now,
                    AuditAction.ACCOUNT_ROLES_CHANGED,
                    target,
                    roles=unique,
                    previous_roles=list(current["roles"]),
                )
            await self._emit_account(tx, row, now, changes)
            # the registering user's role (user id = account id); keys.v1 `roles` of its keys
            role = domain.user_role([Role(r) for r in unique])
            previous = await tx.user_by_id(account_id)
            user = await tx.set_user_role(account_id, role.value)
            if user is not None:
                await self._emit_user(tx, user, now, changes)
                restamped = await tx.restamp_keys_created_by(account_id, account_id)
                for key in restamped:
                    await self._emit_key(tx, self._state(key, [role], now), changes)
                if previous is not None and previous["role"] != role.value:
                    changes.user_changes.append(UserChange(changes.users[-1], [key["id"] for key in restamped]))
        await self.edge.deliver(changes)
        return row

    async def set_plan(self, account_id: UUID, plan: Tier, time: datetime, version: int) -> None:
        """billing.v1 `plan_changed` (GET /api/account's plan)."""
        async with self.store.transaction() as tx:
            await tx.set_plan(account_id, plan.value, time, version)

    # ---- API keys ------------------------------------------------------------------------------
    @staticmethod
    def _state(row: Row, roles: list[Role], now: datetime, *, deleted: bool = False) -> KeyState:
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
            created_at=row["created_at"],  # alerts' rotation reminder (keys.v1)
            created_by=row["created_by"],
            version=row["version"],  # taken under the row lock: the order consumers keep
            rules=KeyRules.model_validate(row["rules"]),  # (v4) every state carries the key's rules
            lineage_id=row["lineage_id"],  # (v4) its limits count its whole lineage's spending
        )

    async def _roles(self, tx: KeysTx, key: Row) -> list[Role]:
        """keys.v1 `roles`: the creating user's current role."""
        creator = await tx.user_by_id(key["created_by"] or key["account_id"])
        if creator is None:
            raise NotFound("account")
        return [Role(creator["role"])]

    @staticmethod
    async def _key_to_write(tx: KeysTx, account_id: UUID, key_id: UUID, only_own: UUID | None) -> Row:
        """The key's row, locked for the write: another account's or a deleted key is NotFound; a
        developer (`only_own`: its user id) may write only the keys it created (403 else)."""
        row = await tx.key_for_update(account_id, key_id)
        if row is None:
            raise NotFound("API key")
        if only_own is not None and row["created_by"] != only_own:
            raise domain.NotYourKey()
        return row

    async def _insert_new_key(
        self,
        tx: KeysTx,
        account_id: UUID,
        user_id: UUID,
        name: str,
        expires_at: datetime | None,
        now: datetime,
        changes: Changes,
        rules: KeyRules,
        lineage_id: UUID | None = None,
    ) -> tuple[Row, str]:
        """`lineage_id`: the predecessor's lineage for a rotated key; None starts a lineage (the new id)."""
        secret = new_api_key()
        key_id = uuid4()
        row = await tx.insert_key(
            key_id=key_id,
            account_id=account_id,
            name=name,
            digest=hash_secret(secret),
            masked_key=mask(secret),
            status=KeyStatus.ENABLED.value,
            expires_at=expires_at,
            created_at=now,
            created_by=user_id,
            rules=rules.model_dump(mode="json", exclude_defaults=True),
            lineage_id=lineage_id or key_id,
        )
        await self._emit_key(tx, self._state(row, await self._roles(tx, row), now), changes)
        return row, secret

    async def create_key(
        self,
        account_id: UUID,
        user_id: UUID,
        name: str,
        expires_at: datetime | None,
        *,
        audit: AuditContext,
        rules: KeyRules | None = None,
    ) -> tuple[Row, str]:
        """The new key's row and its secret (shown once; only its hash is stored). (v4) `rules`:
        its own limits and restrictions; a rate limit above the account plan's is refused."""
        now = self.clock()
        if expires_at is not None and expires_at <= now:
            raise InvalidField("expires_at", "must be in the future")
        rules = rules or KeyRules()
        changes = Changes()
        async with self.store.transaction() as tx:
            await self._check_within_plan(tx, account_id, rules)
            row, secret = await self._insert_new_key(tx, account_id, user_id, name, expires_at, now, changes, rules)
            await self._audit(tx, audit, account_id, now, AuditAction.API_KEY_CREATED, ("api_key", row["id"]), name=name)
        await self.edge.deliver(changes)
        return row, secret

    @staticmethod
    async def _check_within_plan(tx: KeysTx, account_id: UUID, rules: KeyRules) -> None:
        """The account's plan as billing.v1 last told this service (keys.accounts.plan)."""
        if rules.rate_limit is None:
            return
        account = await tx.account_by_id(account_id)
        if account is None:
            raise NotFound("account")
        domain.check_within_plan(rules.rate_limit, catalogue()[Tier(account["plan"])].rate_limit)

    async def update(
        self,
        account_id: UUID,
        key_id: UUID,
        body: KeyUpdateRequest,
        *,
        audit: AuditContext,
        only_own: UUID | None = None,
    ) -> Row:
        """(v4) PATCH: the key's name and rules; absent fields unchanged, null ones cleared. The new
        state (its version bumped under the row lock) is in force in this process when this
        answers, and every other replica refuses the key's calls judged by an older state
        (`Changes.narrowed`) until keys.v1 brings it: a narrowed key never widens by a race."""
        now = self.clock()
        changes = Changes()
        async with self.store.transaction() as tx:
            row = await self._key_to_write(tx, account_id, key_id, only_own)
            current = KeyRules.model_validate(row["rules"])
            rules = current.model_copy(update=body.rules_given())
            name = body.name if body.name is not None else row["name"]
            changed = {f: v for f, v in rules.model_dump(mode="json").items() if getattr(current, f) != getattr(rules, f)}
            if name != row["name"]:
                changed["name"] = name
            if not changed:
                return self._listed(row, now)  # nothing to write, publish or audit
            if "rate_limit" in changed:
                await self._check_within_plan(tx, account_id, rules)
            row = await tx.set_rules(key_id, name, rules.model_dump(mode="json", exclude_defaults=True))
            state = self._state(row, await self._roles(tx, row), now)
            await self._emit_key(tx, state, changes)
            changes.narrowed.append(state)
            await self._audit(tx, audit, account_id, now, AuditAction.API_KEY_UPDATED, ("api_key", key_id), **changed)
        await self.edge.deliver(changes)
        return self._listed(row, now)

    async def list_keys(self, account_id: UUID) -> list[Row]:
        """Live keys, oldest first; `status` is the listed one (`expired` computed now)."""
        async with self.store.transaction() as tx:
            rows = await tx.list_keys(account_id)
        now = self.clock()
        return [self._listed(r, now) for r in rows]

    @staticmethod
    def _listed(row: Row, now: datetime) -> Row:
        """A key as listed: `status` as listed (`expired` computed now), `rotation_due`, `rotated`
        (in the grace period of its rotation: the console offers no second rotation)."""
        return {
            **row,
            "status": domain.listed_status(KeyStatus(row["status"]), row["expires_at"], now),
            "rotation_due": rotation_due(row["created_at"], now),
            "rotated": row["delete_at"] is not None,
        }

    async def toggle(self, account_id: UUID, key_id: UUID, *, audit: AuditContext, only_own: UUID | None = None) -> Row:
        """`only_own`: the developer's user id (it may write only the keys it created; 403 else)."""
        now = self.clock()
        changes = Changes()
        async with self.store.transaction() as tx:
            row = await self._key_to_write(tx, account_id, key_id, only_own)
            row = await tx.set_status(key_id, domain.toggled(KeyStatus(row["status"])).value)
            await self._emit_key(tx, self._state(row, await self._roles(tx, row), now), changes)
            await self._audit(tx, audit, account_id, now, AuditAction.API_KEY_TOGGLED, ("api_key", key_id), status=row["status"])
        await self.edge.deliver(changes)
        return row

    async def delete(self, account_id: UUID, key_id: UUID, *, audit: AuditContext, only_own: UUID | None = None) -> None:
        now = self.clock()
        changes = Changes()
        async with self.store.transaction() as tx:
            row = await self._key_to_write(tx, account_id, key_id, only_own)
            row = await tx.mark_deleted(key_id, now)
            await self._emit_key(tx, self._state(row, await self._roles(tx, row), now, deleted=True), changes)
            await self._audit(tx, audit, account_id, now, AuditAction.API_KEY_DELETED, ("api_key", key_id), name=row["name"])
        await self.edge.deliver(changes)

    async def rotate(
        self,
        account_id: UUID,
        key_id: UUID,
        grace_seconds: int,
        *,
        audit: AuditContext,
        only_own: UUID | None = None,
    ) -> tuple[Row, str]:
        """The new key (same name, same creator); the old one expires after the grace. Whoever
        rotates (the audit names them), the new key acts as the old one's creator: rotating replaces
        the secret, it neither gives the key the rotating owner's role nor takes it from its developer."""
        now = self.clock()
        changes = Changes()
        async with self.store.transaction() as tx:
            # under the row lock: of two rotations at once, the second sees the first's grace
            old = await self._key_to_write(tx, account_id, key_id, only_own)
            domain.check_not_rotated(old["delete_at"])
            roles = await self._roles(tx, old)
            if grace_seconds == 0:
                old = await tx.mark_deleted(key_id, now)
                await self._emit_key(tx, self._state(old, roles, now, deleted=True), changes)
            else:
                expires_at = domain.rotation_expiry(old["expires_at"], now, grace_seconds)
                old = await tx.set_expiry(key_id, expires_at, expires_at)
                await self._emit_key(tx, self._state(old, roles, now), changes)
            # the new key keeps the old one's rules, and continues its lineage (what its limits have
            # counted so far, and what the old key spends in its grace): rotating must not widen
            # what the secret may do
            rules = KeyRules.model_validate(old["rules"])
            creator = old["created_by"] or account_id  # a key from before members: the registering user's
            row, secret = await self._insert_new_key(
                tx, account_id, creator, old["name"], None, now, changes, rules, lineage_id=old["lineage_id"]
            )
            await self._audit(
                tx,
                audit,
                account_id,
                now,
                AuditAction.API_KEY_ROTATED,
                ("api_key", key_id),
                new_key_id=str(row["id"]),
                grace_seconds=grace_seconds,
            )
        await self.edge.deliver(changes)
        return row, secret

    async def sweep_rotated(self) -> None:
        """Delete for good the rotated keys whose grace period is over (the relay then sends)."""
        now = self.clock()
        changes = Changes()
        async with self.store.transaction() as tx:
            for due in await tx.due_for_deletion(now):
                row = await tx.mark_deleted(due["id"], now)
                await self._emit_key(tx, self._state(row, await self._roles(tx, row), now, deleted=True), changes)

    async def note_calls(self, used: dict[UUID, datetime]) -> None:
        async with self.store.transaction() as tx:
            await tx.touch_last_used(used)

    # ---- members (v2) ---------------------------------------------------------------------------
    async def list_members(self, account_id: UUID) -> list[Row]:
        async with self.store.transaction() as tx:
            return await tx.members_of(account_id)

    async def add_member(self, account_id: UUID, email: str, name: str, password: str, role: Role, *, audit: AuditContext) -> Row:
        password_hash = await self._argon2(self.hasher.hash, password)
        now = self.clock()
        changes = Changes()
        async with self.store.transaction() as tx:
            user = await tx.insert_user(
                user_id=uuid4(),
                account_id=account_id,
                email=domain.normalize_email(email),
                password_hash=password_hash,
                name=name,
                role=role.value,
                created_at=now,
            )
            if user is None:
                raise domain.MemberEmailTaken()
            await self._emit_user(tx, user, now, changes)
            await self._audit(
                tx, audit, account_id, now, AuditAction.MEMBER_ADDED, ("user", user["id"]), email=user["email"], role=role.value
            )
        await self.edge.deliver(changes)
        return user

    async def _member(self, tx: KeysTx, account_id: UUID, member_id: UUID) -> tuple[Row, list[Row]]:
        """The member (another account's or a removed one: NotFound) and the account's live users, locked."""
        members = await tx.members_for_update(account_id)
        member = next((m for m in members if m["id"] == member_id), None)
        if member is None:
            raise NotFound("member")
        return member, members

    async def change_member_role(self, account_id: UUID, member_id: UUID, role: Role, *, audit: AuditContext) -> Row:
        """Effective at once on the member's sessions (users.v1) and keys (keys.v1 `roles`)."""
        now = self.clock()
        changes = Changes()
        async with self.store.transaction() as tx:
            member, members = await self._member(tx, account_id, member_id)
            domain.check_keeps_an_owner(member, [Role(m["role"]) for m in members], role)
            if member["role"] == role.value:
                return member
            user = await tx.set_user_role(member_id, role.value)
            assert user is not None
            await self._emit_user(tx, user, now, changes)
            await self._audit(
                tx,
                audit,
                account_id,
                now,
                AuditAction.MEMBER_ROLE_CHANGED,
                ("user", member_id),
                role=role.value,
                previous_role=member["role"],
            )
            restamped = await tx.restamp_keys_created_by(account_id, member_id)
            for key in restamped:
                await self._emit_key(tx, self._state(key, [role], now), changes)
            changes.user_changes.append(UserChange(changes.users[-1], [key["id"] for key in restamped]))
        await self.edge.deliver(changes)
        return user

    async def remove_member(self, account_id: UUID, member_id: UUID, *, audit: AuditContext) -> None:
        """The member's sessions end and keys die at once (users.v1 `removed`; its keys deleted)."""
        now = self.clock()
        changes = Changes()
        async with self.store.transaction() as tx:
            member, members = await self._member(tx, account_id, member_id)
            domain.check_keeps_an_owner(member, [Role(m["role"]) for m in members], None)
            user = await tx.remove_user(member_id, now)
            assert user is not None
            await self._emit_user(tx, user, now, changes)
            # its keys are deleted below, each revoked everywhere on its own: no lease to drop here
            changes.user_changes.append(UserChange(changes.users[-1], []))
            await self._audit(tx, audit, account_id, now, AuditAction.MEMBER_REMOVED, ("user", member_id), email=user["email"])
            for live in await tx.live_keys_created_by(account_id, member_id):
                key = await tx.mark_deleted(live["id"], now)
                await self._emit_key(tx, self._state(key, [Role(member["role"])], now, deleted=True), changes)
        await self.edge.deliver(changes)

    # ---- service tokens (operator) -----------------------------------------------------------
    async def create_service_token(self, name: str, scopes: list[ServiceScope], *, audit: AuditContext) -> tuple[Row, str]:
        async with self.store.transaction() as tx:
            row, token, state = await service_tokens.create(tx, name, scopes, self.clock(), audit)
        await self.edge.deliver(Changes(service_tokens=[state]))
        return row, token

    async def list_service_tokens(self) -> list[Row]:
        async with self.store.transaction() as tx:
            return await tx.list_service_tokens()

    async def revoke_service_token(self, token_id: UUID, *, audit: AuditContext) -> None:
        """Answers after the revocation is in Kafka and in force in this process."""
        async with self.store.transaction() as tx:
            state = await service_tokens.revoke(tx, token_id, self.clock(), audit)
            if state is None:
                raise NotFound("service token")
        await self.edge.deliver(Changes(service_tokens=[state]))

    async def write_service_token_uses(self) -> None:
        """The uses this process's edge noted, in one UPDATE (kept for the next try if it fails)."""
        used = self.edge.drain_service_token_uses()
        if not used:
            return
        try:
            async with self.store.transaction() as tx:
                await tx.touch_service_tokens(used)
        except Exception:
            for token_id, at in used.items():
                self.edge.note_service_token_use(token_id, at)
            raise

    # ---- the audit log (v2) ---------------------------------------------------------------------
    async def record_audit(self, event: AuditRecorded) -> None:
        """One audit.v1 event into the log; a redelivered one (same id) changes nothing."""
        async with self.store.transaction() as tx:
            await tx.insert_audit_entry(event)

    async def audit_log(
        self,
        account_id: UUID,
        *,
        start: datetime | None = None,
        end: datetime | None = None,
        action: AuditAction | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> AuditLog:
        """The account's entries in [start, end), newest first, a page of `limit` (keyset cursor)."""
        domain.check_audit_range(start, end)
        before = domain.decode_audit_cursor(cursor) if cursor else None
        async with self.store.transaction() as tx:
            rows = await tx.audit_entries(
                account_id, start=start, end=end, action=action.value if action else None, before=before, limit=limit + 1
            )
        page = rows[:limit]
        more = len(rows) > limit
        return AuditLog(
            items=[domain.audit_item(r) for r in page],
            next_cursor=keyset_cursor.encode(page[-1]["time"], page[-1]["id"]) if more else None,
        )
