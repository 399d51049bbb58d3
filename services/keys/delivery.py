"""The use cases' `LocalEdge` (services/keys/service.py) on the real process: delivery waits for
the outbox relay's Kafka ack of the committed rows (bounded), then applies the new states to this
process's edge, so it judges by them before the response leaves."""

import asyncio
import logging
from datetime import datetime
from uuid import UUID

from contracts.clock import Clock
from contracts.errors import ErrorCode
from contracts.events import PlanChanged
from services.edge import ApiError, Edge
from services.keys.service import Changes
from services.runtime.platform.outbox_relay import OutboxRelay

log = logging.getLogger(__name__)
DELIVERY_TIMEOUT_S = 10.0


class EdgeDelivery:
    def __init__(self, relay: OutboxRelay, edge: Edge, clock: Clock) -> None:
        self.relay = relay
        self.edge = edge
        self.clock = clock

    async def deliver(self, changes: Changes) -> None:
        try:
            async with asyncio.timeout(DELIVERY_TIMEOUT_S):
                await self.relay.publish_committed()
        except Exception as exc:
            log.warning("outbox delivery delayed; the relay will retry", exc_info=True)
            raise ApiError(
                503, ErrorCode.SERVICE_UNAVAILABLE, "The change is saved but not yet in effect everywhere; it will be shortly."
            ) from exc
        # A disabled or deleted key is refused by every replica before this answer leaves, from the
        # store each asks on every admission; keys.v1 brings their projections the same a little later.
        for key in changes.keys:
            await self.edge.revoke_everywhere(key)
        for key in changes.narrowed:  # (v4) new rules: no replica judges the key by its older state
            await self.edge.narrow_everywhere(key)
        # A removed or re-roled user's keys and sessions, a password change's sessions, a logout, a
        # revoked service token: the same, in the same store (services/edge/user_revocations.py,
        # token_revocations.py), whatever each replica's Kafka consumers have read.
        for change in changes.user_changes:
            await self.edge.change_user_everywhere(change.user, change.key_ids)
        for user in changes.sessions_ended:
            await self.edge.end_sessions_everywhere(user)
        if changes.sessions:
            await self.edge.log_out_everywhere(changes.sessions, self.clock())
        for token in changes.service_tokens:
            await self.edge.revoke_token_everywhere(token)
        for account in changes.accounts:
            self.edge.accounts.apply(account)
        for key in changes.keys:
            self.edge.keys.apply(key)
        for token in changes.service_tokens:
            self.edge.service_tokens.apply(token)
        for user in changes.users:
            self.edge.users.apply(user)
        for revoked in changes.sessions:
            self.edge.revoked_sessions.apply(revoked, self.clock())

    def knows_account(self, account_id: UUID) -> bool:
        return self.edge.accounts.get(account_id) is not None

    def latest_plan(self, account_id: UUID) -> PlanChanged | None:
        return self.edge.plans.latest(account_id)

    def issue_session(self, account_id: UUID, session_id: str, now: datetime, user_id: UUID) -> str:
        return self.edge.issue_session(account_id, session_id, now, user_id)

    def drain_service_token_uses(self) -> dict[UUID, datetime]:
        return self.edge.service_tokens.drain_uses()

    def note_service_token_use(self, token_id: UUID, at: datetime) -> None:
        self.edge.service_tokens.note_use(token_id, at)
