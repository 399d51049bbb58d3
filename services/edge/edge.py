"""The Edge: one per process, shared by every mounted service's routes.

Routes declare what they need with `Depends(edge.requires(permission, ...))` and receive the
calling `Principal`. The edge answers 401/403 itself with the contract's codes.
"""

import asyncio
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from typing import NoReturn
from uuid import UUID

from fastapi import Request
from starlette.routing import BaseRoute
from starlette.types import Scope

from contracts.audit import AuditContext
from contracts.common import KeyStatus, Permission, Resource, Role, ServiceScope
from contracts.credentials import API_KEY_PREFIX, SERVICE_TOKEN_PREFIX, hash_secret
from contracts.errors import ErrorCode
from contracts.events import (
    QUOTA_RECORDS,
    AccountState,
    KeyState,
    PackagePurchased,
    PlanChanged,
    QuotaState,
    ServiceTokenState,
    SessionRevoked,
    UserState,
)
from contracts.key_limits import KeyLimit, KeyLimitUsage
from contracts.quota_api import InsufficientQuotaDetails, counts_as_api_call, quota_links
from contracts.rate_limit import RateLimit
from contracts.topics import ACCOUNTS, BILLING, KEYS, QUOTA, SERVICE_TOKENS, SESSIONS, STATE_COMPLETE, USERS
from services.edge import sessions
from services.edge.admissions import ADMISSION_STORE_ERRORS
from services.edge.billing_totals import BillingTotals
from services.edge.calls import OVERLOADED, Call, CallRecorder, client_ip, forwarded_for, parse_networks
from services.edge.context import CALL_CONTEXT, CallContext, context_of
from services.edge.errors import ApiError
from services.edge.key_quota import KeyQuotaProjection, KeyStanding
from services.edge.key_revocations import REVOCATION_STORE_ERRORS, KeyCheck, KeyRevoked
from services.edge.key_rules import KeyGate, narrower
from services.edge.openapi_security import ADMIN_TOKEN, API_KEY, CONSOLE_SESSION, SERVICE_TOKEN, accepts
from services.edge.principal import Principal
from services.edge.projections import AccountProjection, KeyProjection, PlanLimits
from services.edge.quota_gate import CallsView, QuotaProjection
from services.edge.rate_limit import Decision, Limits
from services.edge.rate_store import MemoryStore, RateLimitStore, RedisStore
from services.edge.service_tokens import ServicePrincipal, ServiceTokenProjection
from services.edge.session_revocations import RevokedSessions, UserSessions
from services.edge.state_complete import StateCompletion, owners_of
from services.edge.unavailable import RETRY_AFTER_S
from services.edge.user_revocations import CREDENTIAL_CHECK_ERRORS
from services.edge.verdict import ServiceCall, Verdict
from services.runtime.platform.logs import Throttled
from services.runtime.platform.settings import Settings
from services.runtime.platform.topic_follower import TopicFollower

MAX_CACHED_SUBJECTS = 100_000
MAX_GUARDED_PATHS = 10_000  # paths carry ids: bounded, forgotten all at once when full
OVERLOADED_RETRY_AFTER_S = 1

log = logging.getLogger(__name__)


def _unauthorized(code: ErrorCode, message: str) -> ApiError:
    return ApiError(401, code, message, headers={"WWW-Authenticate": "Bearer"})


def _token(request: Request) -> str:
    """The request's Bearer token; "" when it has none."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _bearer(request: Request) -> str:
    token = _token(request)
    if not token:
        raise _unauthorized(ErrorCode.MISSING_CREDENTIALS, "Send Authorization: Bearer <API key or session token>.")
    return token


def insufficient_quota(console_url: str, resource: Resource, used: int, total: int, period_end: datetime) -> ApiError:
    """The one 403 insufficient_quota: which resource, used/total, the period's end, the links."""
    details = InsufficientQuotaDetails(
        resource=resource, used=used, total=total, period_end=period_end, links=quota_links(console_url, resource)
    )
    return ApiError(
        403,
        ErrorCode.INSUFFICIENT_QUOTA,
        f"The {resource.value} quota of this period is exhausted ({used} of {total} used); "
        "upgrade the plan or buy a quota package.",
        details=details.body(),
    )


def _refusal(principal: Principal, permission: Permission | None, console_only: bool) -> ApiError | None:
    """The 403 a caller gets for who it is, before anything is counted; None: it may go on."""
    if console_only and not principal.is_console:
        return ApiError(403, ErrorCode.CONSOLE_SESSION_REQUIRED, "This call needs a console session, not an API key.")
    if permission is not None and not principal.can(permission):
        return ApiError(403, ErrorCode.PERMISSION_DENIED, f"Your roles lack the permission {permission.value}.")
    return None


def _not_caught_up() -> ApiError:
    return ApiError(
        503,
        ErrorCode.SERVICE_UNAVAILABLE,
        "This server is still reading the credentials' state (keys, users, sessions); retry shortly.",
        headers={"Retry-After": RETRY_AFTER_S},
    )


def acting_roles(
    user: UserState | None, user_id: UUID, account_id: UUID, account_roles: Iterable[Role] | None
) -> frozenset[Role]:
    """The roles a session or an API key acts with: its user's current role (users.v1).

    Until this edge knows that state, only the account's registering user (user id = account id)
    acts with the account's roles (accounts.v1): accounts from before members never published its
    users.v1 state, and the operator's role change keeps the two equal. Any other user acts with
    none (fail closed): a member added while Kafka was away logs in (login reads Postgres) before
    its users.v1 state reaches the edges, and must not act as the owner meanwhile."""
    if user is not None:
        return frozenset({user.role})
    if user_id == account_id and account_roles is not None:
        return frozenset(Role(r) for r in account_roles)
    return frozenset()


def _revoked_refusal(revoked: KeyRevoked) -> ApiError:
    """The answer for a key the shared store says was revoked after the state this process
    judged it by (`Edge.revoke_everywhere`): what that state will say once it arrives."""
    if revoked.narrowed:  # judged by rules (or its user's role) older than the key's: not at all
        what = "its user's role" if revoked.how == "role" else "rules"
        return ApiError(
            503,
            ErrorCode.SERVICE_UNAVAILABLE,
            f"The API key's {what} changed a moment ago and this server is still reading it; retry shortly.",
            headers={"Retry-After": "1"},
        )
    if revoked.deleted:
        return _unauthorized(ErrorCode.INVALID_API_KEY, "The API key is not valid.")
    return _unauthorized(ErrorCode.API_KEY_DISABLED, "The API key is disabled.")


def _key_check(principal: Principal) -> KeyCheck:
    """What the shared store is asked about an API key's call: whether the key was revoked after
    the state this process judged it by, or the user it acts as (its creator; a key from before
    members: the registering user, whose id is the account id) removed or given another role."""
    assert principal.api_key_id is not None
    user_id = principal.user_id or principal.account_id
    return KeyCheck(principal.api_key_id, principal.key_version, user_id, principal.user_version)


def _session_over(how: str) -> ApiError:
    """The answer for a console session the shared store says is over, or judged by an older role."""
    if how == "role":  # judged by a role older than the user's: not at all until this replica has it
        return ApiError(
            503,
            ErrorCode.SERVICE_UNAVAILABLE,
            "Your role changed a moment ago and this server is still reading it; retry shortly.",
            headers={"Retry-After": "1"},
        )
    return _unauthorized(ErrorCode.INVALID_SESSION, "The console session is invalid or has expired.")


def _rate_limited(decision: Decision) -> ApiError:
    return ApiError(429, ErrorCode.RATE_LIMITED, f"Too many requests; retry in {decision.retry_after_s} s.")


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
        self.service_tokens = ServiceTokenProjection()
        self.plans = PlanLimits()
        # Totals from billing.v1 (plan + packages), used/reserved from quota.v1: a payment is in
        # force here as soon as its billing.v1 event is applied (billing_totals.py).
        self.totals = BillingTotals(self.plans)
        self.quota = QuotaProjection(settings.tz, self.totals)
        # (v4) each key's standing against its own limits (quota.v1), the limits from keys.v1
        self.key_quota = KeyQuotaProjection(settings.tz)
        self.users = UserSessions()
        self.revoked_sessions = RevokedSessions(settings.session_ttl_seconds)
        # REDIS_URL: the replicas share the rate limits and the api_calls admissions (one script
        # per call); None: this process limits and counts alone.
        self.shared = RedisStore(settings.redis_url) if settings.redis_url else None
        self.limiter: RateLimitStore = self.shared if self.shared is not None else MemoryStore()
        self._admission_log = Throttled(log)
        # the ends' writes and checks (strict ends) warn apart: one throttle would hide the admissions' outage
        self._ends_log = Throttled(log)
        self.calls = CallRecorder(settings)
        # (plan's rate limit, key's own or None) -> the limits of the call's subjects (account, key)
        self._limits: dict[tuple[RateLimit, RateLimit | None], tuple[Limits, Limits]] = {}
        # key id -> (its account, its rate-limit subjects): no string formatting per call
        self._subjects: dict[UUID, tuple[UUID, tuple[str, str]]] = {}
        # key id -> (key state, account state, principal built from them)
        self._principals: dict[UUID, tuple[KeyState, AccountState | UserState | None, Principal]] = {}
        # (method, path) -> the route `requires` guards there, learnt from the calls it judged
        self._guarded: dict[tuple[str, str], BaseRoute] = {}
        self._trusted = parse_networks(settings.trusted_proxies)
        self._secret = settings.session_secret.get_secret_value().encode()
        self._rebuilding = 0  # owners' checks of their topics in progress (rebuilding())
        previous = settings.session_secret_previous
        self._also_accepted = (previous.get_secret_value().encode(),) if previous else ()
        projected = {
            ACCOUNTS: self._apply_account,
            KEYS: self._apply_key,
            QUOTA: self._apply_quota,
            BILLING: self._apply_billing,
            SERVICE_TOKENS: self._apply_service_token,
            USERS: self._apply_user,
            SESSIONS: self._apply_session,
        }
        # ready only once the owners of these topics said they are whole (state_complete.py)
        self.completion = StateCompletion(owners_of(t.name for t in projected))
        self._settling: asyncio.Task[None] | None = None
        self._follower = TopicFollower(
            settings.kafka_bootstrap_servers,
            {settings.topic(t.name): apply for t, apply in {**projected, STATE_COMPLETE: self.completion.apply}.items()},
        )

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        await self._follower.start()
        self._settling = asyncio.create_task(self.completion.settle(self._follower.reach_current_end), name="state-complete")
        await self.calls.start()

    async def stop(self) -> None:
        await self.calls.stop()
        if self._settling is not None:
            self._settling.cancel()
            await asyncio.gather(self._settling, return_exceptions=True)
        await self._follower.stop()
        await self.limiter.close()

    def is_ready(self) -> bool:
        """Projections read to the end offsets seen at start, no owner's check in progress here,
        and every owner's state-complete.v1 record read (services/edge/state_complete.py)."""
        return self._follower.caught_up.is_set() and not self._rebuilding and self.completion.complete

    @asynccontextmanager
    async def rebuilding(self) -> AsyncIterator[None]:
        """Not ready (/readyz and every credential 503) while an owner checks whether Kafka lost
        its states and republishes them (services/runtime/platform/state_guard.py), then until
        the projections have read their topics to the end offsets as of the check's end: an
        edge never judges keys by a projection an owner is still rebuilding."""
        self._rebuilding += 1
        try:
            yield
            await self._follower.reach_current_end()
        finally:
            self._rebuilding -= 1

    def assume_caught_up(self) -> None:
        """An edge fed by hand, not from Kafka (unit tests, benchmarks): what it holds is all there is."""
        self._follower.caught_up.set()
        self.completion.complete = True

    def _check_ready(self) -> None:
        """Credentials are judged by the projections alone. Until they have read their topics to
        the end offsets seen at start (a worker just started or replaced), a removed member, a
        deleted key, a revoked token or a logged-out session could still pass: 503, as /readyz.
        So until every owner has said its topics are whole: a key not yet republished would be a 401."""
        if not self.is_ready():
            raise _not_caught_up()

    def _apply_account(self, _key: bytes | None, value: bytes | None) -> None:
        if value is not None:
            self.accounts.apply(AccountState.model_validate(json.loads(value)))

    def _apply_key(self, key: bytes | None, value: bytes | None) -> None:
        if value is None:
            if key is not None:
                self.keys.remove(UUID(key.decode()))
            return
        self.keys.apply(KeyState.model_validate(json.loads(value)))

    def _apply_service_token(self, key: bytes | None, value: bytes | None) -> None:
        if value is None:
            if key is not None:
                self.service_tokens.remove(UUID(key.decode()))
            return
        self.service_tokens.apply(ServiceTokenState.model_validate(json.loads(value)))

    def _apply_billing(self, _key: bytes | None, value: bytes | None) -> None:
        if value is None:
            return
        body = json.loads(value)
        kind = body.get("type") if isinstance(body, dict) else None
        if kind == "plan_changed":
            self.apply_billing(PlanChanged.model_validate(body))
        elif kind == "package_purchased":  # the rest (user types) is not the edge's business
            self.apply_billing(PackagePurchased.model_validate(body))

    def apply_billing(self, event: PlanChanged | PackagePurchased) -> None:
        """A plan's rate limits and quotas, or a package: in force for this process's next call
        (billing applies its own events here before it answers, services/billing/delivery.py)."""
        if isinstance(event, PlanChanged):
            self.plans.apply(event)
        else:
            self.totals.apply_package(event)

    def _apply_quota(self, _key: bytes | None, value: bytes | None) -> None:
        if value is None:
            return
        record = QUOTA_RECORDS.validate_python(json.loads(value))
        if isinstance(record, QuotaState):
            self.quota.apply(record)
        else:  # (v4) a key's standing against one of its limits
            self.key_quota.apply(record)

    def key_limits(self, key_id: UUID) -> list[KeyLimit]:
        """The key's own limits as keys.v1 has them now (a PATCH is in force when applied here)."""
        state = self.keys.by_id(key_id)
        return [] if state is None else state.limits

    def key_lineage(self, key_id: UUID) -> UUID:
        """The id the key's limits are counted and judged under (keys.v1 KeyState.lineage): a key
        made by rotation carries on its predecessor's spending, its own admissions included."""
        state = self.keys.by_id(key_id)
        return key_id if state is None else state.lineage

    def key_standings(self, key_id: UUID, now: datetime) -> list[KeyStanding]:
        """(v4) The key's standing against each of its own limits in the window that holds now,
        where its lineage stands (this process's projections: keys.v1's limits, quota.v1's counts)."""
        lineage_id = self.key_lineage(key_id)
        return [self.key_quota.standing(lineage_id, limit, now) for limit in self.key_limits(key_id)]

    def key_usage(self, key_id: UUID, now: datetime) -> list[KeyLimitUsage]:
        """What key objects show: `key_standings` as `usage`."""
        return [standing.usage() for standing in self.key_standings(key_id, now)]

    def _apply_user(self, _key: bytes | None, value: bytes | None) -> None:
        if value is not None:
            self.users.apply(UserState.model_validate(json.loads(value)))

    def _apply_session(self, _key: bytes | None, value: bytes | None) -> None:
        if value is not None:
            self.revoked_sessions.apply(SessionRevoked.model_validate(json.loads(value)), datetime.now(UTC))

    # ---- session tokens ------------------------------------------------------------------
    def issue_session(self, account_id: UUID, session_id: str, now: datetime, user_id: UUID | None = None) -> str:
        user = user_id or account_id  # the registering user's id is the account id
        expires = int(now.timestamp()) + self.settings.session_ttl_seconds
        # `now` is the issue time as the login took it, with the password check (keys' login: never
        # before the sessions_not_before it checked against), not moved up to a newer one this
        # edge learnt since: that would keep alive a session the old password opened just before
        # a change.
        return sessions.issue(self._secret, sessions.SessionClaims(account_id, session_id, expires, now.timestamp(), user))

    # ---- the request path ----------------------------------------------------------------
    def requires(
        self,
        permission: Permission | None = None,
        *,
        consumes: Resource | None = None,
        console_only: bool = False,
    ) -> Callable[[Request], Awaitable[Principal]]:
        """A FastAPI dependency: authenticate, authorise, and return the caller. The screen
        (`screen`) answers its key's 401 and the limiter's copied 429 before routing; a check that
        must come before those goes there as well."""

        async def dependency(request: Request) -> Principal:
            now = datetime.now(UTC)
            scope = request.scope
            self._remember_route(scope)
            context = context_of(scope)
            # the key the screen (screen.py) already authenticated, or this request's credentials
            principal = context.principal or self.authenticate(request, now)
            if principal.api_key_id is None:  # a console session: neither rate-limited nor counted
                await self._check_session_everywhere(principal)
                refusal = _refusal(principal, permission, console_only)
                if refusal is not None:
                    raise refusal
                self._check_consumes(principal.account_id, consumes, now)
            else:
                route = getattr(request.scope.get("route"), "path", None)
                ruled = self._rules_refusal(request, principal, now)
                if ruled is not None:
                    await self._refuse_by_rules(context, principal, ruled)
                counted = counts_as_api_call(request.method, str(route))
                await self._admit_key_call(request, context, principal, permission, consumes, counted, console_only, now)
            context.principal = principal
            return principal

        return accepts(dependency, CONSOLE_SESSION) if console_only else accepts(dependency, API_KEY, CONSOLE_SESSION)

    # ---- the screen: refusals before routing (screen.py) ----------------------------------------
    def _remember_route(self, scope: Scope) -> None:
        """This method and path reach a route guarded by `requires`: the screen may judge them."""
        key = (scope["method"], scope["path"])
        if key not in self._guarded and "route" in scope:  # (a bare test calls a dependency without routing)
            if len(self._guarded) >= MAX_GUARDED_PATHS:
                self._guarded.clear()
            self._guarded[key] = scope["route"]

    def screen(self, scope: Scope) -> ApiError | None:
        """The refusal of an API-key call to a guarded route that needs no route to run: its key's
        401, or while the rate limiter's copy refuses the key (no I/O), its 429 or (v4) the 403 of
        the key's own rules, which come first. The same checks in the same order as `requires`'
        dependency, which judges everything else (None) with the principal found here (a call the
        key's rules refuse gets its headers there from a peek, which takes nothing). Paths are
        screened once a call has reached their route."""
        route = self._guarded.get((scope["method"], scope["path"]))
        if route is None:
            return None
        request = Request(scope)
        token = _token(request)
        if not token.startswith(API_KEY_PREFIX):
            return None  # a session, a service token or no credentials: the dependency's answers
        scope["route"] = route  # what the router would have set: the call's path, the metrics' label
        now = datetime.now(UTC)
        try:
            principal = self._authenticate_key(token, now, request)
        except ApiError as unauthorized:
            return unauthorized
        limited = self._refused_by_copy(request, principal, now)
        if limited is None:
            context_of(scope).principal = principal
        return limited

    def _rules_refusal(
        self, request: Request, principal: Principal, now: datetime, model: str | None = None, *, judges_model: bool = False
    ) -> ApiError | None:
        """(v4) The 403 of the key's own restrictions (address, route, model: key_rules.py), logged
        as a refused call, judged before the rate limit and the quota gate; None: none broken. The
        caller then raises it with X-RateLimit-* (`_refuse_by_rules`: a peek, which takes nothing).
        The route is the template (Tollgate's routes) or the path the service passed (verify)."""
        gate = principal.gate
        if gate is None:
            return None
        scope = request.scope
        client = scope.get("client")
        ip = client_ip(client[0] if client else "", forwarded_for(request.headers), self._trusted)
        route = getattr(scope.get("route"), "path", None) or scope["path"]
        broken = gate.refusal(ip, scope["method"], str(route), model, judges_model=judges_model)
        if broken is None:
            return None
        assert principal.api_key_id is not None
        self._record_call(request, principal.account_id, principal.api_key_id, now)
        return ApiError(403, *broken)

    def _refused_by_copy(
        self, request: Request, principal: Principal, now: datetime, *, rules_judged: bool = False
    ) -> ApiError | None:
        """The refusal answered while the rate limiter's copy refuses this key's call (no I/O): the
        403 of the key's own rules (they come first) or the 429, logged as a refused call; None:
        the copy would let it through (the limiter itself decides).
        `rules_judged`: the caller found the key's rules unbroken already."""
        account_id, key_id = principal.account_id, principal.api_key_id
        assert key_id is not None
        decision = self.limiter.refused(self._subjects_of(key_id, account_id), self._limits_of(principal), time.time())
        if decision is None:
            return None
        context = context_of(request.scope)
        ruled = None if rules_judged else self._rules_refusal(request, principal, now)
        if ruled is not None:
            context.response_headers = decision.limit_headers()
            return ruled
        self._record_call(request, account_id, key_id, now)
        context.response_headers = decision.headers()
        return _rate_limited(decision)

    async def decide(self, call: ServiceCall, request_id: str) -> Verdict:
        """(v3) The decision for a call another service received (verify, authorize): the same
        checks, in the same order and with the same calls.v1 event, as a route that `requires`
        `call.permission` and consumes `call.resource`. An admitted call is metered (api_calls,
        calls.v1 naming the service); a refusal is logged like any refused call."""
        now = datetime.now(UTC)
        scope = call.scope()
        context = scope[CALL_CONTEXT] = CallContext(request_id, time.perf_counter())
        request = Request(scope)
        principal: Principal | None = None
        refusal: ApiError | None = None
        try:
            if not call.key:
                raise _unauthorized(ErrorCode.MISSING_CREDENTIALS, "The call carried no API key.")
            if not call.key.startswith(API_KEY_PREFIX):  # a session or a service token is no customer's key here
                raise _unauthorized(ErrorCode.INVALID_API_KEY, "The API key is not valid.")
            principal = self._authenticate_key(call.key, now, request)
            ruled = self._rules_refusal(request, principal, now, call.model, judges_model=True)
            if ruled is not None:
                await self._refuse_by_rules(context, principal, ruled)
            refusal = self._refused_by_copy(request, principal, now, rules_judged=True)
            if refusal is None:
                counted = counts_as_api_call(call.method, call.path, call.service)
                await self._admit_key_call(
                    request, context, principal, call.permission, call.resource, counted, False, now, call.cost
                )
        except ApiError as error:
            refusal = error
        if refusal is not None:
            context.error_code = refusal.code.value
        if context.call is not None:
            context.call.service = call.service
        context.finish(200 if refusal is None else refusal.status, time.perf_counter() - context.started)
        headers = {**(context.response_headers or {}), **(refusal.headers if refusal is not None else {})}
        return Verdict(principal, refusal, headers, self.plans.plan(principal.account_id) if principal else None)

    def judging(self, scope: Scope) -> asyncio.Future[None] | None:
        """For a call `screen` let through: the rate limiter's judgment in flight of an earlier
        call of the same key that its refusal copy let through. The call waits for it and is
        screened again, rather than asking Redis during that round trip as well."""
        principal = context_of(scope).principal
        if principal is None or principal.api_key_id is None:
            return None
        return self.limiter.judging(self._subjects_of(principal.api_key_id, principal.account_id))

    def requires_service(self, scope: ServiceScope) -> Callable[[Request], Awaitable[ServicePrincipal]]:
        """A FastAPI dependency of a **service** endpoint: only an `st-` token with `scope`.
        A customer's API key or console session is 403 permission_denied (the metered party
        never writes its own meter); an unknown or revoked token is 401 invalid_service_token."""

        async def dependency(request: Request) -> ServicePrincipal:
            now = datetime.now(UTC)
            token = _bearer(request)
            if not token.startswith(SERVICE_TOKEN_PREFIX):
                if not self._is_operator(token):
                    self.authenticate(request, now)  # a bad customer credential is still its own 401
                raise ApiError(403, ErrorCode.PERMISSION_DENIED, "Only a platform service token may call this endpoint.")
            return await self.authenticate_service(token, scope, now)

        return accepts(dependency, SERVICE_TOKEN)

    async def authenticate_service(self, token: str, scope: ServiceScope, now: datetime) -> ServicePrincipal:
        """The platform service holding `token`, if the token is live (else 401
        invalid_service_token) and has `scope` (else 403 permission_denied). Live: in this
        process's projection, and not revoked in the shared store (token_revocations.py: asked at
        most every 50 ms per token), which a replica cut off from Kafka still reads."""
        service = self._authenticate_service(token)
        if self.shared is not None and await self.shared.tokens.revoked(service.token_id):
            raise _unauthorized(ErrorCode.INVALID_SERVICE_TOKEN, "The service token is not valid.")
        if scope not in service.scopes:
            raise ApiError(403, ErrorCode.PERMISSION_DENIED, f"The service token lacks the scope {scope.value}.")
        self.service_tokens.note_use(service.token_id, now)
        return service

    def requires_operator(self) -> Callable[[Request], None]:
        """A FastAPI dependency of an **operator** endpoint: Bearer ADMIN_TOKEN, compared in
        constant time. While the setting is unset the routes do not exist (404)."""

        def dependency(request: Request) -> None:
            if self.settings.admin_token is None:
                raise ApiError(404, ErrorCode.NOT_FOUND, "The route does not exist.")
            given = _token(request)
            if not given:
                raise ApiError(401, ErrorCode.MISSING_CREDENTIALS, "Send Authorization: Bearer <admin token>.")
            if not self._is_operator(given):
                raise ApiError(403, ErrorCode.PERMISSION_DENIED, "The admin token is not valid.")

        return accepts(dependency, ADMIN_TOKEN)

    def audit_context(self, request: Request, principal: Principal | None) -> AuditContext:
        """Who makes this write and from where, for its audit entry (None: the operator). A key's
        user is its creator; a session or key from before members acts as the account's first user."""
        client = request.scope.get("client")
        ip = client_ip(client[0] if client else "", forwarded_for(request.headers), self._trusted)
        user_agent = request.headers.get("user-agent", "")
        if principal is None:
            return AuditContext(operator=True, ip=ip, user_agent=user_agent)
        user_id = principal.user_id or principal.account_id
        return AuditContext(user_id=user_id, api_key_id=principal.api_key_id, ip=ip, user_agent=user_agent)

    def _is_operator(self, token: str) -> bool:
        admin = self.settings.admin_token
        return admin is not None and hmac.compare_digest(token.encode(), admin.get_secret_value().encode())

    def _authenticate_service(self, token: str) -> ServicePrincipal:
        self._check_ready()
        service = self.service_tokens.get(hash_secret(token))
        if service is None:
            raise _unauthorized(ErrorCode.INVALID_SERVICE_TOKEN, "The service token is not valid.")
        return service

    async def _admit_key_call(
        self,
        request: Request,
        context: CallContext,
        principal: Principal,
        permission: Permission | None,
        consumes: Resource | None,
        counted: bool,
        console_only: bool,
        now: datetime,
        cost: int = 0,
    ) -> None:
        """An API key's call, refused in the contract's order: 429 rate_limited, 403
        console_session_required or permission_denied, 503 overloaded, 403 insufficient_quota.
        The checks that need no I/O run first, so that the rate limit and the api_calls admission
        share one Redis round trip; a call any check refuses is not admitted. Every API-key call
        consumes api_calls except the quota reads (`counted`, contracts/quota_api.py); a route may
        name one more resource (`consumes`), and verify a `cost` of it that must still fit."""
        account_id, key_id = principal.account_id, principal.api_key_id
        assert key_id is not None
        self._record_call(request, account_id, key_id, now)
        refusal = _refusal(principal, permission, console_only)
        # The call's event gets its place before the handler runs (or 503), if it may run at all.
        placed = refusal is None and self.calls.reserve()
        context.reserved = placed
        # (v4) the key's own limits first (the narrower bound), then the account's; counted where
        # the key's lineage stands (a rotated key shares its predecessor's counts and admissions)
        limits = self.key_limits(key_id)
        lineage_id = self.key_lineage(key_id)
        key_out = self.key_quota.refusing(lineage_id, limits, consumes, cost, now) if placed and consumes and limits else None
        exhausted = placed and consumes is not None and self.quota.lacks_room(account_id, consumes, cost, now)
        admission = self.quota.calls_view(account_id, now) if placed and not exhausted and not key_out and counted else None
        key_views = self.key_quota.calls_views(lineage_id, limits, now) if admission is not None and limits else []
        refused_by = await self._rate_limit(context, principal, admission, key_views)
        if refusal is not None:
            raise refusal
        if not placed:
            raise _overloaded()
        if key_out is not None:
            raise self.key_insufficient_quota(key_out)
        if exhausted and consumes is not None:
            raise self.insufficient_quota(account_id, consumes, now)
        if admission is None:
            return
        if refused_by is None:  # no Redis, or Redis failed: this process's own count
            key_out = self.key_quota.refusing(lineage_id, limits, Resource.API_CALLS, 1, now) if key_views else None
            if key_out is not None:
                raise self.key_insufficient_quota(key_out)
            if not self._admit_here(account_id, now):
                raise self.insufficient_quota(account_id, Resource.API_CALLS, now)
            if key_views:
                self.key_quota.admit_call(lineage_id, limits, now)  # room was just seen (no await since)
            give_back = partial(self._give_back_here, account_id, lineage_id, limits, now)
        elif refused_by == 1:
            raise self.insufficient_quota(account_id, Resource.API_CALLS, now)
        elif refused_by > 1:
            api_calls_limits = [limit for limit in limits if limit.resource is Resource.API_CALLS]
            raise self.key_insufficient_quota(self.key_quota.standing(lineage_id, api_calls_limits[refused_by - 2], now))
        else:
            assert self.shared is not None
            give_back = partial(self._release_shared, (admission, *key_views))
        context.give_back = give_back  # if the call ends refused, quota will not count it

    def _give_back_here(self, account_id: UUID, lineage_id: UUID, limits: list[KeyLimit], admitted_at: datetime) -> None:
        self.quota.give_back(account_id, admitted_at)
        self.key_quota.give_back(lineage_id, limits, admitted_at)

    def _release_shared(self, admissions: tuple[CallsView, ...]) -> None:
        assert self.shared is not None
        for admission in admissions:
            self.shared.release_soon(admission)

    def key_insufficient_quota(self, standing: KeyStanding) -> ApiError:
        """(v4) 403 insufficient_quota for the key's own limit: `total` is its amount, `period_end`
        when its window ends (null for `once`), `details.scope: "api_key"`."""
        limit = standing.limit
        details = InsufficientQuotaDetails(
            resource=limit.resource,
            used=standing.used,
            total=limit.amount,
            period_end=standing.resets_at,
            links=quota_links(self.settings.console_url, limit.resource),
            scope="api_key",
            limit_period=limit.period,
        )
        return ApiError(
            403,
            ErrorCode.INSUFFICIENT_QUOTA,
            f"This key's own {limit.period.value} limit of {limit.resource.value} is exhausted "
            f"({standing.used} + {standing.reserved} reserved of {limit.amount}).",
            details=details.body(),
        )

    def _check_consumes(self, account_id: UUID, consumes: Resource | None, now: datetime) -> None:
        if consumes is not None and self.quota.is_blocked(account_id, consumes, now):
            raise self.insufficient_quota(account_id, consumes, now)

    def _admit_here(self, account_id: UUID, now: datetime) -> bool:
        """This process's own api_calls admission. With REDIS_URL set this is the fallback when
        Redis failed: never silent (a warning at most every 10 s and a metric); the bound while it
        lasts is in docs/quota.md."""
        if self.shared is not None:
            ADMISSION_STORE_ERRORS.inc()
            self._admission_log.warning("shared api_calls admissions unavailable (Redis): judging by this process alone")
        return self.quota.admit_call(account_id, now)

    async def _rate_limit(
        self,
        context: CallContext,
        principal: Principal,
        admission: CallsView | None,
        key_views: list[CallsView],
    ) -> int | None:
        """429 when the account's or the key's bucket or window is exhausted (the call's place, if
        it took one, is freed); X-RateLimit-* on every API-key response (RequestMiddleware adds
        them, to errors as well). Returns the shared api_calls admission of `admission` judged in
        the same round trip, or None when it was not judged there. With several replicas the same
        round trip asks whether the key was revoked after the state this process judged it by
        (`revoke_everywhere`): 401 then, as the state will say once it arrives. (v4) The key's own
        api_calls limits (`key_views`) are admitted with the account's, all or none: 0 admitted,
        1 the account had no room, 1 + i the key's i-th api_calls limit had none."""
        account_id, key_id = principal.account_id, principal.api_key_id
        assert key_id is not None
        limits, subjects = self._limits_of(principal), self._subjects_of(key_id, account_id)
        admitted: int | None = None
        try:
            if self.shared is not None:
                known = _key_check(principal)
                admissions = () if admission is None else (admission, *key_views)
                decision, admitted = await self.shared.hit_and_admit_all(subjects, limits, time.time(), admissions, known)
            else:
                decision = await self.limiter.hit(subjects, limits, time.time())
        except KeyRevoked as revoked:
            self._free_place(context)
            raise _revoked_refusal(revoked) from None
        context.response_headers = decision.headers()
        if not decision.allowed:
            self._free_place(context)
            raise _rate_limited(decision)
        return admitted

    async def _refuse_by_rules(self, context: CallContext, principal: Principal, ruled: ApiError) -> NoReturn:
        """(v4) Raise `ruled`, the 403 of the key's own rules (which come before the rate limit),
        with the limiter's X-RateLimit-* as they stand (no Retry-After: waiting would not admit it).
        A peek takes nothing, from the key or its account: a key used outside its rules (a leaked
        one, from elsewhere) spends no one's rate limit. The shared store's peek still asks whether
        the key was revoked on another replica (a revoked key's 401 first), and answers from its
        copy, without a round trip, while the copy refuses the key."""
        account_id, key_id = principal.account_id, principal.api_key_id
        assert key_id is not None
        limits, subjects = self._limits_of(principal), self._subjects_of(key_id, account_id)
        try:
            if self.shared is not None:
                decision = await self.shared.peek(subjects, limits, time.time(), _key_check(principal))
            else:
                decision = await self.limiter.peek(subjects, limits, time.time())
        except KeyRevoked as revoked:
            raise _revoked_refusal(revoked) from None
        context.response_headers = decision.limit_headers()
        raise ruled

    def _free_place(self, context: CallContext) -> None:
        """A call refused after it took its place in the admitted lane gives the place back."""
        if context.reserved:
            self.calls.release()
            context.reserved = False

    async def revoke_everywhere(self, state: KeyState) -> None:
        """(Keys, before a toggle or delete answers) a disabled or deleted key's state, in the store
        every replica asks on each admission: refused by all of them from now on, before their
        keys.v1 projections have it. Without a shared store there is one process, which applies
        the state itself. A store failure leaves keys.v1 alone to carry it (milliseconds; logged)."""
        if self.shared is None or (state.status == KeyStatus.ENABLED and not state.deleted):
            return
        how = "deleted" if state.deleted else "disabled"
        await self._share_revocation(KeyCheck(state.key_id, state.version), how)

    async def narrow_everywhere(self, state: KeyState) -> None:
        """(v4, keys, before a PATCH of a key's rules answers) every replica refuses the key's calls
        judged by a state older than `state` (503, retry) until its keys.v1 projection has it: new
        rules, narrower ones above all, are in force everywhere when the PATCH answers."""
        if self.shared is not None:
            await self._share_revocation(KeyCheck(state.key_id, state.version), "narrowed")

    async def _share_revocation(self, check: KeyCheck, how: str) -> None:
        assert self.shared is not None
        try:
            await self.shared.revoke(check, how=how)
        except Exception:
            REVOCATION_STORE_ERRORS.inc()
            self._ends_log.warning("a key's revocation could not be shared (Redis): keys.v1 carries it alone")

    async def _check_session_everywhere(self, principal: Principal) -> None:
        """(A console session, after this process's projections passed it) 401 if the shared store
        says it was logged out, or ended by its user's password change or removal; 503 (retry) if
        its user's role changed after the state this process judged it by: what users.v1 and
        sessions.v1 will say once they arrive (user_revocations.py). One round trip: console
        traffic is light. Redis failing: judged by the projections alone (counted, logged)."""
        if self.shared is None or principal.session_id is None:
            return
        user_id = principal.user_id or principal.account_id
        try:
            how = await self.shared.users.session_over(user_id, principal.session_id, principal.user_version, principal.issued_at)
        except Exception:
            CREDENTIAL_CHECK_ERRORS.inc()
            self._ends_log.warning("a session's end could not be asked (Redis): judged by this process alone")
            return
        if how is not None:
            raise _session_over(how)

    async def change_user_everywhere(self, state: UserState, key_ids: Sequence[UUID]) -> None:
        """(Keys, before a member's removal or role change answers) every replica refuses the
        user's keys (their calls' script) and sessions judged by an older users.v1 state of the
        user: a removed user's as deleted, a re-roled user's 503 (retry) until it has the new
        state; and no lease of `key_ids` (the user's live keys) taken before is held any more."""
        if self.shared is None:
            return
        how = "removed" if state.removed else "role"
        try:
            await self.shared.users.change(state.user_id, state.version, how, key_ids)
        except Exception:
            REVOCATION_STORE_ERRORS.inc()
            self._ends_log.warning("a user's removal or role change could not be shared (Redis): users.v1 carries it alone")

    async def end_sessions_everywhere(self, state: UserState) -> None:
        """(Keys, before a password change answers) every replica refuses the user's sessions issued
        before its `sessions_not_before`."""
        if self.shared is None or state.sessions_not_before is None:
            return
        try:
            await self.shared.users.end_sessions(state.user_id, state.sessions_not_before.timestamp())
        except Exception:
            REVOCATION_STORE_ERRORS.inc()
            self._ends_log.warning("a user's sessions' end could not be shared (Redis): users.v1 carries it alone")

    async def log_out_everywhere(self, events: Sequence[SessionRevoked], now: datetime) -> None:
        """(Keys, before a logout answers) every replica refuses these sessions for as long as they
        could still be valid (the session lifetime after the logout)."""
        ttl = self.settings.session_ttl_seconds
        ends = [(e.user_id, e.session_id, int(e.revoked_at.timestamp() + ttl - now.timestamp()) + 1) for e in events]
        live = [end for end in ends if end[2] > 1]
        if self.shared is None or not live:
            return
        try:
            await self.shared.users.log_out(live)
        except Exception:
            REVOCATION_STORE_ERRORS.inc()
            self._ends_log.warning("a logout could not be shared (Redis): sessions.v1 carries it alone")

    async def revoke_token_everywhere(self, state: ServiceTokenState) -> None:
        """(Keys, before a service token's revocation answers) every replica refuses the token
        within 50 ms, before its service-tokens.v1 projection has the revocation."""
        if self.shared is None or not state.revoked:
            return
        try:
            await self.shared.tokens.revoke(state.token_id, state.version)
        except Exception:
            REVOCATION_STORE_ERRORS.inc()
            self._ends_log.warning("a service token's revocation could not be shared (Redis): its topic carries it alone")

    def _limits_of(self, principal: Principal) -> tuple[Limits, Limits]:
        """The limits of the call's subjects: its account's (the plan's) and its key's (v4: the
        narrower of the key's own rate limit and the plan's, each number; the plan's if it has none)."""
        plan = self.plans.rate_limit(principal.account_id)
        own = principal.gate.rate_limit if principal.gate is not None else None
        limits = self._limits.get((plan, own))
        if limits is None:
            if len(self._limits) >= MAX_CACHED_SUBJECTS:
                self._limits.clear()
            limits = self._limits[(plan, own)] = (Limits.of(plan), Limits.of(narrower(plan, own)))
        return limits

    def _subjects_of(self, key_id: UUID, account_id: UUID) -> tuple[str, str]:
        """The key's rate-limit subjects: its account's and its own."""
        subjects = self._subjects.get(key_id)
        if subjects is None or subjects[0] != account_id:
            if len(self._subjects) >= MAX_CACHED_SUBJECTS:
                self._subjects.clear()
            subjects = self._subjects[key_id] = (account_id, (f"a:{account_id}", f"k:{key_id}"))
        return subjects[1]

    def _record_call(self, request: Request, account_id: UUID, api_key_id: UUID, now: datetime) -> None:
        """This request is an API key's call: its calls.v1 event is sent once the response has
        (status and latency known; RequestMiddleware finishes the CallContext)."""
        path = getattr(request.scope.get("route"), "path", None) or request.url.path  # the URL only if no route
        client = request.scope.get("client")
        headers = request.headers
        call = Call(
            now,
            account_id,
            api_key_id,
            request.method,
            str(path),
            0,  # status and latency: when the response has been sent
            client_ip(client[0] if client else "", forwarded_for(headers), self._trusted),
            headers.get("user-agent", ""),
            0.0,
        )
        context_of(request.scope).hold(self.calls, call)

    def insufficient_quota(
        self, account_id: UUID, resource: Resource, now: datetime, *, used: int | None = None, total: int | None = None
    ) -> ApiError:
        """403 insufficient_quota with its details; used/total from the quota projection unless
        the caller knows better (geo counts its projects itself)."""
        known_used, known_total = self.quota.standing(account_id, resource, now)
        return insufficient_quota(
            self.settings.console_url,
            resource,
            known_used if used is None else used,
            known_total if total is None else total,
            self.quota.period_end(now),
        )

    def authenticate(self, request: Request, now: datetime) -> Principal:
        token = _bearer(request)
        if token.startswith(API_KEY_PREFIX):
            return self._authenticate_key(token, now, request)
        if token.startswith(SERVICE_TOKEN_PREFIX):
            self._authenticate_service(token)  # unknown or revoked: 401; valid: not a customer
            raise ApiError(403, ErrorCode.PERMISSION_DENIED, "A service token cannot call a customer endpoint.")
        return self._authenticate_session(token, now)

    def _authenticate_session(self, token: str, now: datetime) -> Principal:
        self._check_ready()
        try:
            claims = sessions.verify(
                self._secret, token, now, max_lifetime_s=self.settings.session_ttl_seconds, also_accepted=self._also_accepted
            )
        except sessions.InvalidSession:
            raise _unauthorized(ErrorCode.INVALID_SESSION, "The console session is invalid or has expired.") from None
        account = self.accounts.get(claims.account_id)
        # logged out (sessions.v1), or issued before the user's password change or removal (users.v1)
        user_id = claims.user
        revoked = (user_id, claims.session_id) in self.revoked_sessions
        ended = revoked or self.users.ended(user_id, claims.issued_at)
        if account is None or ended:
            raise _unauthorized(ErrorCode.INVALID_SESSION, "The console session is invalid or has expired.")
        user = self.users.get(user_id)
        roles = acting_roles(user, user_id, account.account_id, account.roles)
        return Principal(
            account_id=account.account_id,
            roles=roles,
            session_id=claims.session_id,
            user_id=user_id,
            user_version=-1 if user is None else user.version,
            issued_at=claims.issued_at,
        )

    def _authenticate_key(self, secret: str, now: datetime, request: Request) -> Principal:
        self._check_ready()
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
        # A key acts as its creator: with its current role (users.v1), and dies with its removal. A
        # key from before members (no creator) was created by the registering user (id = account id).
        user_id = state.created_by or state.account_id
        creator = self.users.get(user_id)
        if creator is not None and creator.removed:
            self._record_call(request, state.account_id, state.key_id, now)
            raise _unauthorized(ErrorCode.INVALID_API_KEY, "The API key is not valid.")
        account = None if creator is not None else self.accounts.get(state.account_id)
        # The principal of a key is a function of the (immutable) states it was built from:
        # reuse it while they are the very objects the projections still hold.
        source = creator if creator is not None else account
        cached = self._principals.get(state.key_id)
        if cached is not None and cached[0] is state and cached[1] is source:
            return cached[2]
        # (an account this edge does not know: the registering user's role as keys.v1 published it)
        account_roles = account.roles if account is not None else state.roles
        roles = acting_roles(creator, user_id, state.account_id, account_roles)
        principal = Principal(
            account_id=state.account_id,
            roles=roles,
            api_key_id=state.key_id,
            user_id=state.created_by,
            key_version=state.version,
            gate=KeyGate.of(state),  # parsed once per state: a call pays a few comparisons
            user_version=-1 if creator is None else creator.version,
        )
        if len(self._principals) >= MAX_CACHED_SUBJECTS:
            self._principals.clear()
        self._principals[state.key_id] = (state, source, principal)
        return principal
