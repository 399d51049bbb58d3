"""(v4) Key objects show the key's usage against each of its own limits (`usage`), on the real
stack: the limits arrive on keys.v1 (published here as the keys service will publish them after a
PATCH), quota counts usage events that carry the key, and GET /api/api-keys answers used, amount,
remaining and resets_at from the edge's copy of quota's standings. Another account's list never
shows the key."""

import uuid
from datetime import UTC, datetime

import pytest

from contracts.common import Resource
from contracts.key_limits import KeyLimit, LimitPeriod, window_of
from contracts.topics import KEYS
from tests.integration.quota_helpers import eventually, publish
from tests.integration.test_keys_api import new_key, signup
from tests.support.service_tokens import service_headers

pytestmark = pytest.mark.integration

MONTH_TOKENS = KeyLimit(resource=Resource.AI_TOKENS, amount=1_000, period=LimitPeriod.MONTH)
TRIAL_CALLS = KeyLimit(resource=Resource.API_CALLS, amount=50, period=LimitPeriod.ONCE)


async def test_a_keys_usage_against_its_limits_is_on_its_own_accounts_list_only(app_client, settings):
    app, client = app_client
    edge = app.state.runtime.edge
    account, console = await signup(client)
    key = await new_key(client, console, name="ci")
    key_id = uuid.UUID(key["id"])
    listed = (await client.get("/api/api-keys", headers=console)).json()["items"]
    assert listed[0]["usage"] == [] and key["usage"] == []  # no limits: nothing to show

    # The key's limits, as keys.v1 will carry them after a PATCH: its own state, one version on.
    state = edge.keys.by_id(key_id)
    assert state is not None
    limited = state.model_copy(update={"limits": [MONTH_TOKENS, TRIAL_CALLS], "version": state.version + 1})
    await publish(settings, KEYS.name, [limited], key=lambda e: str(e.key_id))

    async def quota_counts_the_limits() -> bool:  # quota has published the key's standings
        return all(edge.key_quota.get(key_id, x.resource, x.period) is not None for x in (MONTH_TOKENS, TRIAL_CALLS))

    await eventually(quota_counts_the_limits)
    now = datetime.now(UTC)
    events = [
        {
            "id": str(uuid.uuid4()), "time": now.isoformat(), "account_id": account["id"], "resource": "ai_tokens",
            "quantity": quantity, "provider": "openai", "model": "gpt-4o", "source": "gateway", "api_key_id": key["id"],
        }
        for quantity in (400, 350)
    ]  # fmt: skip
    reported = await client.post("/api/usage/events", json={"events": events}, headers=await service_headers(client, settings))
    assert reported.status_code == 202, reported.text

    async def counted() -> dict | None:
        items = (await client.get("/api/api-keys", headers=console)).json()["items"]
        usage = {(u["resource"], u["period"]): u for u in items[0]["usage"]}
        tokens = usage.get(("ai_tokens", "month"))
        return usage if tokens is not None and tokens["used"] == 750 else None

    usage = await eventually(counted)
    assert set(usage) == {("ai_tokens", "month"), ("api_calls", "once")}
    _, month_end = window_of(LimitPeriod.MONTH, now, settings.tz)
    assert month_end is not None
    tokens = usage[("ai_tokens", "month")]
    assert (tokens["amount"], tokens["remaining"]) == (1_000, 250)
    assert datetime.fromisoformat(tokens["resets_at"]) == month_end
    calls = usage[("api_calls", "once")]
    assert (calls["used"], calls["amount"], calls["remaining"], calls["resets_at"]) == (0, 50, 50, None)

    # Another account's list never shows the key, nor its usage.
    _other, other_console = await signup(client)
    other_items = (await client.get("/api/api-keys", headers=other_console)).json()["items"]
    assert other_items == []
