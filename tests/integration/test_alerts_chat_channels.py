"""The slack and teams channels (v4) on real Kafka and Postgres, posting to local receivers that
check each platform's documented message shape and answer as the platform does: a 500 retried,
then success; the delivery log; unsigned posts; the webhook channel's SSRF guard and https."""

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from services.alerts.webhook import SIGNATURE_HEADER
from services.runtime.platform.settings import Settings
from tests.integration.quota_helpers import bearer, new_api_key
from tests.integration.test_alerts_helpers import CONSOLE_URL, eventually, login, publish_crossing, this_period
from tests.support.apps import running_app
from tests.support.chat_receivers import ChatReceiver, serving, slack_receiver, teams_receiver

pytestmark = pytest.mark.integration

PLATFORMS: dict[str, tuple[Callable[[], ChatReceiver], int]] = {
    "slack": (slack_receiver, 200),
    "teams": (teams_receiver, 202),
}


def _fast(settings: Settings, *, allow_private: bool) -> Settings:
    return settings.model_copy(
        update={
            "console_url": CONSOLE_URL,
            "webhook_allow_private_targets": allow_private,
            "webhook_retry_initial_seconds": 0.3,
            "webhook_retry_max_seconds": 1.0,
        }
    )


def _rule(channel: str, recipients: list[dict[str, Any]], threshold: int = 80) -> dict[str, Any]:
    return {"metric": "total_tokens", "threshold_pct": threshold, "channels": [channel], "recipients": recipients}


@pytest.fixture(params=sorted(PLATFORMS))
def platform(request: pytest.FixtureRequest) -> Iterator[tuple[str, ChatReceiver, int]]:
    make, ok_status = PLATFORMS[request.param]
    with serving(make()) as receiver:
        yield request.param, receiver, ok_status


def _texts(channel: str, body: dict[str, Any]) -> str:
    """Every text a reader sees in the message."""
    if channel == "slack":
        return body["text"] + "".join(b["text"]["text"] for b in body["blocks"] if b["type"] in ("header", "section"))
    card = body["attachments"][0]["content"]
    texts = [e["text"] for e in card["body"] if e["type"] == "TextBlock"]
    texts += [f"{f['title']} {f['value']}" for e in card["body"] if e["type"] == "FactSet" for f in e["facts"]]
    return " ".join(texts + [a["url"] for a in card["actions"]])


async def test_a_chat_post_in_the_platform_format_is_retried_after_a_500_and_logged(settings, platform):
    channel, receiver, ok_status = platform
    settings = _fast(settings, allow_private=True)
    receiver.failures = [500]
    account, stranger = uuid.uuid4(), uuid.uuid4()
    async with running_app(settings, targets=("alerts",)) as (app, client):
        key = bearer(await new_api_key(app, settings, account))  # an API key may create rules, as today
        stranger_key = bearer(await new_api_key(app, settings, stranger))
        stranger_session = await login(app, stranger)

        created = await client.post("/api/ai/usage/alert", json=_rule(channel, [{"url": receiver.url()}]), headers=key)
        assert created.status_code == 201, created.text
        rule = created.json()
        # The URL is the channel's credential: never shown again, to any reader of the rules (an
        # API key with alerts:read, a viewer), only its host and last four characters.
        shown = receiver.url().removesuffix("/services/T000/B000/XXXX") + "/...XXXX"
        assert rule["channels"] == [channel] and rule["recipients"] == [{"url": shown}]
        listed = (await client.get("/api/ai/usage/alert", headers=key)).json()["rules"]
        assert [r["recipients"] for r in listed if r["id"] == rule["id"]] == [[{"url": shown}]]
        assert rule["webhook_secret"] is None  # nothing to sign with: the platforms check no signature

        await publish_crossing(app.state.runtime.broker, settings, account, 85, period=this_period())
        await eventually(lambda: any(r["answered"] == ok_status for r in receiver.received()), within=30)

        requests = receiver.received()
        assert [(r["answered"], r["problem"]) for r in requests] == [(500, None), (ok_status, None)]  # shape accepted
        assert requests[1]["at"] - requests[0]["at"] >= 0.3  # backoff
        assert len({r["body"] for r in requests}) == 1  # the same message on every attempt
        for request in requests:
            assert SIGNATURE_HEADER.lower() not in request["headers"]
            assert request["headers"]["content-type"] == "application/json"
            assert request["path"] == "/services/T000/B000/XXXX"
        text = _texts(channel, json.loads(requests[0]["body"]))
        for fact in ("total_tokens", "80%", "85,000", "100,000", "85.00%", this_period(), f"{CONSOLE_URL}/plan"):
            assert fact in text, (fact, text)
        assert f"{CONSOLE_URL}/quota?buy=ai_tokens" in text

        path = f"/api/ai/usage/alert/{rule['id']}/deliveries"

        async def logged() -> list[dict[str, Any]] | None:
            items = (await client.get(path, headers=key)).json()["items"]
            return items if len(items) == 2 and items[-1]["status"] == "sent" else None

        await eventually(logged)
        items = await logged()
        assert items is not None
        assert [(i["attempt"], i["status_code"]) for i in items] == [(1, 500), (2, ok_status)]
        assert items[0]["error"] == "receiver answered 500" and items[0]["next_attempt_at"] is not None
        assert items[1]["error"] is None and items[1]["next_attempt_at"] is None
        assert {i["channel"] for i in items} == {channel} and {i["recipient"] for i in items} == {f"url:{shown}"}
        assert "T000/B000" not in json.dumps(items)

        # Another account reads nothing of it, by session or by API key.
        for headers in (stranger_session, stranger_key):
            missing = await client.get(path, headers=headers)
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
            listed = (await client.get("/api/ai/usage/alert", headers=headers)).json()["rules"]
            assert rule["id"] not in {r["id"] for r in listed}
    assert len(receiver.received()) == 2  # nothing more was sent


async def test_misfit_recipients_plain_http_and_private_targets_are_422(settings):
    settings = _fast(settings, allow_private=False)
    account = uuid.uuid4()
    async with running_app(settings, targets=("alerts",)) as (app, client):
        key = bearer(await new_api_key(app, settings, account))
        session = await login(app, account)  # many requests: a session, not the rate-limited key

        async def refused(body: dict[str, Any]) -> list[str]:
            response = await client.post("/api/ai/usage/alert", json=body, headers=session)
            assert response.status_code == 422, (body, response.text)
            error = response.json()["error"]
            assert error["code"] == "validation_error" and error["request_id"]
            return [d.get("field") or ".".join(map(str, d.get("loc", []))) for d in error["details"]]

        for channel in ("slack", "teams"):
            assert "channels" in await refused(_rule(channel, [{"email": "ops@example.com"}]))
            assert await refused(_rule(channel, [])) == ["recipients"]
            for url in ("not a url", "ftp://hooks.example.com/x", "hooks.slack.com/services/T/B/X"):
                assert await refused(_rule(channel, [{"url": url}])) == ["recipients.0.url"], url
            # https only (the operator setting is off), decided before any DNS.
            assert await refused(_rule(channel, [{"url": "http://hooks.example.com/x"}])) == ["recipients.0.url"]
            for url in ("https://127.0.0.1/x", "https://localhost:8443/x", "https://169.254.169.254/x", "https://[::1]/x"):
                assert await refused(_rule(channel, [{"url": url}])) == ["recipients.0.url"], url
        plain = _rule("slack", [{"url": "http://hooks.example.com/x"}])
        response = await client.post("/api/ai/usage/alert", json=plain, headers=session)
        assert response.status_code == 422, response.text
        assert "https" in json.dumps(response.json()["error"]["details"])
        # One URL channel per rule: they share the {url} recipients.
        both = {**_rule("slack", [{"url": "https://hooks.example.com/x"}]), "channels": ["slack", "teams"]}
        assert await refused(both) == ["channels"]
        assert await refused({**both, "channels": ["webhook", "teams"]}) == ["channels"]
        # A public name that does not resolve now is accepted, as for webhooks.
        unresolved = _rule("teams", [{"url": "https://no-such-host.invalid/x"}])
        ok = await client.post("/api/ai/usage/alert", json=unresolved, headers=key)
        assert ok.status_code == 201 and ok.json()["webhook_secret"] is None
        assert [r["channels"] for r in (await client.get("/api/ai/usage/alert", headers=key)).json()["rules"]] == [["teams"]]
