"""The payment-provider interface and the built-in test provider.

A real provider (Stripe, Adyen, ...) implements `PaymentProvider.charge`; it must be idempotent
on `order_id` (billing retries a payment whose outcome it did not record), and raise
`PaymentDeclined` when the payer's bank or card refuses the charge (any other exception is the
provider failing, not the payer: the renewal job retries it and never ends a plan for it)."""

from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol
from uuid import UUID


@dataclass(frozen=True)
class Charge:
    reference: str


class PaymentDeclined(Exception):
    """The charge was refused for the payer (card declined, insufficient funds, ...)."""


class PaymentProvider(Protocol):
    async def charge(self, order_id: UUID, account_id: UUID, amount: Decimal, currency: str) -> Charge: ...


class TestProvider:
    """Accepts every charge at once (the default; for development and tests). Idempotent on the
    order id like a real provider: a second charge of an order returns the first one. `attempts`
    counts every call and `charges` holds the distinct charges made, so tests can count both."""

    __test__ = False  # not a pytest class

    def __init__(self) -> None:
        self.attempts = 0
        self.charges: dict[UUID, Charge] = {}

    async def charge(self, order_id: UUID, account_id: UUID, amount: Decimal, currency: str) -> Charge:
        self.attempts += 1
        made = self.charges.get(order_id)
        if made is None:
            made = self.charges[order_id] = Charge(reference=f"test-{order_id}")
        return made
