"""Who may call what, as the contract says it (API.md, "Conventions" and "Members (v2)"), written
out apart from the code it checks: the permission-matrix tests (tests/unit/test_edge_permission_matrix.py,
tests/integration/test_permission_matrix.py) derive each expected answer from these words alone,
never from contracts/common.py's ROLE_PERMISSIONS, so the code is held to the contract, not to itself."""

from dataclasses import dataclass
from typing import Literal

# API.md, "Members (v2)", the role table, word for word
READS = frozenset({"usage:read", "quota:read", "alerts:read", "billing:read", "activity:read", "projects:read", "audit:read"})
WRITES = frozenset({"keys:write", "alerts:write", "billing:write", "projects:write", "members:write"})
ROLES: dict[str, frozenset[str]] = {
    "owner": READS | WRITES,  # "all, including members:write, audit:read, billing:write, every key"
    "developer": frozenset(  # keys:write "on keys it created (others' keys: 403)"
        {
            "keys:write",
            "usage:read",
            "quota:read",
            "alerts:read",
            "alerts:write",
            "activity:read",
            "projects:read",
            "projects:write",
            "billing:read",
        }
    ),
    "billing": READS | {"billing:write"},  # "billing:read, billing:write, audit:read, and every read but members:write"
    "viewer": READS - {"audit:read"},  # "every *:read except audit:read"
}
SCOPES = ("usage:write", "keys:verify")  # a service token's; "usage:write is never a user's permission"


@dataclass(frozen=True)
class Caller:
    name: str
    kind: Literal["none", "session", "key", "service", "admin"]
    role: str | None = None
    scopes: frozenset[str] = frozenset()
    stranger: bool = False  # of another account (for a reservation: another service token)
    # a credential that died: the owner's (a key disabled or deleted, a session logged out), a
    # removed developer's (its key and session), or a revoked token with every scope
    dead: Literal["", "disabled", "deleted", "logged_out", "removed_key", "removed_session", "revoked"] = ""


# The 401 of a credential that no longer works, wherever a credential is judged (API.md's table)
DEAD: dict[str, str] = {
    "disabled": "api_key_disabled",
    "deleted": "invalid_api_key",
    "logged_out": "invalid_session",
    "removed_key": "invalid_api_key",  # "that user's keys and sessions die at once"
    "removed_session": "invalid_session",
    "revoked": "invalid_service_token",
}


CALLERS: tuple[Caller, ...] = (
    Caller("nobody", "none"),
    *(Caller(f"{role} session", "session", role) for role in ROLES),
    *(Caller(f"{role} key", "key", role) for role in ROLES),
    *(Caller(f"{scope} token", "service", scopes=frozenset({scope})) for scope in SCOPES),
    Caller("admin token", "admin"),
)
# credentials that worked before they died: every refusal is theirs alone
DEAD_CALLERS: tuple[Caller, ...] = (
    Caller("disabled owner key", "key", "owner", dead="disabled"),
    Caller("deleted owner key", "key", "owner", dead="deleted"),
    Caller("logged-out owner session", "session", "owner", dead="logged_out"),
    Caller("removed developer's key", "key", "developer", dead="removed_key"),
    Caller("removed developer's session", "session", "developer", dead="removed_session"),
    Caller("revoked service token", "service", scopes=frozenset(SCOPES), dead="revoked"),
)


@dataclass(frozen=True)
class Access:
    """A route's mark: `public`; `customer` (a session or an API key: unmarked); `console` (a
    session only); `service` (a service token in Authorization); `ingress` (a service token in
    X-Tollgate-Service-Token: authorize); `operator` (ADMIN_TOKEN). `need`: the permission (customer,
    console) or the scope (service, ingress)."""

    kind: Literal["public", "customer", "console", "service", "ingress", "operator"]
    need: str | None = None
    own_keys: bool = False  # keys:write on one key: a developer only on the keys it created


def answer(
    access: Access, caller: Caller, ok: int, *, others_key: bool = False, names_object: bool = False
) -> tuple[int, str | None]:
    """The contract's answer, (status, error code or None), to `caller` on a route marked `access`
    whose success is `ok`. `others_key`: the route writes a key another user of the account created;
    `names_object`: the path names an object (a stranger's is then 404)."""
    if access.kind == "public":
        return ok, None
    if access.kind == "ingress":  # the ingress's own token rides in X-Tollgate-Service-Token
        if caller.kind != "service" or caller.dead:
            return 401, "invalid_service_token"  # nothing there, or no (live) service token
        return (ok, None) if access.need in caller.scopes else (403, "permission_denied")
    if caller.kind == "none":
        if access.kind == "service" and access.need == "keys:verify":
            # verify: "a missing or revoked service token is 401 invalid_service_token" (its
            # decision `missing_credentials` is the caller's key's: the two must not be confused)
            return 401, "invalid_service_token"
        return 401, "missing_credentials"
    if access.kind == "operator":
        return (ok, None) if caller.kind == "admin" else (403, "permission_denied")
    if caller.dead:  # "a leaked key can neither mint keys nor re-enable itself": refused as dead first
        return 401, DEAD[caller.dead]
    if access.kind == "service":  # "a customer's API key or session there gets 403 permission_denied"
        if caller.kind != "service" or access.need not in caller.scopes:
            return 403, "permission_denied"
        return (404, "not_found") if caller.stranger and names_object else (ok, None)
    # a customer endpoint, marked console or not
    if caller.kind == "service":
        return 403, "permission_denied"  # "a service token on a customer endpoint"
    if caller.kind == "admin":
        return 401, "invalid_session"  # neither `sk-` nor `st-`: read as a console session, and no valid one
    if access.kind == "console" and caller.kind == "key":
        return 403, "console_session_required"
    assert caller.role is not None
    if access.need is not None and access.need not in ROLES[caller.role]:
        return 403, "permission_denied"
    if caller.stranger and names_object:
        return 404, "not_found"  # another account's object: never 403, no existence leak
    if access.own_keys and others_key and caller.role != "owner":
        return 403, "permission_denied"  # "developer: keys:write on keys it created (others' keys: 403)"
    return ok, None
