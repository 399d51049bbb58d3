"""examples/ai-gateway end to end: the official `openai` package, with a Tollgate `sk-` key as its
api_key, talks to real nginx running the shipped snippet (deploy/ingress/nginx/example.conf) in
front of the gateway, which reserves and reports through tollgate_client to Tollgate (every
service in this process, served over HTTP) on the real stack. The answer streams, its tokens are
metered under the model actually called, refusals reach the openai client as its own errors, and
50 concurrent streams never spend more ai_tokens than the quota holds."""

import asyncio
import dataclasses
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn

from contracts.common import Resource
from tests.integration.test_edge_verify import service_token
from tests.integration.test_ingress_snippets import Stage, _installed, nginx, stage  # noqa: F401 - the fixture
from tests.integration.test_keys_api import new_key, signup
from tests.support.apps import REPO, free_port
from tests.support.metering import wait_until
from tollgate_client import AsyncTollgate, UsageEvent

sys.path.insert(0, str(REPO / "examples" / "ai-gateway"))
from ai_gateway import fake_model
from ai_gateway.app import GatewaySettings, create_app

pytestmark = pytest.mark.integration
PROFESSIONAL_TOKENS = 10_000_000


@dataclass
class Gateway:
    url: str  # nginx, in front of the gateway
    stage: Stage
    token: str  # the gateway's service token (keys:verify + usage:write)


@pytest.fixture
async def gateway(stage: Stage, tmp_path: Path) -> AsyncIterator[Gateway]:  # noqa: F811
    if not _installed("nginx"):
        pytest.fail("nginx is not installed: `make test-prereqs` (deploy/local/prereqs.sh --test) installs it")
    settings = stage.app.state.runtime.settings  # type: ignore[attr-defined]
    token = await service_token(stage.client, settings, ["keys:verify", "usage:write"], name="ai-gateway")
    app = create_app(GatewaySettings(f"http://{stage.tollgate}", token, trust_ingress=True, token_delay=0.01))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        await wait_until(lambda: _started(server), timeout=10, interval=0.02)
        with nginx(dataclasses.replace(stage, upstream=f"127.0.0.1:{port}"), tmp_path) as url:
            yield Gateway(url, stage, token)
    finally:
        server.should_exit = True
        await serving


async def _started(server: uvicorn.Server) -> bool:
    return server.started


def _openai(gateway: Gateway, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0, timeout=30)


HELLO = [{"role": "user", "content": "hello there tollgate"}]


async def test_the_answer_streams_and_its_tokens_are_metered_under_the_model_called(gateway: Gateway):
    client = gateway.stage.client
    _account, owner = await signup(client)
    key = await new_key(client, owner)
    async with _openai(gateway, key["key"]) as ai:
        stream = await ai.chat.completions.create(
            model="gpt-4o", messages=HELLO, max_tokens=12, stream=True, stream_options={"include_usage": True}
        )
        arrivals, text, usage = [], "", None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.monotonic())
                text += chunk.choices[0].delta.content
            usage = chunk.usage or usage
        plain = await ai.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=5)

    # Streamed: one chunk per token, arriving as the model produces them (10 ms apart), not at once.
    assert len(arrivals) == 12 and arrivals[-1] - arrivals[0] >= 0.08
    assert text.startswith("You said: hello there tollgate")
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (6, 12)
    assert plain.choices[0].message.content == "You said: hello there tollgate"
    assert plain.choices[0].finish_reason == "length" and plain.model == fake_model.MODEL
    assert plain.usage is not None and plain.usage.total_tokens == 11
    metered = usage.total_tokens + plain.usage.total_tokens

    async def overview() -> dict | None:
        answer = (await client.get("/api/ai/usage/overview", params={"range": "today"}, headers=owner)).json()
        return answer if answer["total_tokens"] >= metered else None

    seen = await wait_until(overview, timeout=60)
    assert (seen["input_tokens"], seen["output_tokens"], seen["total_tokens"]) == (12, 17, metered)
    assert [(m["provider"], m["model"], m["total_tokens"]) for m in seen["models"]] == [
        (fake_model.PROVIDER, fake_model.MODEL, metered)
    ]
    by_provider = (await client.get("/api/ai/usage/by-provider", params={"range": "today"}, headers=owner)).json()
    assert [(i["provider"], i["model"], i["total_tokens"]) for i in by_provider["items"]] == [
        (fake_model.PROVIDER, fake_model.MODEL, metered)
    ]


async def test_a_disabled_key_is_an_authentication_error_at_once(gateway: Gateway):
    client = gateway.stage.client
    _account, owner = await signup(client)
    key = await new_key(client, owner)
    async with _openai(gateway, key["key"]) as ai:
        await ai.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=1)
        toggled = await client.post(f"/api/api-keys/{key['id']}/toggle", headers=owner)
        assert toggled.status_code == 200, toggled.text
        with pytest.raises(openai.AuthenticationError) as refused:
            await ai.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=1, stream=True)
    assert refused.value.status_code == 401
    assert refused.value.response.json()["error"]["code"] == "api_key_disabled"


async def test_a_key_allowed_one_model_cannot_escape_it_by_naming_another(gateway: Gateway):
    """(v4) The gateway's model (tollgate-fake/parrot-1) is what is judged, behind nginx
    (X-Tollgate-Model) and when the gateway verifies itself: a key allowed only another model is
    refused whatever it names in the body or the query; a key allowed this one is served."""
    client = gateway.stage.client
    _account, owner = await signup(client)
    allowed = await new_key(client, owner, allowed_models=[fake_model.QUALIFIED])
    other = await new_key(client, owner, allowed_models=["openai/gpt-4o"])
    verifying = create_app(GatewaySettings(f"http://{gateway.stage.tollgate}", gateway.token, token_delay=0.0))

    def direct() -> httpx.AsyncClient:  # the gateway verifying each call itself (no ingress)
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=verifying))

    for base, http in ((f"{gateway.url}/v1", lambda: None), ("http://gw/v1", direct)):
        for key, served in ((allowed, True), (other, False)):
            async with openai.AsyncOpenAI(base_url=base, api_key=key["key"], max_retries=0, http_client=http()) as ai:
                try:
                    await ai.chat.completions.create(
                        model="openai/gpt-4o", messages=HELLO, max_tokens=1, extra_query={"model": "openai/gpt-4o"}
                    )
                    outcome = "served"
                except openai.PermissionDeniedError as refused:
                    outcome = refused.response.json()["error"]["code"]
            assert outcome == ("served" if served else "model_not_allowed"), (base, key["allowed_models"])


async def test_a_free_key_past_its_rate_limit_is_a_rate_limit_error_with_retry_after(gateway: Gateway):
    _account, owner = await signup(gateway.stage.client)
    key = await new_key(gateway.stage.client, owner)
    async with _openai(gateway, key["key"]) as ai:
        # The free plan's burst is 20: 30 calls at once (one by one, the bucket refills as fast).
        calls = (ai.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=1) for _ in range(30))
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert errors and all(isinstance(e, openai.RateLimitError) for e in errors), errors
    limited = pytest.ExceptionInfo.from_exception(errors[0])
    assert limited.value.status_code == 429
    assert int(limited.value.response.headers["retry-after"]) >= 1
    assert limited.value.response.json()["error"]["code"] == "rate_limited"


async def test_50_concurrent_streams_never_spend_more_than_the_quota(gateway: Gateway):
    tollgate_at = gateway.stage.tollgate
    client, edge = gateway.stage.client, gateway.stage.app.state.runtime.edge  # type: ignore[attr-defined]
    account, owner = await signup(client)
    account_id = uuid.UUID(account["id"])
    key = await new_key(client, owner)
    # A professional plan (its rate limit lets 50 calls through at once), almost spent: room for
    # about ten holds of prompt + max_tokens.
    order = await client.post("/api/billing/orders", json={"kind": "plan_upgrade", "plan": "professional"}, headers=owner)
    assert order.status_code == 201, order.text
    assert (await client.post(f"/api/billing/orders/{order.json()['id']}/pay", headers=owner)).status_code == 200
    messages = [{"role": "user", "content": "count to ten"}]
    hold = fake_model.prompt_tokens([("user", "count to ten")]) + 30
    room = 10 * hold
    async with AsyncTollgate(f"http://{tollgate_at}", gateway.token) as tollgate:
        await tollgate.report([UsageEvent(account_id, "ai_tokens", PROFESSIONAL_TOKENS - room, source="test")])

    def position() -> tuple[int, int, int]:
        return tuple(edge.quota.position(account_id, Resource.AI_TOKENS, datetime.now(UTC)))

    async def spent_and_upgraded() -> bool:
        burst = edge.plans.rate_limit(account_id).burst
        return position() == (PROFESSIONAL_TOKENS - room, 0, PROFESSIONAL_TOKENS) and burst >= 50

    await wait_until(spent_and_upgraded, timeout=30)

    async def one(ai: openai.AsyncOpenAI) -> int | str:
        try:
            stream = await ai.chat.completions.create(
                model="gpt-4o", messages=messages, max_tokens=30, stream=True, stream_options={"include_usage": True}
            )
            total = 0
            async for chunk in stream:
                total = chunk.usage.total_tokens if chunk.usage else total
            return total
        except openai.PermissionDeniedError as refused:
            return str(refused.response.json()["error"]["code"])

    async with _openai(gateway, key["key"]) as ai:
        outcomes = await asyncio.gather(*(one(ai) for _ in range(50)))
    served = [o for o in outcomes if isinstance(o, int)]
    assert served and all(0 < o <= hold for o in served), outcomes
    assert len(served) <= room // min(served) < 50  # the quota, not the callers, bound what was served
    assert {o for o in outcomes if isinstance(o, str)} <= {"insufficient_quota"}, outcomes
    expected = PROFESSIONAL_TOKENS - room + sum(served)

    async def settled() -> bool:
        return position()[:2] == (expected, 0)

    await wait_until(settled, timeout=30)  # every hold settled or released: reserved back to 0
    used, _reserved, total = position()
    assert used <= total, f"overshot by {used - total}"
    quota = (await client.get("/api/ai/usage/quota", headers=owner)).json()
    tokens = next(i for i in quota["items"] if i["resource"] == "ai_tokens")
    assert tokens["used"] == expected and tokens["used"] <= tokens["total"] == PROFESSIONAL_TOKENS
