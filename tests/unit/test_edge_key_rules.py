"""(v4) A key's own restrictions where the edge decides, with no I/O: the pure gate
(services/edge/key_rules.py), the rate limit judged per subject (the key's own, narrower limit
beside its account's), and the product's own app driven through ASGI (a route and verify's
decision), as tests/unit/test_edge_screen.py does."""

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from contracts.common import Role
from contracts.credentials import hash_secret
from contracts.events import KeyState
from contracts.key_limits import KeyRules
from contracts.rate_limit import RateLimit
from services.edge.edge import Edge
from services.edge.key_rules import KeyGate, narrower
from services.edge.rate_limit import Limits, evaluate
from services.edge.verdict import ServiceCall, Verdict
from services.runtime.host.app import create_app
from services.runtime.platform.settings import Settings
from tests.unit.test_edge_screen import ROUTE, call, logged_calls

NARROW = "sk-" + "n" * 43


@pytest.fixture
def app() -> Any:
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@127.0.0.1:1/d", session_secret="s")
    app = create_app(("geo",), settings, consumers=False)
    app.state.runtime.edge.assume_caught_up()  # fed by hand (narrow_key)
    return app


def gate(**rules: Any) -> KeyGate:
    made = KeyGate.of(KeyRules.model_validate(rules))
    assert made is not None
    return made


def code(refusal: tuple[Any, str] | None) -> str | None:
    return None if refusal is None else refusal[0].value


def test_a_key_without_restrictions_has_no_gate():
    assert KeyGate.of(KeyRules()) is None
    # limits are quota's to count, not a per-call restriction of the edge's
    assert KeyGate.of(KeyRules.model_validate({"limits": [{"resource": "ai_tokens", "amount": 5, "period": "day"}]})) is None


@pytest.mark.parametrize(
    ("ip", "allowed"),
    [
        ("198.51.100.7", True),
        ("198.51.100.255", True),
        ("198.51.101.1", False),
        ("::ffff:198.51.100.9", True),  # an IPv4 address on a dual-stack socket
        ("2001:db8::42", True),
        ("2001:db9::1", False),
        ("testclient", False),  # no address at all: not an allowed one
        ("", False),
    ],
)
def test_addresses_in_the_allowed_networks_pass_ipv4_and_ipv6(ip: str, allowed: bool):
    g = gate(allowed_ips=["198.51.100.0/24", "2001:db8::/32"])
    assert code(g.refusal(ip, "GET", "/x", None, judges_model=False)) == (None if allowed else "ip_not_allowed")


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("POST", "/v1/chat/completions", True),
        ("POST", "/v1/chat/", True),
        ("POST", "/v1/chat", False),  # the prefix is `/v1/chat/`
        ("GET", "/v1/chat/completions", False),  # another method
        ("GET", "/v1/models", True),
        ("GET", "/v1/models/gpt", False),  # exact
        ("POST", "/v1/chat/../admin", False),  # a dot segment never matches a prefix
        ("POST", "/v1/chat/%2e%2e/admin", False),
        ("POST", "/v1/chat/v1.2/a.b.", True),  # dots inside names are no dot segments
        ("POST", "/v1/chat/100%25", True),  # a literal percent, decoded to a fixed point
    ],
)
def test_routes_match_exactly_or_by_their_prefix(method: str, path: str, allowed: bool):
    g = gate(allowed_routes=["POST /v1/chat/*", "GET /v1/models"])
    assert code(g.refusal("1.2.3.4", method, path, None, judges_model=False)) == (None if allowed else "route_not_allowed")


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/..;/admin",  # Tomcat, Jetty: `..;` is `..` with an (empty) path parameter
        "/v1/chat/.;x=1/admin",
        "/v1/chat/x%2F..%2F..%2Fadmin",  # encoded slashes, which a decoding upstream resolves
        "/v1/chat/x%2f..%2f..%2fadmin",
        "/v1/chat/..%5Cadmin",  # a backslash, a separator to IIS and to some proxies
        "/v1/chat/..\\admin",
        # (review) what an upstream that decodes twice, trims, truncates or folds resolves out of it
        "/v1/chat/%252e%252e/admin",  # decoded twice (a proxy, then the framework)
        "/v1/chat/x%252F..%252F..%252Fadmin",
        "/v1/chat/%25252525252e%25252525252e/admin",  # more layers than any upstream decodes
        "/v1/chat/..%00/admin",  # C: the segment ends at the NUL
        "/v1/chat/%EF%BC%8E%EF%BC%8E/admin",  # fullwidth full stops, `..` once NFKC-folded
        "/v1/chat/%E2%80%A5/admin",  # U+2025 TWO DOT LEADER, `..` once folded
        "/v1/chat/.../admin",  # Windows trims trailing dots and spaces
        "/v1/chat/..%20/admin",
    ],
)
def test_a_prefix_never_matches_a_path_that_an_upstream_may_resolve_out_of_it(path: str):
    g = gate(allowed_routes=["POST /v1/chat/*"])
    assert code(g.refusal("1.2.3.4", "POST", path, None, judges_model=False)) == "route_not_allowed"


def test_models_by_name_or_provider_and_a_call_without_a_model_fails_closed():
    g = gate(allowed_models=["openai/gpt-4o-mini", "anthropic/*"])
    judged = {m: code(g.refusal("1.2.3.4", "POST", "/v1", m, judges_model=True)) for m in
              ("openai/gpt-4o-mini", "anthropic/claude-3-haiku", "openai/gpt-4o", "mistral/large", None, "",
               "anthropic", "anthropic/")}  # fmt: skip
    assert judged == {
        "openai/gpt-4o-mini": None,
        "anthropic/claude-3-haiku": None,
        "openai/gpt-4o": "model_not_allowed",
        "mistral/large": "model_not_allowed",
        None: "model_not_allowed",
        "": "model_not_allowed",
        # `provider/*` allows the provider's models, not a bare provider: as metering judges it
        "anthropic": "model_not_allowed",
        "anthropic/": "model_not_allowed",
    }
    # Tollgate's own routes call no model: not judged by it
    assert g.refusal("1.2.3.4", "GET", "/api/account", None, judges_model=False) is None


def test_the_order_is_address_then_route_then_model():
    g = gate(allowed_ips=["10.0.0.0/8"], allowed_routes=["GET /a"], allowed_models=["p/m"])
    assert code(g.refusal("192.0.2.1", "POST", "/b", "q/n", judges_model=True)) == "ip_not_allowed"
    assert code(g.refusal("10.1.1.1", "POST", "/b", "q/n", judges_model=True)) == "route_not_allowed"
    assert code(g.refusal("10.1.1.1", "GET", "/a", "q/n", judges_model=True)) == "model_not_allowed"
    assert g.refusal("10.1.1.1", "GET", "/a", "p/m", judges_model=True) is None


def test_the_narrower_of_the_keys_and_the_plans_rate_limit_wins_number_by_number():
    plan = RateLimit(per_second=5, burst=20, per_minute=120)
    assert narrower(plan, None) == plan
    own = RateLimit(per_second=10, burst=2, per_minute=600)  # the plan shrank below part of it since
    assert narrower(plan, own) == RateLimit(per_second=5, burst=2, per_minute=120)


def test_each_subject_is_judged_by_its_own_limits_and_the_headers_name_the_binding_one():
    account, key = Limits(5.0, 20, 120), Limits(0.001, 2, 60)
    slots: list[Any] = [None, None]
    now = 1_000_000.0
    answers = []
    for _ in range(3):
        decision, after = evaluate(slots, (account, key), now)
        answers.append((decision.allowed, decision.limit, decision.remaining))
        if after is not None:
            slots = list(after)
    # the key's burst of 2 binds: its headers say so (Limit 2), and the third call is refused
    assert answers == [(True, 2, 1), (True, 2, 0), (False, 2, 0)]
    # the account's bucket kept the 18 tokens the key could not spend
    assert slots[0].tokens == 18.0


def narrow_key(edge: Edge, secret: str = NARROW, account_id: uuid.UUID | None = None, **rules: Any) -> uuid.UUID:
    key_id = uuid.uuid4()
    edge.keys.apply(
        KeyState(
            time=datetime.now(UTC), account_id=account_id or uuid.uuid4(), key_id=key_id, hash=hash_secret(secret),
            status="enabled", roles=[Role.OWNER], **rules,
        )
    )  # fmt: skip
    return key_id


def rate_limited(verdict: Verdict) -> tuple[int, str | None, str | None]:
    """A verdict's status, refusal code and X-RateLimit-Remaining."""
    return verdict.status, verdict.refusal.code.value if verdict.refusal else None, verdict.headers.get("X-RateLimit-Remaining")


@pytest.mark.parametrize(
    ("rules", "inside", "code_"),
    [
        # the test client is 127.0.0.1; `inside`: a call of the key within its rules (verify's)
        ({"allowed_ips": ["198.51.100.0/24"]}, ("GET", ROUTE, "198.51.100.7"), "ip_not_allowed"),
        ({"allowed_routes": ["GET /api/other/*"]}, ("GET", "/api/other/x", "127.0.0.1"), "route_not_allowed"),
    ],
)
async def test_a_protected_route_refuses_a_call_outside_the_keys_rules_logged_and_never_counted(
    app: Any, rules: dict[str, Any], inside: tuple[str, str, str], code_: str
) -> None:
    edge: Edge = app.state.runtime.edge
    key_id = narrow_key(edge, rate_limit={"per_second": 0.001, "burst": 2, "per_minute": 100}, **rules)
    # the dependency's: its headers from a peek, which takes nothing (the key's burst of 2 stays whole)
    answers = [await call(app, NARROW) for _ in range(3)]
    for answer in answers:
        assert (answer.status, answer.body["error"]["code"]) == (403, code_)
    assert [(a.routed, a.headers["x-ratelimit-remaining"]) for a in answers] == [(True, "2")] * 3
    # the key's calls within its rules spend its limit; then, while the limiter's copy refuses the
    # key, the screen's answer: the 403 still (the key's rules come first), before routing
    within = ServiceCall(NARROW, *inside, "t", "gw")
    assert [rate_limited(await edge.decide(within, "r")) for _ in range(2)] == [(200, None, "1"), (200, None, "0")]
    screened = await call(app, NARROW)
    assert (screened.routed, screened.status, screened.body["error"]["code"]) == (False, 403, code_)
    assert screened.headers["x-ratelimit-remaining"] == "0" and "retry-after" not in screened.headers
    assert [c for c in logged_calls(app) if c[2] == 403] == [("GET", ROUTE, 403, code_, "test/1")] * 4
    assert edge.quota.pending_calls(edge.keys.by_id(key_id).account_id) == 2  # type: ignore[union-attr]  # the 200s only
    # counted by quota: tests/integration/test_key_ips_behind_proxies.py and test_edge_verify.py count api_calls


async def test_a_route_inside_the_keys_rules_goes_on_and_its_model_is_not_judged(app: Any) -> None:
    edge: Edge = app.state.runtime.edge
    narrow_key(edge, allowed_ips=["127.0.0.0/8"], allowed_routes=[f"GET {ROUTE}"], allowed_models=["openai/gpt-4o-mini"])
    answer = await call(app, NARROW)
    assert answer.routed and answer.status == 503  # its handler's: no Postgres here


@pytest.mark.parametrize(
    ("model", "code_"),
    [("openai/gpt-4o-mini", "valid"), ("openai/gpt-4o", "model_not_allowed"), (None, "model_not_allowed")],
)
async def test_verify_judges_the_model_the_service_will_call(app: Any, model: str | None, code_: str) -> None:
    edge: Edge = app.state.runtime.edge
    narrow_key(edge, allowed_ips=["203.0.113.0/24"], allowed_models=["openai/gpt-4o-mini"])
    call_ = ServiceCall(NARROW, "POST", "/v1/chat", "203.0.113.7", "t/1", "ai-gateway", model=model)
    verdict = await edge.decide(call_, "req-1")
    assert ("valid" if verdict.refusal is None else verdict.refusal.code.value) == code_
    elsewhere = await edge.decide(ServiceCall(NARROW, "POST", "/v1/chat", "192.0.2.1", "t/1", "gw", model=model), "r")
    assert elsewhere.refusal is not None and elsewhere.refusal.code.value == "ip_not_allowed"  # the address first


async def test_a_keys_own_rate_limit_binds_with_truthful_headers(app: Any) -> None:
    edge: Edge = app.state.runtime.edge
    narrow_key(edge, rate_limit={"per_second": 0.001, "burst": 2, "per_minute": 100})
    verdicts = [await edge.decide(ServiceCall(NARROW, "GET", "/v1/x", "203.0.113.7", "t", "gw"), "r") for _ in range(3)]
    assert [v.status for v in verdicts] == [200, 200, 429]
    assert [v.headers["X-RateLimit-Limit"] for v in verdicts] == ["2", "2", "2"]  # the key's burst binds, not the plan's 20
    assert verdicts[-1].headers["X-RateLimit-Remaining"] == "0" and int(verdicts[-1].headers["Retry-After"]) >= 1


async def test_a_rotated_key_is_judged_where_its_lineage_stands(app: Any) -> None:
    """(v4) A key made by rotation (keys.v1 `lineage_id`: its predecessor's) shares its predecessor's
    standing and this process's admissions: a `once` api_calls limit spent by the old key refuses
    the new one (scope api_key), and the new key's `usage` shows the spent amount."""
    edge: Edge = app.state.runtime.edge
    limits = [{"resource": "api_calls", "amount": 2, "period": "once"}]
    old = narrow_key(edge, limits=limits)
    account = edge.keys.by_id(old).account_id  # type: ignore[union-attr]
    verdicts = [await edge.decide(ServiceCall(NARROW, "GET", "/v1/x", "203.0.113.7", "t", "gw"), "r") for _ in range(3)]
    assert [v.status for v in verdicts] == [200, 200, 403]
    new_secret = "sk-" + "r" * 43
    new = uuid.uuid4()
    edge.keys.apply(
        KeyState(
            time=datetime.now(UTC), account_id=account, key_id=new, hash=hash_secret(new_secret),
            status="enabled", roles=[Role.OWNER], limits=limits, lineage_id=old,
        )
    )  # fmt: skip
    refused = await edge.decide(ServiceCall(new_secret, "GET", "/v1/x", "203.0.113.7", "t", "gw"), "r")
    assert refused.status == 403 and refused.refusal is not None
    assert (refused.refusal.code.value, refused.refusal.details["scope"]) == ("insufficient_quota", "api_key")
    usage = edge.key_usage(new, datetime.now(UTC))
    assert [(u.used, u.remaining) for u in usage] == [(2, 0)]


async def test_a_refusal_by_the_keys_rules_still_carries_the_rate_limit_headers(app: Any) -> None:
    """API.md: every API-key response carries X-RateLimit-*, a 403 of the key's own rules too
    (judged before the limiter, which is then peeked at for them: the call takes nothing)."""
    narrow_key(app.state.runtime.edge, allowed_ips=["198.51.100.0/24"])  # the test client is 127.0.0.1
    answer = await call(app, NARROW)
    assert answer.status == 403 and {"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"} <= set(answer.headers)
    # the plan's (free: burst 20), whole: this call took no token; no Retry-After: waiting would not admit it
    limits = (answer.headers["x-ratelimit-limit"], answer.headers["x-ratelimit-remaining"], answer.headers["x-ratelimit-reset"])
    assert limits == ("20", "20", "0")
    assert "retry-after" not in answer.headers


@pytest.mark.parametrize(
    ("rules", "where", "code_"),
    [
        ({"allowed_ips": ["198.51.100.0/24"]}, {}, "ip_not_allowed"),
        ({"allowed_routes": ["GET /v1/models"]}, {}, "route_not_allowed"),
        ({"allowed_models": ["openai/gpt-4o-mini"]}, {"model": "openai/gpt-4o"}, "model_not_allowed"),
        ({"allowed_models": ["openai/gpt-4o-mini"]}, {}, "model_not_allowed"),  # none named: fail closed
    ],
)
async def test_verify_answers_a_refusal_by_the_keys_rules_with_the_limiters_headers_and_admits_nothing(
    app: Any, rules: dict[str, Any], where: dict[str, Any], code_: str
) -> None:
    """verify's and authorize's decision (`Edge.decide`, their routes' and their fast path's): the
    key's 403 comes before the rate limit, even for a key the limiter refuses (API.md, "Per-key
    limits and restrictions": address, route, then the rate limits), and carries X-RateLimit-*
    (verify's `rate_limit`) but no Retry-After; no refusal takes a token or an api_call."""
    edge: Edge = app.state.runtime.edge
    key_id = narrow_key(edge, rate_limit={"per_second": 0.001, "burst": 2, "per_minute": 100}, **rules)
    refused = ServiceCall(NARROW, "POST", "/v1/chat", "192.0.2.1", "t", "gw", **where)
    verdicts = [await edge.decide(refused, "r") for _ in range(3)]
    assert [rate_limited(v) for v in verdicts] == [(403, code_, "2")] * 3  # the key's burst of 2, whole
    assert all(v.headers["X-RateLimit-Limit"] == "2" and "Retry-After" not in v.headers for v in verdicts)
    assert edge.quota.pending_calls(edge.keys.by_id(key_id).account_id) == 0  # type: ignore[union-attr]
    # nothing was taken: the calls within the rules have the whole burst; then over it, still the 403
    allowed = ServiceCall(NARROW, "GET", "/v1/models", "198.51.100.7", "t", "gw", model="openai/gpt-4o-mini")
    assert [rate_limited(await edge.decide(allowed, "r")) for _ in range(3)] == [
        (200, None, "1"),
        (200, None, "0"),
        (429, "rate_limited", "0"),
    ]
    assert rate_limited(await edge.decide(refused, "r")) == (403, code_, "0")


async def test_a_flood_of_calls_outside_a_keys_rules_leaves_every_rate_limit_as_it_was(app: Any) -> None:
    """A key used outside its rules (a leaked key, from elsewhere) is inert there: its refusals,
    however many (past the key's burst and the account's), take nothing from the key's limits or
    from its account's, so the account's other keys and the key's own callers are not 429ed."""
    edge: Edge = app.state.runtime.edge
    account_id, other = uuid.uuid4(), "sk-" + "o" * 43
    narrow_key(
        edge,
        account_id=account_id,
        allowed_ips=["198.51.100.0/24"],
        rate_limit={"per_second": 0.01, "burst": 5, "per_minute": 100},
    )
    narrow_key(edge, other, account_id=account_id)  # no rules: the plan's (free: burst 20)
    outside = ServiceCall(NARROW, "POST", "/v1/chat", "192.0.2.1", "t", "gw")
    verdicts, routed = [await edge.decide(outside, "r") for _ in range(15)], [await call(app, NARROW) for _ in range(15)]
    assert {rate_limited(v) for v in verdicts} == {(403, "ip_not_allowed", "5")}  # the key's burst of 5, whole
    assert {(a.status, a.headers["x-ratelimit-remaining"]) for a in routed} == {(403, "5")}
    assert edge.quota.pending_calls(account_id) == 0
    # the account's whole burst for its other key, then the key's whole burst from its office
    assert rate_limited(await edge.decide(ServiceCall(other, "GET", "/v1/x", "192.0.2.1", "t", "gw"), "r")) == (200, None, "19")
    inside = await edge.decide(ServiceCall(NARROW, "POST", "/v1/chat", "198.51.100.7", "t", "gw"), "r")
    assert rate_limited(inside) == (200, None, "4") and inside.headers["X-RateLimit-Limit"] == "5"
