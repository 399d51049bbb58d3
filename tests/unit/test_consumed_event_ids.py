"""Every consumer reads events through `deadletter.parse`: an event without its id is malformed
there (the model would invent an id, a new one at every redelivery, and no consumer could
deduplicate it), while code that builds events still gets one made for it."""

import json
import uuid
from datetime import UTC, datetime

import pytest

from contracts.common import Resource
from contracts.events import BILLING_EVENTS, PackagePurchased, UsageEvent
from services.runtime.platform.deadletter import parse


def usage_json(**drop_or_set) -> bytes:
    e = UsageEvent(
        time=datetime(2026, 11, 1, tzinfo=UTC), account_id=uuid.uuid4(), resource=Resource.AI_TOKENS, quantity=1, source="t"
    )
    body = json.loads(e.model_dump_json()) | drop_or_set
    return json.dumps({k: v for k, v in body.items() if v is not None}).encode()


def test_an_event_with_its_id_parses():
    raw = usage_json()
    assert parse(UsageEvent, raw).id == uuid.UUID(json.loads(raw)["id"])


def test_an_event_without_an_id_is_malformed_for_every_consumer():
    with pytest.raises(ValueError, match="id: Field required"):
        parse(UsageEvent, usage_json(id=None))
    package = PackagePurchased(
        time=datetime(2026, 11, 1, tzinfo=UTC),
        account_id=uuid.uuid4(),
        resource=Resource.AI_TOKENS,
        amount=1000,
        period="2026-11",
        order_id=uuid.uuid4(),
    )
    body = json.loads(package.model_dump_json())
    assert parse(BILLING_EVENTS, json.dumps(body).encode()) == package  # a billing.v1 event, through its union adapter
    del body["id"]
    with pytest.raises(ValueError, match="id: Field required"):
        parse(BILLING_EVENTS, json.dumps(body).encode())


def test_code_that_builds_an_event_still_gets_an_id():
    assert UsageEvent(
        time=datetime(2026, 11, 1, tzinfo=UTC), account_id=uuid.uuid4(), resource=Resource.AI_TOKENS, quantity=1, source="t"
    ).id
