"""The use cases' `LocalEdge` (services/billing/service.py) on the real process: delivery waits
for the outbox relay's Kafka ack of the committed rows (bounded), then applies the payment's or
switch's billing.v1 events to this process's edge, so it judges the caller's next call by the new
totals and rate limits before the response leaves (as keys does for a toggle). Other replicas
apply them from billing.v1 within milliseconds."""

import asyncio
import logging

from contracts.errors import ErrorCode
from services.billing.service import BillingFact
from services.edge import ApiError, Edge
from services.runtime.platform.outbox_relay import OutboxRelay

log = logging.getLogger(__name__)
DELIVERY_TIMEOUT_S = 10.0


class EdgeDelivery:
    def __init__(self, relay: OutboxRelay, edge: Edge) -> None:
        self.relay = relay
        self.edge = edge

    async def deliver(self, facts: list[BillingFact]) -> None:
        try:
            async with asyncio.timeout(DELIVERY_TIMEOUT_S):
                await self.relay.publish_committed()
        except Exception as exc:
            log.warning("billing.v1 delivery delayed; the outbox relay will retry", exc_info=True)
            raise ApiError(
                503,
                ErrorCode.SERVICE_UNAVAILABLE,
                "The change is saved but not yet in effect everywhere; it will be shortly "
                "(paying the order again returns it, charged once).",
                headers={"Retry-After": "2"},
            ) from exc
        for fact in facts:
            self.edge.apply_billing(fact)
