"""The built-in payment provider is idempotent on the order id, as billing requires of any provider."""

import asyncio
import uuid
from decimal import Decimal

from services.billing.domain import Idempotency
from services.billing.payments import TestProvider


def test_a_second_charge_of_an_order_returns_the_first():
    provider = TestProvider()
    order, account = uuid.uuid4(), uuid.uuid4()

    async def run():
        first = await provider.charge(order, account, Decimal("2.00"), "USD")
        second = await provider.charge(order, account, Decimal("2.00"), "USD")
        other = await provider.charge(uuid.uuid4(), account, Decimal("2.00"), "USD")
        return first, second, other

    first, second, other = asyncio.run(run())
    assert second is first and other != first
    assert provider.attempts == 3 and len(provider.charges) == 2


def test_the_fingerprint_names_path_and_body_not_their_spelling():
    a = Idempotency.of("k", "POST /x", "/x", {"a": 1, "b": [1, 2]})
    b = Idempotency.of("k", "POST /x", "/x", {"b": [1, 2], "a": 1})
    assert a is not None and b is not None and a.fingerprint == b.fingerprint
    assert a != Idempotency.of("k", "POST /x", "/y", {"a": 1, "b": [1, 2]})
    assert a != Idempotency.of("k", "POST /x", "/x", {"a": 2, "b": [1, 2]})
    assert Idempotency.of(None, "POST /x", "/x") is None
