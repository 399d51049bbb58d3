"""(issue 38, decision 5) verify's fast path on real Kafka, Postgres and redis: the same table of
requests answered by the fast path (services/edge/verify_fast.py) and by the documented routes
(the same app with the fast path taken out of the router's stack) gives the same answers, the same
rate limit spent in redis and the same calls.v1 events naming the service."""

from typing import Any

import pytest

from services.edge.verify_fast import VerifyFastPath
from tests.integration.test_edge_verify import VERIFY, ask, call_events, service_token
from tests.integration.test_keys_api import bearer, new_key, signup

pytestmark = pytest.mark.integration


def comparable(answer: Any) -> tuple[int, Any]:
    body = answer.json()
    error = body.get("error")
    if isinstance(error, dict):
        (error.get("error") or error).pop("request_id", None)
    if isinstance(body.get("rate_limit"), dict):
        body["rate_limit"].pop("remaining")
        body["rate_limit"].pop("reset")
    return answer.status_code, body


async def test_the_fast_path_and_the_routes_answer_and_meter_alike(app_client, settings):
    app, client = app_client
    service = bearer(await service_token(client, settings, ["keys:verify"], name="fast-gateway"))
    writer = bearer(await service_token(client, settings, ["usage:write"], name="writer"))
    account, owner = await signup(client)
    key = (await new_key(client, owner))["key"]
    table = [
        (ask(key), service),
        (ask(key, resource="ai_tokens", cost=10**12), service),  # refused, logged, not counted
        (ask("sk-" + "u" * 43), service),
        (ask(key, cost=-1), service),  # 422 (the route's)
        (ask(key), writer),  # 403 (the route's)
        (ask(key), bearer(key)),  # 403: a customer's key
    ]
    fast = app.router.middleware_stack
    assert isinstance(fast, VerifyFastPath)
    answers: dict[str, list[tuple[int, Any]]] = {"fast": [], "routes": []}
    for way in ("fast", "routes"):
        app.router.middleware_stack = fast if way == "fast" else fast.app
        try:
            for body, headers in table:
                answers[way].append(comparable(await client.post(VERIFY, json=body, headers=headers)))
        finally:
            app.router.middleware_stack = fast
    assert answers["fast"] == answers["routes"]
    assert [status for status, _ in answers["fast"]] == [200, 200, 200, 422, 403, 403]
    assert answers["fast"][0][1]["valid"] is True and answers["fast"][0][1]["rate_limit"]["limit"] > 0

    events = await call_events(settings, account["id"], 4)
    seen = [(e["status"], e.get("error_code"), e["service"], e["method"], e["path"], e["ip"]) for e in events]
    one_way = [(200, None, "fast-gateway", "POST", "/api/geo/projects", "203.0.113.7"),
               (403, "insufficient_quota", "fast-gateway", "POST", "/api/geo/projects", "203.0.113.7")]  # fmt: skip
    assert sorted(seen, key=str) == sorted(one_way * 2, key=str)
