"""The Edge: one per process, shared by every mounted service's routes.

Routes declare what they need with `Depends(edge.requires(permission, ...))` and receive the
calling `Principal`. The edge answers 401/403 itself with the contract's codes.
"""

import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import UUID

from fastapi import Request

from contracts.common import Permission, Resource, Role
from contracts.errors import ErrorCode
from contracts.events import AccountState, KeyState, PlanChanged, QuotaState, RateLimit
from contracts.topics import ACCOUNTS, BILLING, KEYS, QUOTA
from services.edge import sessions
from services.edge.calls import OVERLOADED, Call, CallRecorder, client_ip, parse_networks
from services.edge.errors import RESPONSE_DONE, RESPONSE_HEADERS, ApiError
from services.edge.principal import Principal
from services.edge.projection_reader import TopicFollower
from services.edge.projections import AccountProjection, KeyProjection, PlanLimits
from services.edge.quota_gate import QuotaProjection
from services.edge.rate_limit import Limits
from services.edge.rate_store import make_store
from services.runtime.settings import Settings

API_KEY_PREFIX = "sk-"
MAX_CACHED_SUBJECTS = 100_000
OVERLOADED_RETRY_AFTER_S = 1


def hash_secret(secret: str) -> str:
    """The only form in which an API key is stored, logged or published."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs a setattr call per field
class _CallDone:
    """The request's part of a calls.v1 event; called with (status, seconds, error code of a
    refusal) once the response has been sent (RequestIdMiddleware), it hands the whole call to
    the recorder: an admitted call on the place reserved for it, a refused one to its own lane,
    anything else (503 `overloaded`) not at all."""

    recorder: CallRecorder
    at: datetime
    account_id: UUID
    api_key_id: UUID
    method: str
    path: str  # the route template, not the raw URL
    ip: str
    user_agent: str
    reserved: bool = False  # admitted: a place in the admitted lane is held for this call

    def __call__(self, status: int, seconds: float, error_code: str | None = None) -> None:
        if not self.reserved and error_code is None:
            return
        call = Call(
            self.at,
            self.account_id,
            self.api_key_id,
            self.method,
            self.path,
            status,
            self.ip,
            self.user_agent,
            round(seconds * 1000, 3),
            error_code,
        )
        if self.reserved:
            self.recorder.record(call)
        else:
            self.recorder.refuse(call)


def _unauthorized(code: ErrorCode, message: str) -> ApiError:
    return ApiError(401, code, message, headers={"WWW-Authenticate": "Bearer"})


def _insufficient_quota(resource: Resource) -> ApiError:
    return ApiError(
        403,
        ErrorCode.INSUFFICIENT_QUOTA,
        f"The {resource.value} quota of this period is exhausted; upgrade the plan or buy a quota package.",
        details={"resource": resource.value},
    )


def _overloaded() -> ApiError:
    OVERLOADED.inc()
    return ApiError(
        503,
        ErrorCode.OVERLOADED,
        "The edge cannot meter more calls right now; retry shortly.",
        headers={"Retry-After": str(OVERLOADED_RETRY_AFTER_S)},
    )


class Edge:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.accounts = AccountProjection()
        self.keys = KeyProjection()
        self.quota = QuotaProjection(settings.tz)
        self.plans = PlanLimits()
        self.limiter = make_store(settings.redis_url)
        self.calls = CallRecorder(settings)
        self._limits: dict[RateLimit, Limits] = {}
        # key id -> (its account, its rate-limit subjects): no string formatting per call
        self._subjects: dict[UUID, tuple[UUID, tuple[str, str]]] = {}
        # key id -> (key state, account state, principal built from them)
        self._principals: dict[UUID, tuple[KeyState, AccountState | None, Principal]] = {}
        self._trusted = parse_networks(settings.trusted_proxies)
        self._secret = settings.session_secret.get_secret_value().encode()
        self._followers = [
            TopicFollower(settings.kafka_bootstrap_servers, settings.topic(ACCOUNTS.name), self._apply_account),
            TopicFollower(settings.kafka_bootstrap_servers, settings.topic(KEYS.name), self._apply_key),
            TopicFollower(settings.kafka_bootstrap_servers, settings.topic(QUOTA.name), self._apply_quota),
            TopicFollower(settings.kafka_bootstrap_servers, settings.topic(BILLING.name), self._apply_billing),
        ]

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        for follower in self._followers:
            await follower.start()
        await self.calls.start()

    async def stop(self) -> None:
        await self.calls.stop()
        for follower in self._followers:
            await follower.stop()
        await self.limiter.close()

    def is_ready(self) -> bool:
        return all(f.caught_up.is_set() for f in self._followers)

    def _apply_account(self, _key: bytes | None, value: bytes | None) -> None:
        if value is not None:
            self.accounts.apply(AccountState.model_validate(json.loads(value)))

    def _apply_key(self, key: bytes | None, value: bytes | None) -> None:
        if value is None:
            if key is not None:
                self.keys.remove(UUID(key.decode()))
            return
        self.keys.apply(KeyState.model_validate(json.loads(value)))

    def _apply_billing(self, _key: bytes | None, value: bytes | None) -> None:
        if value is None:
            return
        body = json.loads(value)
        if isinstance(body, dict) and body.get("type") == "plan_changed":  # the rest is not the edge's business
            self.plans.apply(PlanChanged.model_validate(body))

    def _apply_quota(self, _key: bytes | None, value: bytes | None) -> None:
        if value is not None:
            self.quota.apply(QuotaState.model_validate(json.loads(value)))

    # ---- session tokens ------------------------------------------------------------------
    def issue_session(self, account_id: UUID, session_id: str, now: datetime) -> str:
        expires = int(now.timestamp()) + self.settings.session_ttl_seconds
        return sessions.issue(self._secret, sessions.SessionClaims(account_id, session_id, expires))

    # ---- the request path ----------------------------------------------------------------
    def requires(
        self,
        permission: Permission | None = None,
        *,
        consumes: Resource | None = None,
        console_only: bool = False,
    ) -> Callable[[Request], Awaitable[Principal]]:
        """A FastAPI dependency: authenticate, authorise, and return the caller."""

        async def dependency(request: Request) -> Principal:
            now = datetime.now(UTC)
            principal = self.authenticate(request, now)
            done = None
            if principal.api_key_id is not None:
                done = self._record_call(request, principal.account_id, principal.api_key_id, now)
                await self._rate_limit(request, principal)
            if console_only and not principal.is_console:
                raise ApiError(403, ErrorCode.CONSOLE_SESSION_REQUIRED, "This call needs a console session, not an API key.")
            if permission is not None and not principal.can(permission):
                raise ApiError(403, ErrorCode.PERMISSION_DENIED, f"Your roles lack the permission {permission.value}.")
            if done is not None:
                # Admission: the call's event gets its place before the handler runs (or 503).
                if not self.calls.reserve():
                    raise _overloaded()
                done.reserved = True
            self.check_quota(principal, consumes, now)
            request.state.principal = principal
            return principal

        return dependency

    async def _rate_limit(self, request: Request, principal: Principal) -> None:
        """429 when the account's or the key's bucket or window is exhausted; X-RateLimit-* on
        every API-key response (RequestIdMiddleware adds them, to errors as well)."""
        assert principal.api_key_id is not None
        rate = self.plans.rate_limit(principal.account_id)
        limits = self._limits.get(rate)
        if limits is None:
            limits = self._limits[rate] = Limits.of(rate)
        subjects = self._subjects.get(principal.api_key_id)
        if subjects is None or subjects[0] != principal.account_id:
            if len(self._subjects) >= MAX_CACHED_SUBJECTS:
                self._subjects.clear()
            subjects = self._subjects[principal.api_key_id] = (
                principal.account_id,
                (f"a:{principal.account_id}", f"k:{principal.api_key_id}"),
            )
        decision = await self.limiter.hit(subjects[1], limits, time.time())
        setattr(request.state, RESPONSE_HEADERS, decision.headers())
        if not decision.allowed:
            raise ApiError(429, ErrorCode.RATE_LIMITED, f"Too many requests; retry in {decision.retry_after_s} s.")

    def _record_call(self, request: Request, account_id: UUID, api_key_id: UUID, now: datetime) -> _CallDone:
        """Arrange a calls.v1 event for when the response has been sent (status and latency known)."""
        state = request.scope.setdefault("state", {})  # RequestIdMiddleware's, which calls the done callback
        previous = state.get(RESPONSE_DONE)
        if isinstance(previous, _CallDone) and previous.reserved:  # a second edge dependency of one route
            previous.reserved = False
            self.calls.release()
        path = getattr(request.scope.get("route"), "path", None) or request.url.path  # the URL only if no route
        client = request.scope.get("client")
        headers = request.headers
        done = _CallDone(
            self.calls,
            now,
            account_id,
            api_key_id,
            request.method,
            str(path),
            client_ip(client[0] if client else "", headers.get("x-forwarded-for", ""), self._trusted),
            headers.get("user-agent", ""),
        )
        state[RESPONSE_DONE] = done
        return done

    def check_quota(self, principal: Principal, consumes: Resource | None, now: datetime) -> None:
        """403 insufficient_quota when a resource this call consumes is exhausted this period.
        Every API-key call consumes api_calls (and is admitted, i.e. counted, only if every check
        passed); a route may name one more resource."""
        if consumes is not None and self.quota.is_blocked(principal.account_id, consumes, now):
            raise _insufficient_quota(consumes)
        if not principal.is_console and not self.quota.admit_call(principal.account_id, now):
            raise _insufficient_quota(Resource.API_CALLS)

    def authenticate(self, request: Request, now: datetime) -> Principal:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _unauthorized(ErrorCode.MISSING_CREDENTIALS, "Send Authorization: Bearer <API key or session token>.")
        if token.startswith(API_KEY_PREFIX):
            return self._authenticate_key(token, now, request)
        return self._authenticate_session(token, now)

    def _authenticate_session(self, token: str, now: datetime) -> Principal:
        try:
            claims = sessions.verify(self._secret, token, now)
        except sessions.InvalidSession:
            raise _unauthorized(ErrorCode.INVALID_SESSION, "The console session is invalid or has expired.") from None
        account = self.accounts.get(claims.account_id)
        if account is None:
            raise _unauthorized(ErrorCode.INVALID_SESSION, "The console session is invalid or has expired.")
        return Principal(account_id=account.account_id, roles=frozenset(Role(r) for r in account.roles))

    def _authenticate_key(self, secret: str, now: datetime, request: Request) -> Principal:
        # A dict lookup by SHA-256: timing does not depend on how much of a guess is right.
        digest = hash_secret(secret)
        state = self.keys.get(digest)
        if state is None:
            deleted = self.keys.deleted(digest)
            if deleted is not None:  # the account's own (deleted) key: its refusal is logged
                self._record_call(request, deleted.account_id, deleted.key_id, now)
            raise _unauthorized(ErrorCode.INVALID_API_KEY, "The API key is not valid.")
        if state.status != "enabled":
            self._record_call(request, state.account_id, state.key_id, now)
            raise _unauthorized(ErrorCode.API_KEY_DISABLED, "The API key is disabled.")
        if state.expires_at is not None and now >= state.expires_at:
            self._record_call(request, state.account_id, state.key_id, now)
            raise _unauthorized(ErrorCode.API_KEY_EXPIRED, "The API key has expired.")
        account = self.accounts.get(state.account_id)
        # The principal of a key is a function of the two (immutable) states it was built from:
        # reuse it while both are the very objects the projections still hold.
        cached = self._principals.get(state.key_id)
        if cached is not None and cached[0] is state and cached[1] is account:
            return cached[2]
        roles = account.roles if account is not None else state.roles
        principal = Principal(account_id=state.account_id, roles=frozenset(Role(r) for r in roles), api_key_id=state.key_id)
        if len(self._principals) >= MAX_CACHED_SUBJECTS:
            self._principals.clear()
        self._principals[state.key_id] = (state, account, principal)
        return principal
