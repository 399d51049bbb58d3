"""Reservations (v2) on real Kafka and Postgres: reserve, settle, release, expire; quota.v1
`reserved`; concurrent reservations never exceed the total; the edge honours `reserved`."""

import asyncio
import uuid
from datetime import UTC, datetime

import httpx
import psycopg
import pytest

from contracts.common import Resource
from contracts.events import UsageEvent
from contracts.topics import USAGE
from services.quota.app import quota_service
from services.quota.domain import InsufficientQuota
from services.quota.publisher import KafkaPublisher
from services.quota.service import QuotaService
from services.quota.store import QuotaStore
from tests.integration.quota_helpers import eventually, publish
from tests.integration.test_keys_api import bearer, new_key, signup
from tests.support.service_tokens import service_headers

pytestmark = pytest.mark.integration

FREE_TOKENS = 100_000


@pytest.fixture
def settings(module_settings):
    return module_settings


@pytest.fixture
def app_client(module_app_client):
    """Each test's accounts are its own (random ids, or signed up): one platform for the module (conftest.module_app_client)."""
    return module_app_client


def tokens(account_id: uuid.UUID, quantity: int, reservation_id: uuid.UUID | None = None, **kw) -> UsageEvent:
    return UsageEvent(
        time=datetime.now(UTC),
        account_id=account_id,
        resource=Resource.AI_TOKENS,
        quantity=quantity,
        source="test",
        reservation_id=reservation_id,
        **kw,
    )


async def state_is(app, account_id: uuid.UUID, resource: Resource, **expected):
    """Wait until the edge's projection (quota.v1) holds a state with these fields."""
    edge = app.state.runtime.edge

    async def probe():
        state = edge.quota.get(account_id, resource)
        if state is not None and all(getattr(state, k) == v for k, v in expected.items()):
            return state
        return None

    return await eventually(probe)


async def test_reserve_then_settle_counts_the_actual_amount_and_releases_the_hold(app_client, settings):
    app, _client = app_client
    quota = quota_service(app.state.runtime)  # the use cases on the app's Postgres and Kafka
    account = uuid.uuid4()

    held = await quota.reserve(account, Resource.AI_TOKENS, 60_000, ttl_seconds=600)
    assert (held.expires_at - datetime.now(UTC)).total_seconds() > 590
    await state_is(app, account, Resource.AI_TOKENS, used=0, reserved=60_000, blocked=False, total=FREE_TOKENS)

    # used 0 + reserved 60,000 + 50,000 > 100,000: refused, with the figures of the 403
    with pytest.raises(InsufficientQuota) as refused:
        await quota.reserve(account, Resource.AI_TOKENS, 50_000, ttl_seconds=600)
    assert (refused.value.used, refused.value.reserved, refused.value.total) == (0, 60_000, FREE_TOKENS)
    second = await quota.reserve(account, Resource.AI_TOKENS, 40_000, ttl_seconds=600)  # exactly fills it
    await state_is(app, account, Resource.AI_TOKENS, reserved=100_000, blocked=True)
    assert app.state.runtime.edge.quota.is_blocked(account, Resource.AI_TOKENS, datetime.now(UTC))

    # The stream used less than it held: the event counts 30,000 and frees the whole hold.
    settle = tokens(account, 30_000, held.id, input_tokens=10_000, output_tokens=20_000)
    await publish(settings, USAGE.name, [settle], key=lambda e: str(e.account_id))
    await state_is(app, account, Resource.AI_TOKENS, used=30_000, reserved=40_000, blocked=False)

    # Idempotent on the event id: the same event again changes nothing (a marker event proves
    # the duplicate was consumed before we look).
    marker = tokens(account, 1)
    await publish(settings, USAGE.name, [settle, marker], key=lambda e: str(e.account_id))
    await state_is(app, account, Resource.AI_TOKENS, used=30_001, reserved=40_000)

    # Settling an unknown reservation just counts the usage.
    await publish(settings, USAGE.name, [tokens(account, 5, uuid.uuid4())], key=lambda e: str(e.account_id))
    await state_is(app, account, Resource.AI_TOKENS, used=30_006, reserved=40_000)
    # An event of another account cannot settle this account's reservation.
    other = tokens(uuid.uuid4(), 7, second.id)
    await publish(settings, USAGE.name, [other, tokens(account, 4)], key=lambda e: str(e.account_id))
    await state_is(app, account, Resource.AI_TOKENS, used=30_010, reserved=40_000)
    report = await quota.report(account)
    assert next(i for i in report.items if i.resource is Resource.AI_TOKENS).used == 30_010


async def test_a_usage_event_of_another_resource_does_not_settle_the_reservation(app_client, settings):
    """A reservation holds room in one resource: an event of another resource (a stream's
    conversation count, an upload's bytes) is not its actual usage and must not free the hold,
    which would let the reserved usage go uncounted while the hold is gone."""
    app, _client = app_client
    quota = quota_service(app.state.runtime)
    account = uuid.uuid4()
    held = await quota.reserve(account, Resource.AI_TOKENS, 60_000, ttl_seconds=600)
    await state_is(app, account, Resource.AI_TOKENS, used=0, reserved=60_000)
    elsewhere = UsageEvent(
        time=datetime.now(UTC),
        account_id=account,
        resource=Resource.AI_CONVERSATIONS,
        quantity=1,
        source="test",
        reservation_id=held.id,
    )
    await publish(settings, USAGE.name, [elsewhere], key=lambda e: str(e.account_id))
    await state_is(app, account, Resource.AI_CONVERSATIONS, used=1)
    marker = tokens(account, 2)  # consumed after `elsewhere`: the hold is looked at after it was judged
    await publish(settings, USAGE.name, [marker], key=lambda e: str(e.account_id))
    await state_is(app, account, Resource.AI_TOKENS, used=2)
    assert app.state.runtime.edge.quota.get(account, Resource.AI_TOKENS).reserved == 60_000
    # its own resource's event settles it
    await publish(settings, USAGE.name, [tokens(account, 10, held.id)], key=lambda e: str(e.account_id))
    await state_is(app, account, Resource.AI_TOKENS, used=12, reserved=0)


async def test_release_frees_at_once_and_only_once(app_client):
    app, _client = app_client
    quota = quota_service(app.state.runtime)  # the use cases on the app's Postgres and Kafka
    account, owner = uuid.uuid4(), uuid.uuid4()
    held = await quota.reserve(account, Resource.STORAGE_BYTES, 10_000, ttl_seconds=60, owner_id=owner)
    await state_is(app, account, Resource.STORAGE_BYTES, reserved=10_000)
    assert not await quota.release(held.id, owner_id=uuid.uuid4())  # another service token's: not found
    assert not await quota.release(uuid.uuid4(), owner_id=owner)
    assert await quota.release(held.id, owner_id=owner)
    await state_is(app, account, Resource.STORAGE_BYTES, reserved=0, blocked=False)
    assert not await quota.release(held.id, owner_id=owner)
    # One made in process (no service token) is released the same way, and not by a token.
    anonymous = await quota.reserve(account, Resource.STORAGE_BYTES, 5, ttl_seconds=60)
    assert not await quota.release(anonymous.id, owner_id=owner)
    assert await quota.release(anonymous.id)


async def test_an_expired_reservation_is_not_released_before_the_sweeper_drops_it(app_client):
    """Past its expiry a reservation holds nothing, swept or not: releasing it is 404, not a 204."""
    app, _client = app_client
    runtime = app.state.runtime
    quota = quota_service(runtime)
    account, owner = uuid.uuid4(), uuid.uuid4()
    held = await quota.reserve(account, Resource.STORAGE_BYTES, 10, ttl_seconds=60, owner_id=owner)
    later = QuotaService(
        QuotaStore(runtime.pool), KafkaPublisher(runtime.broker, runtime.settings), lambda: held.expires_at,
        runtime.settings.tz, runtime.settings.console_url,
    )  # fmt: skip
    assert not await later.release(held.id, owner_id=owner)  # the sweeper's clock has not reached it yet
    assert await quota.release(held.id, owner_id=owner)  # before its expiry it is released


async def test_an_unsettled_reservation_is_released_at_its_expiry_by_the_sweeper(app_client):
    app, _client = app_client
    quota = quota_service(app.state.runtime)  # the use cases on the app's Postgres and Kafka
    account = uuid.uuid4()
    await quota.reserve(account, Resource.AI_TOKENS, FREE_TOKENS, ttl_seconds=1)
    await state_is(app, account, Resource.AI_TOKENS, reserved=FREE_TOKENS, blocked=True)
    # No usage event, no release: the background sweeper publishes the freed state.
    await state_is(app, account, Resource.AI_TOKENS, reserved=0, blocked=False)
    assert not app.state.runtime.edge.quota.is_blocked(account, Resource.AI_TOKENS, datetime.now(UTC))
    held = await quota.reserve(account, Resource.AI_TOKENS, FREE_TOKENS, ttl_seconds=60)  # the room is back
    assert held.id


async def test_concurrent_reservations_never_exceed_the_total(app_client):
    app, _client = app_client
    quota = quota_service(app.state.runtime)  # the use cases on the app's Postgres and Kafka
    account = uuid.uuid4()

    async def one() -> int:
        while True:
            try:
                await quota.reserve(account, Resource.AI_TOKENS, 3_000, ttl_seconds=600)
            except InsufficientQuota:
                return 0
            except psycopg.OperationalError:  # the pool's bounded wait (HTTP: 503 + Retry-After): retry
                await asyncio.sleep(0.2)
                continue
            return 3_000

    granted = await asyncio.gather(*(one() for _ in range(100)))
    assert sum(granted) == 99_000  # 33 of 100 fit into 100,000; never one more
    await state_is(app, account, Resource.AI_TOKENS, reserved=99_000, blocked=False)


async def test_the_edge_counts_reserved_api_calls_as_used(app_client):
    app, _client = app_client
    quota = quota_service(app.state.runtime)  # the use cases on the app's Postgres and Kafka
    edge = app.state.runtime.edge
    account = uuid.uuid4()
    await quota.reserve(account, Resource.API_CALLS, 998, ttl_seconds=600)
    await state_is(app, account, Resource.API_CALLS, reserved=998, total=1000)
    now = datetime.now(UTC)
    assert [edge.quota.admit_call(account, now) for _ in range(3)] == [True, True, False]


# ---- over HTTP: the service routes ---------------------------------------------------------------
RESERVE = "/api/quota/reservations"


def err(response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and body["error"]["request_id"], body
    return dict(body["error"])


async def test_reservation_routes_take_only_a_service_token_and_answer_the_contract(app_client, settings):
    app, client = app_client
    account, console = await signup(client)
    customer_key = bearer((await new_key(client, console))["key"])
    service = await service_headers(client, settings)
    other_service = await service_headers(client, settings)
    body = {"account_id": account["id"], "resource": "ai_tokens", "amount": 60_000, "ttl_seconds": 600}

    made = await client.post(RESERVE, json=body, headers=service)
    assert made.status_code == 201, made.text
    assert set(made.json()) == {"id", "expires_at"}
    expires = datetime.fromisoformat(made.json()["expires_at"])
    assert 590 < (expires - datetime.now(UTC)).total_seconds() <= 600
    await state_is(app, uuid.UUID(account["id"]), Resource.AI_TOKENS, reserved=60_000)

    # The metered party never reserves nor releases: API key and console session are 403.
    for headers in (customer_key, console):
        refused = await client.post(RESERVE, json=body, headers=headers)
        assert refused.status_code == 403 and err(refused)["code"] == "permission_denied"
        refused = await client.delete(f"{RESERVE}/{made.json()['id']}", headers=headers)
        assert refused.status_code == 403 and err(refused)["code"] == "permission_denied"
    assert (await client.post(RESERVE, json=body)).status_code == 401

    # Over the total: 403 insufficient_quota with the figures and the links.
    over = await client.post(RESERVE, json={**body, "amount": 40_001}, headers=service)
    assert over.status_code == 403
    error = err(over)
    assert error["code"] == "insufficient_quota"
    details = error["details"]
    assert (details["resource"], details["used"], details["reserved"], details["total"]) == ("ai_tokens", 0, 60_000, 100_000)
    assert datetime.fromisoformat(details["period_end"]) > datetime.now(UTC)
    assert details["links"]["upgrade_plan"].endswith("/plan")
    assert details["links"]["buy_quota_package"].endswith("/quota?buy=ai_tokens")

    # Bad input: 422 validation_error in the contract's body.
    for bad in (
        {**body, "ttl_seconds": 0},
        {**body, "ttl_seconds": 3601},
        {**body, "amount": -5},
        {**body, "amount": 0},
        {**body, "resource": "gold"},
        {**body, "account_id": "not-a-uuid"},
        {k: v for k, v in body.items() if k != "amount"},
    ):
        invalid = await client.post(RESERVE, json=bad, headers=service)
        assert invalid.status_code == 422, (bad, invalid.text)
        assert err(invalid)["code"] == "validation_error"
    assert (await client.delete(f"{RESERVE}/not-a-uuid", headers=service)).status_code == 422

    # Unknown id, or another service token's reservation: 404; the owner's: 204, then 404.
    unknown = await client.delete(f"{RESERVE}/{uuid.uuid4()}", headers=service)
    assert unknown.status_code == 404 and err(unknown)["code"] == "not_found"
    foreign = await client.delete(f"{RESERVE}/{made.json()['id']}", headers=other_service)
    assert foreign.status_code == 404 and err(foreign)["code"] == "not_found"
    released = await client.delete(f"{RESERVE}/{made.json()['id']}", headers=service)
    assert released.status_code == 204 and released.content == b""
    await state_is(app, uuid.UUID(account["id"]), Resource.AI_TOKENS, reserved=0)
    assert (await client.delete(f"{RESERVE}/{made.json()['id']}", headers=service)).status_code == 404


async def test_a_hundred_concurrent_reservations_over_http_then_settled_through_the_usage_api(app_client, settings):
    app, client = app_client
    account, console = await signup(client)
    service = await service_headers(client, settings)
    body = {"account_id": account["id"], "resource": "ai_tokens", "amount": 3_000, "ttl_seconds": 600}

    async def one() -> httpx.Response:
        while True:
            answer = await client.post(RESERVE, json=body, headers=service)
            if answer.status_code != 503:  # a loaded machine: the pool's bounded wait; retry as a client would
                return answer
            assert err(answer)["code"] == "service_unavailable" and answer.headers["Retry-After"]
            await asyncio.sleep(0.2)

    answers = await asyncio.gather(*(one() for _ in range(100)))
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [201] * 33 + [403] * 67  # 33 x 3,000 fit into 100,000; never a 34th
    account_id = uuid.UUID(account["id"])
    await state_is(app, account_id, Resource.AI_TOKENS, reserved=99_000)

    # Each stream reports what it really used through POST /api/usage/events: settled.
    made = [r.json()["id"] for r in answers if r.status_code == 201]
    events = [
        {
            "id": str(uuid.uuid4()),
            "time": datetime.now(UTC).isoformat(),
            "account_id": account["id"],
            "resource": "ai_tokens",
            "quantity": 2_500,
            "source": "test",
            "reservation_id": rid,
        }
        for rid in made
    ]
    ingested = await client.post("/api/usage/events", json={"events": events}, headers=service)
    assert ingested.status_code == 202, ingested.text
    await state_is(app, account_id, Resource.AI_TOKENS, used=33 * 2_500, reserved=0, blocked=False)
    report = (await client.get("/api/billing/check-quota", headers=console)).json()
    assert next(i for i in report["items"] if i["resource"] == "ai_tokens")["used"] == 82_500


async def test_a_reservation_naming_a_key_not_of_the_account_is_404_known_to_quota_or_not(app_client, settings):
    """A key id quota has not heard of and another account's key answer the same 404, and neither
    is held: before, an id unknown to quota was accepted (and its hold later counted against the
    limits of whichever account's key it turned out to be), while a known foreign key was 404, so a
    service token could tell the two apart. A key of the account created a moment ago is reserved
    at once: quota learns it from its process's keys.v1 projection (what verify judged by)."""
    app, client = app_client
    account, console = await signup(client)
    _, other_console = await signup(client)
    service = await service_headers(client, settings)
    body = {"account_id": account["id"], "resource": "ai_tokens", "amount": 1_000, "ttl_seconds": 60}
    foreign_key = (await new_key(client, other_console))["id"]
    answers = []
    for key_id in (str(uuid.uuid4()), foreign_key):
        refused = await client.post(RESERVE, json={**body, "api_key_id": key_id}, headers=service)
        assert refused.status_code == 404, refused.text
        answers.append({k: v for k, v in err(refused).items() if k != "request_id"})
    assert answers[0] == answers[1] and answers[0]["code"] == "not_found"
    own_key = (await new_key(client, console))["id"]
    made = await client.post(RESERVE, json={**body, "api_key_id": own_key}, headers=service)
    assert made.status_code == 201, made.text
    await state_is(app, uuid.UUID(account["id"]), Resource.AI_TOKENS, reserved=1_000)  # only the own key's hold
