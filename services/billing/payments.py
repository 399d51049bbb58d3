"""The payment-provider interface and the built-in test provider.

A real provider (Stripe, Adyen, ...) implements `PaymentProvider.charge`; it must be idempotent
on `order_id` (billing retries a payment whose outcome it did not record)."""

from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol
from uuid import UUID


@dataclass(frozen=True)
class Charge:
    reference: str


class PaymentDeclined(Exception):
    pass


class PaymentProvider(Protocol):
    async def charge(self, order_id: UUID, account_id: UUID, amount: Decimal, currency: str) -> Charge: ...


class TestProvider:
    """Accepts every charge at once (the default; for development and tests)."""

    __test__ = False  # not a pytest class

    async def charge(self, order_id: UUID, account_id: UUID, amount: Decimal, currency: str) -> Charge:
        return Charge(reference=f"test-{order_id}")
