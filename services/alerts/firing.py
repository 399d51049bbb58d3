"""Deciding and recording firings: one transaction per decision, deliveries sent afterwards."""

from datetime import datetime
from uuid import UUID
from zoneinfo import ZoneInfo

from contracts.common import Resource
from contracts.events import QuotaThresholdCrossed
from contracts.period import period_of
from services.alerts import domain, store


async def fire_crossing(conn: store.Conn, event: QuotaThresholdCrossed) -> list[UUID]:
    """Record a firing (and its deliveries) for every rule the crossing reaches that has not fired
    this period. Run inside a transaction; the unique constraint settles any race."""
    rules = await store.rules_for(conn, event.account_id, event.resource, event.threshold_pct)
    if not rules:
        return []
    by_id = {r.id: r for r in rules}
    already = await store.fired_rules(conn, list(by_id), event.period)
    due = domain.rules_to_fire((domain.RuleThreshold(r.id, r.threshold_pct) for r in rules), event.threshold_pct, already)
    delivery_ids: list[UUID] = []
    for item in due:
        firing = store.Firing(by_id[item.rule_id], event.period, event.used, event.total, "crossing", event.id)
        delivery_ids += await store.record_firing(conn, firing)
    return delivery_ids


async def fire_at_creation(conn: store.Conn, rule: store.Rule, now: datetime, tz: ZoneInfo) -> list[UUID]:
    """A new rule whose threshold is already passed this period fires once, now."""
    state = await store.quota_state(conn, rule.account_id, Resource(rule.resource))
    if state is None:
        return []
    current = period_of(now, tz)
    if not domain.fires_at_creation(rule.threshold_pct, rule.resource, state["period"], state["used"], state["total"], current):
        return []
    return await store.record_firing(conn, store.Firing(rule, current, state["used"], state["total"], "creation"))
