"""The permission matrix, walked over HTTP: every route x every kind of caller, each answer
checked against the contract (API.md, "Conventions", each route's mark, and "Members (v2)").

Callers: no credentials; a console session and an API key of each role (owner, developer,
billing, viewer) of one account, each key made by the user of its role (a key acts with its
creator's current role: the billing and viewer users made theirs as developers, then were
given their role); service tokens with `usage:write` and with `keys:verify`; the operator's
ADMIN_TOKEN; credentials that died (the owner's key disabled, another deleted, a session logged
out, a removed developer's key and session, a token with every scope revoked: each refused with
its own 401 wherever a credential is judged); and on every route that takes an object's id,
another account's owner (a session and a key) and another `usage:write` token, to whom the object
does not exist (404).

The expected answer of a cell comes from the contract's words alone (tests/support/
permission_contract.py: API.md's role table written out, not contracts/common.py's), so the code
is held to the contract, not to itself. A cell the contract allows must answer its 2xx; where that would change something the
walk still needs (a key toggled, a member removed, an order paid, a session ended), the cell gets
a fresh object (or user, or session) of its own, and a refused cell aims at a standing decoy that
the last test finds untouched. One platform for the module; no sleeps (setup polls for the
pipeline's notification only).
"""

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import httpx
import pytest

from services.runtime.platform.settings import Settings
from tests.hostile.helpers import PASSWORD, bearer, eventually, new_account
from tests.support.permission_contract import CALLERS, DEAD_CALLERS, READS, ROLES, WRITES, Access, Caller, answer
from tests.support.service_tokens import ADMIN_PATH, admin_headers

pytestmark = pytest.mark.integration

STRANGERS = (
    Caller("other account's owner session", "session", "owner", stranger=True),
    Caller("other account's owner key", "key", "owner", stranger=True),
    Caller("other usage:write token", "service", scopes=frozenset({"usage:write"}), stranger=True),
)
PUBLIC = Access("public")


def customer(need: str | None = None) -> Access:
    return Access("customer", need)


def console(need: str | None = None, *, own_keys: bool = False) -> Access:
    return Access("console", need, own_keys)


Body = Callable[["World"], dict[str, Any] | None]


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    access: Access
    ok: int
    # the kind of object the path's id names: "key" (the owner's), "own_key" (the calling user's),
    # "member", "order" (pending), "paid_order", "rule", "notification", "project", "reservation",
    # "service_token", "account", "forwarded" (Envoy's path)
    target: str | None = None
    body: Body = lambda _w: None
    mutates: bool = False  # an allowed call changes or ends its target: a fresh one per cell
    ends_caller: Literal["", "session", "user"] = ""  # an allowed call ends the session / the user's sessions

    @property
    def name(self) -> str:
        return f"{self.method} {self.template}" + (" (own key)" if self.target == "own_key" else "")


def _email() -> str:
    return f"pm{uuid.uuid4().hex[:12]}@example.com"


def _usage(world: "World") -> dict[str, Any]:
    event = {
        "id": str(uuid.uuid4()),
        "time": datetime.now(UTC).isoformat(),
        "account_id": world.account_id,
        "resource": "ai_tokens",
        "quantity": 1,
        "provider": "openai",
        "model": "gpt-4o",
        "input_tokens": 1,
        "output_tokens": 0,
        "source": "permission-matrix",
    }
    return {"events": [event]}


PACKAGE = {"kind": "quota_package", "package": {"resource": "ai_tokens", "amount": 100000}}
RULE = {"metric": "api_calls", "threshold_pct": 99, "channels": ["in_site"], "recipients": []}
FORWARDED = "v1/things"
BILLING_READ, BILLING_WRITE = console("billing:read"), console("billing:write")
KEYS_WRITE = console("keys:write", own_keys=True)
KEY_ROUTES: tuple[tuple[str, str, int, Body], ...] = (
    ("PATCH", "/api/api-keys/{key_id}", 200, lambda _w: {"name": "renamed by the matrix"}),
    ("POST", "/api/api-keys/{key_id}/toggle", 200, lambda _w: None),
    ("DELETE", "/api/api-keys/{key_id}", 204, lambda _w: None),
    ("POST", "/api/api-keys/{key_id}/rotate", 201, lambda _w: {"grace_seconds": 0}),
)
ENVOY_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

ROUTES: tuple[Route, ...] = (
    # accounts and sessions
    Route("POST", "/api/auth/register", PUBLIC, 201,
          body=lambda _w: {"email": _email(), "password": PASSWORD, "name": "M", "user_type": "individual"}),
    Route("POST", "/api/auth/login", PUBLIC, 200, body=lambda w: {"email": w.emails["owner"], "password": PASSWORD}),
    Route("POST", "/api/auth/logout", console(), 204, ends_caller="session"),
    Route("PUT", "/api/account/password", console(), 204, ends_caller="user",
          body=lambda _w: {"current_password": PASSWORD, "new_password": "a brand new password"}),
    Route("GET", "/api/account", customer(), 200),
    Route("PUT", "/api/account/user-type", console("billing:write"), 200, body=lambda _w: {"user_type": "individual"}),
    # members
    Route("GET", "/api/account/members", console(), 200),
    Route("POST", "/api/account/members", console("members:write"), 201,
          body=lambda _w: {"email": _email(), "name": "M", "password": PASSWORD, "role": "viewer"}),
    Route("PUT", "/api/account/members/{member_id}/role", console("members:write"), 200, "member",
          body=lambda _w: {"role": "developer"}, mutates=True),
    Route("DELETE", "/api/account/members/{member_id}", console("members:write"), 204, "member", mutates=True),
    # API keys
    Route("POST", "/api/api-keys", console("keys:write"), 201, body=lambda _w: {"name": "made by the matrix"}),
    Route("GET", "/api/api-keys", console(), 200),
    *(
        Route(method, template, KEYS_WRITE, ok, target, body=body, mutates=True)
        for method, template, ok, body in KEY_ROUTES
        for target in ("key", "own_key")
    ),
    Route("GET", "/api/audit-log", console("audit:read"), 200),
    # the operator
    Route("PUT", "/api/admin/accounts/{account_id}/roles", Access("operator"), 200, "account",
          body=lambda _w: {"roles": ["owner"]}),
    Route("POST", ADMIN_PATH, Access("operator"), 201, body=lambda _w: {"name": "matrix", "scopes": ["usage:write"]}),
    Route("GET", ADMIN_PATH, Access("operator"), 200),
    Route("DELETE", ADMIN_PATH + "/{token_id}", Access("operator"), 204, "service_token", mutates=True),
    # billing
    Route("GET", "/api/billing/plans", PUBLIC, 200),
    Route("GET", "/api/billing/packages", PUBLIC, 200),
    Route("GET", "/api/billing/subscription", customer("billing:read"), 200),
    Route("GET", "/api/billing/orders", BILLING_READ, 200),
    Route("GET", "/api/billing/orders/{order_id}", BILLING_READ, 200, "order"),
    Route("GET", "/api/billing/orders/{order_id}/invoice", BILLING_READ, 200, "paid_order"),
    Route("POST", "/api/billing/orders", BILLING_WRITE, 201, body=lambda _w: PACKAGE),
    Route("POST", "/api/billing/orders/{order_id}/pay", BILLING_WRITE, 200, "order", mutates=True),
    Route("POST", "/api/billing/subscription/switch", BILLING_WRITE, 200, body=lambda _w: {"plan": "professional"}),
    # quota
    Route("GET", "/api/billing/check-quota", customer("quota:read"), 200),
    Route("GET", "/api/ai/usage/quota", customer("quota:read"), 200),
    Route("POST", "/api/quota/reservations", Access("service", "usage:write"), 201,
          body=lambda w: {"account_id": w.account_id, "resource": "ai_tokens", "amount": 1, "ttl_seconds": 60}),
    Route("DELETE", "/api/quota/reservations/{reservation_id}", Access("service", "usage:write"), 204, "reservation",
          mutates=True),
    # metering
    Route("POST", "/api/usage/events", Access("service", "usage:write"), 202, body=_usage),
    Route("GET", "/api/ai/usage/overview", customer("usage:read"), 200),
    Route("GET", "/api/ai/usage/trend", customer("usage:read"), 200),
    Route("GET", "/api/ai/usage/by-provider", customer("usage:read"), 200),
    Route("GET", "/api/ai/usage/by-key", customer("usage:read"), 200),
    Route("GET", "/api/activity-log", customer("activity:read"), 200),
    # alerts
    Route("POST", "/api/ai/usage/alert", customer("alerts:write"), 201, body=lambda _w: RULE),
    Route("GET", "/api/ai/usage/alert", customer("alerts:read"), 200),
    Route("DELETE", "/api/ai/usage/alert/{rule_id}", customer("alerts:write"), 204, "rule", mutates=True),
    Route("GET", "/api/ai/usage/alert/{rule_id}/deliveries", customer("alerts:read"), 200, "rule"),
    Route("GET", "/api/notifications", customer("alerts:read"), 200),
    Route("POST", "/api/notifications/{notification_id}/read", customer("alerts:read"), 200, "notification"),
    # GEO projects
    Route("GET", "/api/geo/projects", customer("projects:read"), 200),
    Route("POST", "/api/geo/projects", customer("projects:write"), 201, body=lambda _w: {"name": "matrix project"}),
    Route("DELETE", "/api/geo/projects/{project_id}", customer("projects:write"), 204, "project", mutates=True),
    # protecting platform services (v3)
    Route("POST", "/api/edge/verify", Access("service", "keys:verify"), 200,
          body=lambda w: {"key": w.keys["owner"], "method": "GET", "path": "/v1/things", "ip": "203.0.113.7"}),
    Route("GET", "/api/edge/authorize", Access("ingress", "keys:verify"), 200),
    *(Route(m, "/api/edge/authorize/{forwarded}", Access("ingress", "keys:verify"), 200, "forwarded") for m in ENVOY_METHODS),
)  # fmt: skip


def expected(route: Route, caller: Caller) -> tuple[int, str | None]:
    """The contract's answer to `caller` on `route` (tests/support/permission_contract.py)."""
    others_key = route.target == "key"  # the owner's: another user's for every caller but the owner
    return answer(route.access, caller, route.ok, others_key=others_key, names_object=route.target is not None)


def cells(route: Route) -> list[Caller]:
    """The callers a route is walked with: every caller; another account's (or token's) too where
    the path names an object. The own-key variant only with the callers that have a user."""
    callers = [c for c in CALLERS if route.target != "own_key" or c.role is not None]
    callers += [c for c in DEAD_CALLERS if route.target != "own_key"]
    if route.target in {"key", "member", "order", "paid_order", "rule", "notification", "project"}:
        callers += [c for c in STRANGERS if c.kind != "service"]
    if route.target == "reservation":
        callers += [c for c in STRANGERS if c.kind == "service"]
    return callers


# ---- the account and its objects ---------------------------------------------------------------
@dataclass
class World:
    client: httpx.AsyncClient
    settings: Settings
    account_id: str = ""
    emails: dict[str, str] = field(default_factory=dict)  # role -> its user's e-mail
    sessions: dict[str, dict[str, str]] = field(default_factory=dict)  # role -> its user's session
    keys: dict[str, str] = field(default_factory=dict)  # role -> the key its user made (a credential)
    decoys: dict[str, str] = field(default_factory=dict)  # role -> another key of its user (a target)
    tokens: dict[str, str] = field(default_factory=dict)  # "usage:write", "keys:verify", "other"
    standing: dict[str, str] = field(default_factory=dict)  # target kind -> a standing object's id
    stranger_session: dict[str, str] = field(default_factory=dict)
    stranger_key: str = ""
    dead: dict[str, str] = field(default_factory=dict)  # Caller.dead -> the token that died

    async def made(self, method: str, path: str, headers: dict[str, str], body: Any = None, status: int = 201) -> Any:
        response = await self.client.request(method, path, json=body, headers=headers)
        assert response.status_code == status, (method, path, response.text)
        return response.json() if response.content else None

    async def login(self, email: str) -> dict[str, str]:
        return bearer(
            (await self.made("POST", "/api/auth/login", {}, {"email": email, "password": PASSWORD}, 200))["access_token"]
        )

    async def add_member(self, role: str) -> dict[str, Any]:
        body = {"email": _email(), "name": f"A {role}", "password": PASSWORD, "role": role}
        return dict(await self.made("POST", "/api/account/members", self.sessions["owner"], body))

    async def new_key(self, role: str) -> dict[str, Any]:
        return dict(await self.made("POST", "/api/api-keys", self.sessions[role], {"name": f"{role}'s key"}))

    async def service_token(self, scopes: list[str]) -> dict[str, Any]:
        return dict(await self.made("POST", ADMIN_PATH, admin_headers(self.settings), {"name": "matrix", "scopes": scopes}))

    async def new_order(self, pay: bool = False) -> str:
        order = await self.made("POST", "/api/billing/orders", self.sessions["owner"], PACKAGE)
        if pay:
            await self.made("POST", f"/api/billing/orders/{order['id']}/pay", self.sessions["owner"], status=200)
        return str(order["id"])

    async def new_reservation(self) -> str:
        body = {"account_id": self.account_id, "resource": "ai_tokens", "amount": 1, "ttl_seconds": 600}
        return str((await self.made("POST", "/api/quota/reservations", bearer(self.tokens["usage:write"]), body))["id"])

    async def fresh(self, target: str, role: str | None) -> str:
        """A new object of `target`'s kind for a cell the contract allows (it changes or ends it)."""
        if target == "key":
            return str((await self.new_key("owner"))["id"])
        if target == "own_key":
            assert role is not None
            return str((await self.new_key(role))["id"])
        if target == "member":
            return str((await self.add_member("viewer"))["id"])
        if target == "order":
            return await self.new_order()
        if target == "rule":
            return str((await self.made("POST", "/api/ai/usage/alert", self.sessions["owner"], RULE))["id"])
        if target == "project":
            return str((await self.made("POST", "/api/geo/projects", self.sessions["owner"], {"name": "p"}))["id"])
        if target == "reservation":
            return await self.new_reservation()
        if target == "service_token":
            return str((await self.service_token(["usage:write"]))["id"])
        raise AssertionError(f"no fresh {target}")

    def target_id(self, target: str, role: str | None) -> str:
        """The standing object a refused cell aims at (a decoy: it must stay untouched)."""
        if target == "key":
            return self.decoys["owner"]
        if target == "own_key":
            assert role is not None
            return self.decoys[role]
        if target == "account":
            return self.account_id
        if target == "forwarded":
            return FORWARDED
        return self.standing[target]

    def credential(self, caller: Caller) -> str | None:
        """The caller's token (None: it sends none)."""
        if caller.kind == "none":
            return None
        if caller.dead:
            return self.dead[caller.dead]
        if caller.kind == "admin":
            assert self.settings.admin_token is not None
            return self.settings.admin_token.get_secret_value()
        if caller.kind == "service":
            return self.tokens[
                "other" if caller.stranger else ("usage:write" if "usage:write" in caller.scopes else "keys:verify")
            ]
        assert caller.role is not None
        if caller.kind == "key":
            return self.stranger_key if caller.stranger else self.keys[caller.role]
        session = self.stranger_session if caller.stranger else self.sessions[caller.role]
        return session["Authorization"].split(" ", 1)[1]


async def _setup(client: httpx.AsyncClient, settings: Settings) -> World:
    world = World(client, settings)
    owner = await new_account(client)
    world.account_id, world.emails["owner"], world.sessions["owner"] = owner.id, owner.email, owner.headers
    # professional: room in the rate limits for every key's walk (free allows 20 calls at once)
    upgrade = await world.made("POST", "/api/billing/orders", owner.headers, {"kind": "plan_upgrade", "plan": "professional"})
    await world.made("POST", f"/api/billing/orders/{upgrade['id']}/pay", owner.headers, status=200)
    user_ids: dict[str, str] = {}
    for role in ("developer", "billing", "viewer"):  # each makes its keys as a developer, then gets its role
        member = await world.add_member("developer")
        user_ids[role], world.emails[role] = member["id"], member["email"]
        world.sessions[role] = await world.login(member["email"])
    for role in ROLES:
        world.keys[role] = (await world.new_key(role))["key"]
        world.decoys[role] = (await world.new_key(role))["id"]
    for role in ("billing", "viewer"):
        await world.made("PUT", f"/api/account/members/{user_ids[role]}/role", owner.headers, {"role": role}, 200)
    for name, scopes in (("usage:write", ["usage:write"]), ("keys:verify", ["keys:verify"]), ("other", ["usage:write"])):
        world.tokens[name] = (await world.service_token(scopes))["token"]
    world.standing["member"] = (await world.add_member("viewer"))["id"]
    world.standing["order"] = await world.new_order()
    world.standing["paid_order"] = await world.new_order(pay=True)
    world.standing["project"] = (await world.made("POST", "/api/geo/projects", owner.headers, {"name": "standing"}))["id"]
    world.standing["reservation"] = await world.new_reservation()
    world.standing["service_token"] = (await world.service_token(["usage:write"]))["id"]
    # a notification: a rule at 1% of the tokens, crossed by usage reported once quota counts professional's total
    rule = {"metric": "total_tokens", "threshold_pct": 1, "channels": ["in_site"], "recipients": []}
    world.standing["rule"] = (await world.made("POST", "/api/ai/usage/alert", owner.headers, rule))["id"]

    async def professional_totals() -> bool:
        report = (await client.get("/api/billing/check-quota", headers=owner.headers)).json()
        return any(i["resource"] == "ai_tokens" and i["total"] >= 10_000_000 for i in report["items"])

    await eventually(professional_totals, what="quota counting the professional plan")
    usage = _usage(world)
    usage["events"][0].update(quantity=200_000, input_tokens=200_000)
    await world.made("POST", "/api/usage/events", bearer(world.tokens["usage:write"]), usage, 202)

    async def notification() -> str | None:
        items = (await client.get("/api/notifications", headers=owner.headers)).json()["items"]
        return str(items[0]["id"]) if items else None

    world.standing["notification"] = await eventually(notification, what="the 1% rule's notification")
    # the owner's key disabled, another deleted, a session logged out, a token of every scope revoked
    disabled, deleted = await world.new_key("owner"), await world.new_key("owner")
    await world.made("POST", f"/api/api-keys/{disabled['id']}/toggle", owner.headers, status=200)
    await world.made("DELETE", f"/api/api-keys/{deleted['id']}", owner.headers, status=204)
    logged_out = await world.login(owner.email)
    await world.made("POST", "/api/auth/logout", logged_out, status=204)
    revoked = await world.service_token(["usage:write", "keys:verify"])
    await world.made("DELETE", f"{ADMIN_PATH}/{revoked['id']}", admin_headers(settings), status=204)
    removed = await world.add_member("developer")
    removed_session = await world.login(removed["email"])
    removed_key = await world.made("POST", "/api/api-keys", removed_session, {"name": "a removed developer's key"})
    await world.made("DELETE", f"/api/account/members/{removed['id']}", owner.headers, status=204)
    world.dead = {
        "removed_key": removed_key["key"],
        "removed_session": removed_session["Authorization"].split(" ", 1)[1],
        "disabled": disabled["key"],
        "deleted": deleted["key"],
        "logged_out": logged_out["Authorization"].split(" ", 1)[1],
        "revoked": revoked["token"],
    }
    stranger = await new_account(client)
    world.stranger_session = stranger.headers
    world.stranger_key = (await world.made("POST", "/api/api-keys", stranger.headers, {"name": "stranger's key"}))["key"]
    return world


@pytest.fixture
def settings(module_settings):
    return module_settings


@pytest.fixture
def app_client(module_app_client):
    return module_app_client


@pytest.fixture(scope="module")
async def world(module_app_client, module_settings) -> World:
    return await _setup(module_app_client[1], module_settings)


# ---- the walk ----------------------------------------------------------------------------------
async def _headers(world: World, route: Route, caller: Caller, allowed: bool) -> dict[str, str]:
    """The caller's credential where the route reads it. An allowed call that ends its session or
    its user's sessions gets a session of its own (a fresh login, or a fresh user of the role)."""
    token = world.credential(caller)
    if allowed and route.ends_caller and caller.kind == "session" and caller.role is not None:
        user = world.emails[caller.role] if route.ends_caller == "session" else (await world.add_member(caller.role))["email"]
        token = (await world.login(user))["Authorization"].split(" ", 1)[1]
    if route.access.kind == "ingress":  # the caller's key in Authorization, the ingress's token beside it
        ingress = {"Authorization": f"Bearer {world.keys['owner']}"}
        if route.target is None:
            ingress |= {"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/" + FORWARDED}
        return ingress | ({"X-Tollgate-Service-Token": token} if token is not None else {})
    return bearer(token) if token is not None else {}


async def _answer(world: World, route: Route, caller: Caller) -> tuple[int, str | None, str]:
    status, _ = expected(route, caller)
    allowed = status == route.ok
    path = route.template
    if route.target is not None:
        fresh = allowed and route.mutates
        ident = await world.fresh(route.target, caller.role) if fresh else world.target_id(route.target, caller.role)
        path = path.replace(path[path.index("{") : path.index("}") + 1], ident)
    headers = await _headers(world, route, caller, allowed)
    response = await world.client.request(route.method, path, json=route.body(world), headers=headers)
    code = None
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["request_id"] == response.headers["X-Request-ID"], response.text
        code = error["code"]
    return response.status_code, code, response.text[:300]


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
async def test_every_caller_gets_the_contracts_answer(world: World, route: Route) -> None:
    wrong = []
    for caller in cells(route):
        want = expected(route, caller)
        status, code, text = await _answer(world, route, caller)
        if (status, code) != want:
            wrong.append(f"{caller.name}: expected {want}, got ({status}, {code!r}) {text}")
    assert not wrong, f"{route.name}:\n" + "\n".join(wrong)


async def test_the_matrix_covers_every_route(module_app_client) -> None:
    app = module_app_client[0]
    served = {(method.upper(), path) for path, ops in app.openapi()["paths"].items() for method in ops}
    assert served == {(r.method, r.template) for r in ROUTES}, "a new route: give it its row in ROUTES"


async def test_verify_and_authorize_judge_each_roles_permissions(world: World) -> None:
    """(v3) `permission` (verify) and `X-Tollgate-Permission` (authorize) "must be one of the key's
    user's permissions (else permission_denied)": each role's key x each permission, judged by its
    user's current role (the billing and viewer keys were made by developers)."""
    verifier = world.tokens["keys:verify"]
    wrong = []
    for role, key in world.keys.items():
        for permission in sorted(READS | WRITES):
            want = ("valid", 200) if permission in ROLES[role] else ("permission_denied", 403)
            body = {"key": key, "method": "GET", "path": "/v1/things", "ip": "203.0.113.7", "permission": permission}
            verdict = (await world.client.post("/api/edge/verify", json=body, headers=bearer(verifier))).json()
            ingress = {
                "X-Tollgate-Service-Token": verifier,
                "Authorization": f"Bearer {key}",
                "X-Forwarded-Method": "GET",
                "X-Forwarded-Uri": "/v1/things",
                "X-Tollgate-Permission": permission,
            }
            authorized = await world.client.get("/api/edge/authorize", headers=ingress)
            got = (verdict["code"], verdict["status"], authorized.status_code)
            if got != (*want, want[1]) or (verdict["role"], authorized.headers.get("X-Tollgate-Role", role)) != (role, role):
                wrong.append(f"{role} key, {permission}: expected {want}, got {got}, role {verdict['role']}")
    assert not wrong, "\n".join(wrong)


async def test_refused_cells_changed_nothing(world: World) -> None:
    """Every refused cell aimed at a standing decoy: each is as it was made."""
    owner, client = world.sessions["owner"], world.client
    keys = {k["id"]: k for k in (await client.get("/api/api-keys", headers=owner)).json()["items"]}
    for role, decoy in world.decoys.items():
        assert keys[decoy]["status"] == "enabled" and keys[decoy]["name"] == f"{role}'s key", keys.get(decoy)
    members = {m["id"]: m for m in (await client.get("/api/account/members", headers=owner)).json()["items"]}
    assert members[world.standing["member"]]["role"] == "viewer"
    order = await world.made("GET", f"/api/billing/orders/{world.standing['order']}", owner, status=200)
    assert order["status"] == "pending"
    rules = (await client.get("/api/ai/usage/alert", headers=owner)).json()["rules"]
    assert world.standing["rule"] in {r["id"] for r in rules}
    projects = (await client.get("/api/geo/projects", headers=owner)).json()["items"]
    assert world.standing["project"] in {p["id"] for p in projects}
    tokens = (await client.get(ADMIN_PATH, headers=admin_headers(world.settings))).json()["items"]
    assert next(t for t in tokens if t["id"] == world.standing["service_token"])["revoked_at"] is None
    released = await client.delete(
        f"/api/quota/reservations/{world.standing['reservation']}", headers=bearer(world.tokens["usage:write"])
    )
    assert released.status_code == 204, released.text  # still open: no one else released it
    for role, key in world.keys.items():  # every credential still works (none was refused, disabled, deleted)
        assert (await client.get("/api/account", headers=bearer(key))).json()["role"] == role
