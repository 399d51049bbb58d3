"""Subscribers of the keys service: the account's plan (billing.v1) for GET /api/account, each
key's last_used_at from calls.v1 (admitted calls only), in batches (one UPDATE per batch, off the
request path), and the audit log (audit.v1, written by every service's outbox)."""

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from uuid import UUID

from faststream.kafka import KafkaBroker, KafkaRouter

from contracts.audit import AuditRecorded
from contracts.events import BILLING_EVENTS, BillingEvent, CallEvent, PlanChanged
from contracts.fast_events import Call, decode_call
from contracts.topics import AUDIT, BILLING, CALLS
from contracts.usage_rules import time_violations_at
from services.keys.service import KeysService
from services.runtime.platform.settings import Settings
from services.runtime.platform.subscribe import Reading, Subscriber

LAST_USED_EVERY_S = 1.0
# last_used_at is coarse by nature, and no latency bound waits on it: its calls.v1 fetches gather
# for up to a second (issue 38, decision 2), so a trickle of calls wakes the group once a second,
# not at every call's record (BENCHMARKS.md, "http_load" round 26).
LAST_USED_GATHER_MS = 1000


def _call_rules(event: Call, timestamp_ms: int) -> list[str]:
    return time_violations_at(event, timestamp_ms * 1000)


# Calls judged as by every consumer of calls.v1 (contracts/usage_rules.py): a forged time far ahead
# would otherwise hold last_used_at there (GREATEST). (issue 38, decision 4) A message is decoded by
# the model's msgspec mirror first, several times faster; what the mirror does not take, the model
# judges as before: the same calls are read and dead-lettered (with the same reasons), with the same
# values (tests/unit/test_keys_decode.py).
CALLS_READING: Reading[Call] = Reading(CallEvent, _call_rules, decode_call)


def last_used(events: Iterable[Call]) -> dict[UUID, datetime]:
    """Each key's latest admitted call of a batch (the first of equal times)."""
    used: dict[UUID, datetime] = {}
    for event in events:
        if event.error_code is not None:
            continue  # refused calls (they carry error_code) do not move last_used_at (API.md)
        if event.api_key_id not in used or used[event.api_key_id] < event.time:
            used[event.api_key_id] = event.time
    return used


def noting_calls(service: KeysService, every_s: float | None = None) -> Callable[[list[Call]], Awaitable[None]]:
    """The handler of calls.v1's batches: their keys' last_used_at, then a pause of `every_s`
    (None: LAST_USED_EVERY_S)."""

    async def on_calls(events: list[Call]) -> None:
        await service.note_calls(last_used(events))  # GREATEST(): replays and reordering change nothing
        # last_used_at is coarse by nature: at most one UPDATE per second, whatever the call
        # rate (the next poll then returns the whole backlog as one batch).
        await asyncio.sleep(LAST_USED_EVERY_S if every_s is None else every_s)

    return on_calls


def build_router(service: KeysService, broker: KafkaBroker, settings: Settings) -> KafkaRouter:
    subscribe = Subscriber(KafkaRouter(), broker, settings)

    async def on_billing(event: BillingEvent) -> None:
        if isinstance(event, PlanChanged):
            await service.set_plan(event.account_id, event.plan, event.time, event.version)

    subscribe.each(BILLING, Reading(BILLING_EVENTS), group="keys.plans", handle=on_billing)
    # every service's audit entries (their outboxes): stored once per event id, committed after the write
    subscribe.each(AUDIT, Reading(AuditRecorded), group="keys.audit", handle=service.record_audit)
    subscribe.batches(
        {CALLS: CALLS_READING},
        group="keys.last-used",
        handle=noting_calls(service),
        max_records=10_000,
        batch_timeout_ms=1000,
        gather_ms=LAST_USED_GATHER_MS,
    )
    return subscribe.router
