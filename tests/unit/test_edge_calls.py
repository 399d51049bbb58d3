"""The edge's request path and calls.v1 recorder without Kafka: what a call hands over, the
partition each account's calls go to (the lanes: tests/unit/test_edge_call_lanes.py)."""

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiokafka.partitioner import DefaultPartitioner
from prometheus_client import REGISTRY
from starlette.requests import Request

from contracts.common import Permission, Resource, Role
from contracts.credentials import hash_secret
from contracts.errors import ErrorCode
from contracts.events import AccountState, KeyState, QuotaState
from contracts.rate_limit import RateLimit
from services.edge.calls import Call, CallRecorder, PartitionMap
from services.edge.context import CALL_CONTEXT, CallContext
from services.edge.edge import Edge
from services.edge.errors import ApiError
from services.edge.principal import Principal
from services.runtime.platform.settings import Settings

SECRET = "sk-" + "x" * 40


def settings(**extra: Any) -> Settings:
    return Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@h/d", session_secret="s", **extra)


def dropped(reason: str) -> float:
    return REGISTRY.get_sample_value("tollgate_edge_call_events_dropped_total", {"reason": reason}) or 0.0


def test_partitions_are_the_ones_per_message_send_would_pick_and_follow_a_new_partition_count():
    partitions = PartitionMap()
    accounts = [uuid.uuid4() for _ in range(50)]
    partitions.set_partitions({0, 1, 2})
    assert [partitions.of(a) for a in accounts] == [DefaultPartitioner()(str(a).encode(), [0, 1, 2], [0, 1, 2]) for a in accounts]
    assert len({partitions.of(a) for a in accounts}) == 3
    partitions.set_partitions({0, 1, 2, 3, 4, 5})  # the topic grew: nothing memoised survives
    six = list(range(6))
    assert [partitions.of(a) for a in accounts] == [DefaultPartitioner()(str(a).encode(), six, six) for a in accounts]


def test_a_full_admitted_lane_refuses_a_reservation_and_drops_nothing_it_holds():
    # (v2) replaces the old drop-when-full: an admitted call's place is reserved before admission
    recorder = CallRecorder(settings(), max_buffer=3)
    call = Call(datetime.now(UTC), uuid.uuid4(), uuid.uuid4(), "GET", "/api/x", 200, "127.0.0.1", "ua", 1.0)
    before = dropped("buffer_full")
    assert [recorder.reserve() for _ in range(5)] == [True, True, True, False, False]
    for _ in range(3):
        recorder.record(call)
    assert len(recorder.lanes.take(10)) == 3 and dropped("buffer_full") == before


def _edge(**extra: Any) -> tuple[Edge, uuid.UUID, uuid.UUID]:
    edge = Edge(settings(**extra))
    edge.assume_caught_up()
    account, key = uuid.uuid4(), uuid.uuid4()
    state = KeyState(
        time=datetime.now(UTC), account_id=account, key_id=key, hash=hash_secret(SECRET), status="enabled", roles=[Role.OWNER]
    )
    edge.keys.apply(state)
    return edge, account, key


def _request(headers: dict[str, str], peer: str = "10.0.0.5") -> Request:
    scope = {
        "type": "http", "method": "GET", "path": "/api/geo/projects/42", "raw_path": b"/api/geo/projects/42",
        "query_string": b"", "root_path": "", "scheme": "http", "server": ("t", 80), "client": (peer, 5000),
        CALL_CONTEXT: CallContext("rid", 0.0),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }  # fmt: skip
    return Request(scope)


def _context(request: Request) -> CallContext:
    context: CallContext = request.scope[CALL_CONTEXT]
    return context


async def test_an_api_key_call_hands_over_its_event_and_headers_once_the_response_is_sent():
    edge, account, key = _edge(trusted_proxies=["10.0.0.0/8"])
    request = _request({"Authorization": f"Bearer {SECRET}", "User-Agent": "ua/1", "X-Forwarded-For": "198.51.100.7, 10.1.1.1"})

    class Route:
        path = "/api/geo/projects/{project_id}"

    request.scope["route"] = Route()
    principal = await edge.requires(Permission.PROJECTS_READ)(request)
    assert principal.account_id == account and principal.api_key_id == key
    context = _context(request)
    assert context.principal is principal
    assert context.response_headers is not None
    assert context.response_headers["X-RateLimit-Remaining"] == str(edge.plans.default.burst - 1)  # the tightest: the bucket
    assert edge.quota.pending_calls(account) == 1  # admitted, so counted
    assert len(edge.calls.lanes) == 0  # nothing yet: status and latency come with the response
    assert edge.calls.lanes.open == 1  # but its place is reserved
    context.finish(204, 0.0123)
    (call,) = edge.calls.lanes.take(10)
    assert call.admitted and call.error_code is None
    assert (call.account_id, call.api_key_id, call.method, call.path, call.status) == (account, key, "GET", Route.path, 204)
    assert (call.ip, call.user_agent, call.latency_ms) == ("198.51.100.7", "ua/1", 12.3)
    event = call.event()
    assert event.api_key_id == key and event.path == Route.path and event.ip == "198.51.100.7"


async def test_a_rate_limited_call_still_becomes_an_event_and_is_not_admitted_to_the_quota():
    edge, account, _key = _edge()
    edge.plans.default = RateLimit(per_second=0.001, burst=1, per_minute=100)
    dependency = edge.requires(Permission.PROJECTS_READ)
    await dependency(_request({"Authorization": f"Bearer {SECRET}"}))
    refused = _request({"Authorization": f"Bearer {SECRET}"})
    with pytest.raises(ApiError) as caught:
        await dependency(refused)
    assert caught.value.status == 429 and caught.value.code is ErrorCode.RATE_LIMITED
    context = _context(refused)
    assert context.response_headers is not None and context.response_headers["Retry-After"] == "1000"
    assert context.call is not None and not context.reserved  # the 429 is a call too (quota ignores it)
    assert edge.quota.pending_calls(account) == 1
    assert edge.calls.lanes.open == 1  # only the admitted call holds a place
    context.error_code = caught.value.code.value  # what the ApiError handler notes
    context.finish(429, 0.001)
    (call,) = list(edge.calls.lanes.refused)
    assert (call.status, call.error_code, call.admitted) == (429, "rate_limited", False)


async def test_console_sessions_record_no_call_and_consume_no_api_calls():
    edge, account, _key = _edge()
    edge.accounts.apply(AccountState(time=datetime.now(UTC), account_id=account, roles=[Role.OWNER], user_type="individual"))
    token = edge.issue_session(account, "sid", datetime.now(UTC) - timedelta(seconds=1))
    request = _request({"Authorization": f"Bearer {token}"})
    principal = await edge.requires(Permission.PROJECTS_READ)(request)
    assert principal.is_console
    context = _context(request)
    assert context.call is None and context.response_headers is None and context.principal is principal
    assert edge.quota.pending_calls(account) == 0


async def test_the_reused_principal_follows_a_role_change_and_a_toggle_at_once():
    edge, account, key = _edge()
    dependency = edge.requires(Permission.PROJECTS_WRITE)
    edge.accounts.apply(AccountState(time=datetime.now(UTC), account_id=account, roles=[Role.VIEWER], user_type="individual"))
    for _ in range(2):  # the second call is served from the cache, and still refused
        with pytest.raises(ApiError) as caught:
            await dependency(_request({"Authorization": f"Bearer {SECRET}"}))
        assert caught.value.code is ErrorCode.PERMISSION_DENIED
    edge.accounts.apply(AccountState(time=datetime.now(UTC), account_id=account, roles=[Role.OWNER], user_type="individual"))
    assert (await dependency(_request({"Authorization": f"Bearer {SECRET}"}))).roles == {Role.OWNER}
    disabled = KeyState(
        time=datetime.now(UTC), account_id=account, key_id=key, hash=hash_secret(SECRET), status="disabled", roles=[Role.OWNER]
    )
    edge.keys.apply(disabled)
    with pytest.raises(ApiError) as caught:
        await dependency(_request({"Authorization": f"Bearer {SECRET}"}))
    assert caught.value.code is ErrorCode.API_KEY_DISABLED


def test_the_audit_context_names_the_user_the_key_and_the_trusted_address():
    edge, account, key = _edge(trusted_proxies=["10.0.0.0/8"])
    user = uuid.uuid4()
    request = _request({"X-Forwarded-For": "203.0.113.7, 10.1.1.1", "User-Agent": "sdk/1"})
    by_key = edge.audit_context(request, Principal(account, frozenset({Role.OWNER}), api_key_id=key, user_id=user))
    assert (by_key.user_id, by_key.api_key_id, by_key.operator) == (user, key, False)
    assert (by_key.ip, by_key.user_agent) == ("203.0.113.7", "sdk/1")
    # a session from before members acts as the registering user, whose id is the account's
    old = edge.audit_context(request, Principal(account, frozenset({Role.OWNER}), session_id="s"))
    assert (old.user_id, old.api_key_id) == (account, None)
    operator = edge.audit_context(_request({"X-Forwarded-For": "203.0.113.7"}, peer="198.51.100.1"), None)
    # an untrusted peer: its own address, whatever the header says
    assert (operator.operator, operator.user_id, operator.ip) == (True, None, "198.51.100.1")


async def test_refusals_come_in_the_contracts_order_and_none_is_admitted():
    """429, then 403 for who the caller is, then 503 overloaded, then 403 insufficient_quota. The
    edge runs the checks without I/O first (so the rest is one Redis round trip): the order is the
    answers', whatever order the checks run in."""
    edge, account, _key = _edge()
    edge.calls = CallRecorder(edge.settings, max_buffer=1)
    now = datetime.now(UTC)
    period = edge.quota.calls_view(account, now).period
    edge.quota.apply(
        QuotaState(time=now, account_id=account, resource=Resource.AI_TOKENS, period=period, total=1, used=1, blocked=True)
    )

    async def answer(console_only: bool = False) -> ErrorCode:
        with pytest.raises(ApiError) as caught:
            await edge.requires(consumes=Resource.AI_TOKENS, console_only=console_only)(
                _request({"Authorization": f"Bearer {SECRET}"})
            )
        return caught.value.code

    assert await answer() is ErrorCode.INSUFFICIENT_QUOTA
    assert edge.calls.lanes.open == 1  # its place is held until its event (with the code) is sent
    assert await answer() is ErrorCode.OVERLOADED
    assert await answer(console_only=True) is ErrorCode.CONSOLE_SESSION_REQUIRED
    edge.plans.default = RateLimit(per_second=0.001, burst=1, per_minute=100)
    assert await answer(console_only=True) is ErrorCode.CONSOLE_SESSION_REQUIRED  # the bucket's last token
    assert await answer(console_only=True) is ErrorCode.RATE_LIMITED
    assert await answer() is ErrorCode.RATE_LIMITED
    assert edge.quota.pending_calls(account) == 0 and edge.calls.lanes.open == 1  # nothing admitted, no place taken
