"""HTTP routes of the keys service: accounts, console sessions, API keys, operator roles."""

from typing import Annotated, TypeVar
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import AwareDatetime

from contracts.audit import AuditAction, AuditLog
from contracts.common import Permission, Tier, UserType
from contracts.key_limits import KeyRules
from contracts.keys_api import (
    Account,
    KeyCreated,
    KeyCreateRequest,
    KeyItem,
    KeyList,
    KeyToggled,
    KeyUpdateRequest,
    LoginRequest,
    LoginResponse,
    Member,
    MemberCreateRequest,
    MemberList,
    MemberRoleRequest,
    PasswordChangeRequest,
    RegisterRequest,
    RolesRequest,
    RotateRequest,
    UserTypeRequest,
)
from contracts.service_tokens_api import ServiceTokenCreated, ServiceTokenCreateRequest, ServiceTokenItem, ServiceTokenList
from services.edge import Principal, Runtime, client_ip, forwarded_for, parse_networks
from services.keys import domain
from services.keys.attempt_logs import AttemptLogs
from services.keys.login_throttle import LoginThrottle
from services.keys.registration_throttle import RegistrationThrottle, limit_for
from services.keys.service import KeysService
from services.keys.store import Row

KeyObject = TypeVar("KeyObject", KeyItem, KeyCreated)
CONSOLE = "Console only: an API key gets 403 `console_session_required`."
RULES = (
    ' (v4) A key\'s own rules, all optional (API.md, "Per-key limits and restrictions"): `limits` (one per '
    "resource and period; `amount` > 0; `once` never refills), `allowed_models` (`provider/model` or `provider/*`), "
    "`allowed_routes` (`METHOD /path` or `METHOD /prefix/*`; `*` only at the end), `allowed_ips` (CIDRs, IPv4 or "
    "IPv6, written back in canonical form), `rate_limit` (each number at most the account plan's). An empty list "
    "allows everything. Any other value is 422 `validation_error` naming the field."
)


def _account(row: Row) -> Account:
    return Account(
        id=row["id"],
        email=row["email"],
        name=row["name"],
        user_type=UserType(row["user_type"]),
        roles=row["roles"],
        plan=Tier(row["plan"]),
        role=row.get("role"),
    )


def _user(principal: Principal) -> UUID:
    """The acting user (a session from before members: the registering user, id = account id)."""
    return principal.user_id or principal.account_id


def _only_own(principal: Principal) -> UUID | None:
    """A developer writes only the keys it created; an owner every key of the account."""
    return None if domain.writes_any_key(principal.roles) else _user(principal)


def _item(row: Row) -> KeyItem:
    return KeyItem.model_validate({**row, **row["rules"]})


def _created(row: Row, secret: str) -> KeyCreated:
    return KeyCreated(
        **row["rules"],
        id=row["id"],
        name=row["name"],
        key=secret,
        masked_key=row["masked_key"],
        status=row["status"],
        expires_at=row["expires_at"],
        created_at=row["created_at"],
    )


def build_router(runtime: Runtime, service: KeysService, attempts: AttemptLogs) -> APIRouter:
    """`attempts`: where the login and sign-up throttles count (failover_logs.attempt_logs)."""
    api = APIRouter(tags=["keys"])
    edge = runtime.edge
    console = edge.requires(console_only=True)
    caller = edge.requires()  # a console session or an API key, any role
    console_keys_write = edge.requires(Permission.KEYS_WRITE, console_only=True)
    console_billing_write = edge.requires(Permission.BILLING_WRITE, console_only=True)
    throttle, trusted = LoginThrottle(logs=attempts), parse_networks(runtime.settings.trusted_proxies)
    signups = RegistrationThrottle(limit_for(service.hasher), logs=attempts)
    operator = edge.requires_operator()

    def caller_ip(request: Request) -> str:
        """The client's address: X-Forwarded-For believed only from TRUSTED_PROXIES."""
        peer = request.client.host if request.client is not None else ""
        return client_ip(peer, forwarded_for(request.headers), trusted)

    def with_usage(key: KeyObject) -> KeyObject:
        # (v4) The key's usage against its limits comes from this process's edge, which holds every
        # key's standing (quota.v1) for its gate: keys never imports quota nor calls it per listing.
        return key.model_copy(update={"usage": edge.key_usage(key.id, runtime.clock())})

    # ---- accounts ----------------------------------------------------------------------------
    @api.post(
        "/api/auth/register",
        status_code=201,
        description="Creates an account (roles `[owner]`, plan `free`) and its registering user, its `owner`, whose "
        "user id is the account id (its users.v1 state is published here). Extension: 409 `conflict` if any user "
        "(a member of any account too) has the e-mail; 429 `rate_limited` with `Retry-After` after too many sign-ups "
        "from the client IP (services/keys/registration_throttle.py: 20 in 10 minutes, shared by the replicas "
        "through Redis when REDIS_URL is set), before any "
        "password is hashed.",
    )
    async def register(body: RegisterRequest, request: Request) -> Account:
        await signups.admit(caller_ip(request))
        return _account(await service.register(body))

    @api.post(
        "/api/auth/login",
        description="A console session token (never starts with `sk-`). "
        "Extension: 401 `invalid_credentials` on a wrong e-mail or password; 429 `rate_limited` with "
        "`Retry-After` after too many failures for the e-mail or from the client IP (services/keys/login_throttle.py).",
    )
    async def login(body: LoginRequest, request: Request) -> LoginResponse:
        async with throttle.attempt(body.email, caller_ip(request)):
            token, ttl = await service.login(body.email, body.password)
        return LoginResponse(access_token=token, expires_in=ttl)

    @api.post(
        "/api/auth/logout",
        status_code=204,
        response_class=Response,
        description=CONSOLE + " Ends this console session: publishes `session_revoked` to sessions.v1 and answers "
        "after Kafka has it and this process refuses the session (401 `invalid_session`); every other replica "
        "refuses it within milliseconds. A second logout with the same session is therefore 401. The event's "
        "`user_id` is the session's user.",
    )
    async def logout(request: Request, principal: Annotated[Principal, Depends(console)]) -> Response:
        assert principal.session_id is not None  # a console-only route
        audit = edge.audit_context(request, principal)
        await service.logout(principal.account_id, _user(principal), principal.session_id, audit=audit)
        return Response(status_code=204)

    @api.put(
        "/api/account/password",
        status_code=204,
        response_class=Response,
        description=CONSOLE + " Changes the password (argon2, as at login) and ends every session of the user, "
        "this one included, on every replica at once (users.v1 `sessions_not_before` = now; log in again). "
        "403 `permission_denied` if `current_password` is wrong; 422 if `new_password` is shorter than 8 or "
        "longer than 1024 characters (the registration rule) or equals the current one. The calling user's "
        "password only; the account's other members keep theirs.",
    )
    async def put_password(
        body: PasswordChangeRequest, request: Request, principal: Annotated[Principal, Depends(console)]
    ) -> Response:
        audit = edge.audit_context(request, principal)
        await service.change_password(_user(principal), body.current_password, body.new_password, audit=audit)
        return Response(status_code=204)

    @api.get(
        "/api/account",
        description="A console session or an API key (a script learns its account id here). The account as the "
        "calling user sees it (with a key: the key's creator): `role` is that user's role (v2) and `roles` is `[role]` "
        "for v1 clients. Any role may read it. With an API key it is an ordinary call: rate-limited, counted in "
        "`api_calls` and logged in the activity log (only the two quota reads are exempt).",
    )
    async def get_account(principal: Annotated[Principal, Depends(caller)]) -> Account:
        return _account(await service.account(principal.account_id, _user(principal)))

    @api.put(
        "/api/account/user-type",
        description=CONSOLE + " Needs `billing:write` (owner, billing; a developer or viewer gets 403 "
        "`permission_denied`): the user type decides which plans the account may buy. Publishes `user_type_changed` "
        "to billing.v1. Extension: 409 `user_type_plan_mismatch` when an account on the enterprise plan asks to become "
        "`individual`.",
    )
    async def put_user_type(
        body: UserTypeRequest, request: Request, principal: Annotated[Principal, Depends(console_billing_write)]
    ) -> Account:
        audit = edge.audit_context(request, principal)
        return _account(await service.change_user_type(principal.account_id, body.user_type, audit=audit))

    # ---- API keys ------------------------------------------------------------------------------
    @api.post(
        "/api/api-keys",
        status_code=201,
        description=CONSOLE + " Needs `keys:write`. `expires_at` must be in the future." + RULES,
    )
    async def create_key(
        body: KeyCreateRequest, request: Request, principal: Annotated[Principal, Depends(console_keys_write)]
    ) -> KeyCreated:
        audit = edge.audit_context(request, principal)
        rules = KeyRules.model_validate(body.model_dump(include=set(KeyRules.model_fields)))
        row, secret = await service.create_key(
            principal.account_id, _user(principal), body.name, body.expires_at, audit=audit, rules=rules
        )
        return with_usage(_created(row, secret))

    @api.patch(
        "/api/api-keys/{key_id}",
        description=CONSOLE + " (v4) Needs `keys:write` (a developer: only the keys it created, others' 403 "
        "`permission_denied`; another account's key is 404). Changes the key's `name` and rules: an absent field "
        "stays as it is, `null` clears it. Answers the key object after the new state is in Kafka and in force in "
        "this process; every other replica refuses the key's calls judged by its older state until it has the new "
        "one (milliseconds), so a narrowed key never widens by a race. Audit: `api_key.updated` with the changed "
        "fields' new values." + RULES,
    )
    async def update_key(
        key_id: UUID, body: KeyUpdateRequest, request: Request, principal: Annotated[Principal, Depends(console_keys_write)]
    ) -> KeyItem:
        audit = edge.audit_context(request, principal)
        updated = await service.update(principal.account_id, key_id, body, audit=audit, only_own=_only_own(principal))
        return with_usage(_item(updated))

    @api.get(
        "/api/api-keys",
        description=CONSOLE + " Live keys (deleted ones are gone), oldest first. `status` is `expired` once "
        "now >= `expires_at` (computed at listing, whatever the stored enabled/disabled state); `last_used_at` "
        "moves only on calls the key was admitted for (refused calls, which carry `error_code` on calls.v1, do not move it).",
    )
    async def list_keys(principal: Annotated[Principal, Depends(console)]) -> KeyList:
        return KeyList(items=[with_usage(_item(r)) for r in await service.list_keys(principal.account_id)])

    @api.post(
        "/api/api-keys/{key_id}/toggle",
        description=CONSOLE + " Answers after the new state is in Kafka and in force in this process.",
    )
    async def toggle_key(
        key_id: UUID, request: Request, principal: Annotated[Principal, Depends(console_keys_write)]
    ) -> KeyToggled:
        audit = edge.audit_context(request, principal)
        row = await service.toggle(principal.account_id, key_id, audit=audit, only_own=_only_own(principal))
        return KeyToggled(id=row["id"], status=row["status"])

    @api.delete(
        "/api/api-keys/{key_id}",
        status_code=204,
        response_class=Response,
        description=CONSOLE + " Answers after the deletion is in Kafka and in force in this process.",
    )
    async def delete_key(
        key_id: UUID, request: Request, principal: Annotated[Principal, Depends(console_keys_write)]
    ) -> Response:
        audit = edge.audit_context(request, principal)
        await service.delete(principal.account_id, key_id, audit=audit, only_own=_only_own(principal))
        return Response(status_code=204)

    @api.post(
        "/api/api-keys/{key_id}/rotate",
        status_code=201,
        description=CONSOLE + " The new key has the old one's name, creator (it acts with that user's role, "
        "whoever rotates) and rules, and no expiry; the old key expires after "
        "`grace_seconds` (never later than its own expiry) and is then deleted; 0 deletes it at once. A key is "
        "rotated once: a key in its grace period already has its successor, and rotating it again is 409 `conflict` "
        "(rotate the successor instead); of two rotations of one key at the same instant, one succeeds.",
    )
    async def rotate_key(
        key_id: UUID, body: RotateRequest, request: Request, principal: Annotated[Principal, Depends(console_keys_write)]
    ) -> KeyCreated:
        row, secret = await service.rotate(
            principal.account_id,
            key_id,
            body.grace_seconds,
            audit=edge.audit_context(request, principal),
            only_own=_only_own(principal),
        )
        return with_usage(_created(row, secret))

    # ---- members (v2) ---------------------------------------------------------------------------
    members_write = edge.requires(Permission.MEMBERS_WRITE, console_only=True)
    MEMBERS = (
        " Roles (API.md, Members): `owner` (everything, every key, members), `developer` (`keys:write` on the keys "
        "it created, others' keys 403; usage, quota, alerts, activity, projects, `billing:read`), `billing` (every read, "
        "`billing:write`, `audit:read`), `viewer` (every read but `audit:read`). Another account's member id is 404."
    )

    @api.get(
        "/api/account/members",
        description=CONSOLE + " The account's users (removed ones are gone), oldest first; any role may list." + MEMBERS,
    )
    async def list_members(principal: Annotated[Principal, Depends(console)]) -> MemberList:
        return MemberList(items=[Member.model_validate(m) for m in await service.list_members(principal.account_id)])

    @api.post(
        "/api/account/members",
        status_code=201,
        description=CONSOLE + " Owner only (`members:write`, else 403 `permission_denied`): adds a user who logs in "
        "with this e-mail and password. 409 `conflict` if a user already has the e-mail; 422 `validation_error` "
        "for an unknown role." + MEMBERS,
    )
    async def add_member(
        body: MemberCreateRequest, request: Request, principal: Annotated[Principal, Depends(members_write)]
    ) -> Member:
        audit = edge.audit_context(request, principal)
        row = await service.add_member(principal.account_id, body.email, body.name, body.password, body.role, audit=audit)
        return Member.model_validate(row)

    @api.put(
        "/api/account/members/{member_id}/role",
        description=CONSOLE + " Owner only (`members:write`): the member's new role, in force on its sessions and "
        "its keys (which act with their creator's current role) when this answers, and on every replica within "
        "milliseconds (users.v1, keys.v1). 409 `last_owner` when it would demote the account's last owner; "
        "422 for an unknown role." + MEMBERS,
    )
    async def put_member_role(
        member_id: UUID, body: MemberRoleRequest, request: Request, principal: Annotated[Principal, Depends(members_write)]
    ) -> Member:
        audit = edge.audit_context(request, principal)
        return Member.model_validate(await service.change_member_role(principal.account_id, member_id, body.role, audit=audit))

    @api.delete(
        "/api/account/members/{member_id}",
        status_code=204,
        response_class=Response,
        description=CONSOLE + " Owner only (`members:write`): removes the user; its sessions (401 `invalid_session`) "
        "and its keys (deleted: 401 `invalid_api_key`) die at once on every replica. 409 `last_owner` for the "
        "account's last owner." + MEMBERS,
    )
    async def delete_member(
        member_id: UUID, request: Request, principal: Annotated[Principal, Depends(members_write)]
    ) -> Response:
        await service.remove_member(principal.account_id, member_id, audit=edge.audit_context(request, principal))
        return Response(status_code=204)

    # ---- the audit log (v2) ----------------------------------------------------------------------
    audit_read = edge.requires(Permission.AUDIT_READ, console_only=True)

    @api.get(
        "/api/audit-log",
        description=CONSOLE + " Needs `audit:read` (roles owner and billing; others 403 `permission_denied`). Every "
        "console and operator write of the account, newest first: `actor` is `{user_id, email}` for a console "
        "session, `{user_id, email, api_key_id}` for an API key (its creator) or `{operator: true}`. Filters: "
        "`start` <= time < `end` (ISO 8601 with an offset; `start` must be before `end`) and `action`; "
        "`next_cursor` (null on the last page) fetches the next page; an unknown cursor is 422. Entries are "
        "append-only and arrive within about a second of the write (each service's outbox, then audit.v1).",
    )
    async def audit_log(
        principal: Annotated[Principal, Depends(audit_read)],
        start: AwareDatetime | None = None,
        end: AwareDatetime | None = None,
        action: AuditAction | None = None,
        limit: Annotated[int, Query(ge=1, le=domain.AUDIT_PAGE_MAX)] = 50,
        cursor: Annotated[str | None, Query(max_length=200)] = None,
    ) -> AuditLog:
        return await service.audit_log(principal.account_id, start=start, end=end, action=action, limit=limit, cursor=cursor)

    # ---- operator ------------------------------------------------------------------------------
    @api.put(
        "/api/admin/accounts/{account_id}/roles",
        dependencies=[Depends(operator)],
        description="Extension (operator): sets an account's roles with `Authorization: Bearer <ADMIN_TOKEN>`; "
        "404 while ADMIN_TOKEN is unset. Also sets the role of the account's registering user (owner if listed, "
        "else the first), in force on that user's sessions and keys at once; other members keep theirs.",
    )
    async def put_roles(account_id: UUID, body: RolesRequest, request: Request) -> Account:
        return _account(await service.set_roles(account_id, body.roles, audit=edge.audit_context(request, None)))

    @api.post(
        "/api/admin/service-tokens",
        status_code=201,
        dependencies=[Depends(operator)],
        description="Operator (`Authorization: Bearer <ADMIN_TOKEN>`; 404 while ADMIN_TOKEN is unset): a token for a "
        "platform service (`st-` + 48 URL-safe characters). `token` is in this response only; only its SHA-256 hash "
        "is stored and published (service-tokens.v1). Answers after the token is in force in this process; other "
        'replicas learn it within milliseconds. `scopes` defaults to `["usage:write"]`.',
    )
    async def create_service_token(body: ServiceTokenCreateRequest, request: Request) -> ServiceTokenCreated:
        row, token = await service.create_service_token(body.name, body.scopes, audit=edge.audit_context(request, None))
        return ServiceTokenCreated(
            id=row["id"], name=row["name"], scopes=row["scopes"], token=token, created_at=row["created_at"]
        )

    @api.get(
        "/api/admin/service-tokens",
        dependencies=[Depends(operator)],
        description="Operator: every service token, revoked ones too (`revoked_at`), oldest first; never the token. "
        "`last_used_at` is approximate (written in batches at most every 5 s by processes that run the keys service).",
    )
    async def list_service_tokens() -> ServiceTokenList:
        return ServiceTokenList(items=[ServiceTokenItem.model_validate(r) for r in await service.list_service_tokens()])

    @api.delete(
        "/api/admin/service-tokens/{token_id}",
        status_code=204,
        response_class=Response,
        dependencies=[Depends(operator)],
        description="Operator: revokes the token for good (401 `invalid_service_token` from then on). Answers after "
        "the revocation is in Kafka and in force in this process; every other replica refuses it within milliseconds. "
        "Revoking a revoked token is a 204 again; an unknown id is 404.",
    )
    async def revoke_service_token(token_id: UUID, request: Request) -> Response:
        await service.revoke_service_token(token_id, audit=edge.audit_context(request, None))
        return Response(status_code=204)

    return api
