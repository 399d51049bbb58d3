"""(v4, #40) A key's own limit holds for what the Python client and the example AI gateway
reserve, on the real stack over real HTTP: a reservation made for a key's call carries the key,
so it must fit the key's limit as well as the account's quota, and its settlement counts against
the key. Without it, concurrent streams on a key with 100 ai_tokens a month spend past it (each
hold judged against the account's 100,000 only)."""

import asyncio
import sys
import uuid
from datetime import UTC, datetime

import httpx
import pytest

from tests.integration.test_edge_verify import service_token
from tests.integration.test_ingress_snippets import Stage, stage  # noqa: F401 - the fixture
from tests.integration.test_keys_api import bearer, new_key, signup
from tests.support.apps import REPO
from tests.support.metering import wait_until
from tollgate_client import AsyncTollgate, InsufficientQuota, Tollgate

sys.path.insert(0, str(REPO / "examples" / "ai-gateway"))
from ai_gateway.app import GatewaySettings, create_app

pytestmark = pytest.mark.integration
LIMIT = 100  # the key's ai_tokens a month; the free account has 100,000


async def _limited_key(stage: Stage, token: str) -> tuple[uuid.UUID, dict]:  # noqa: F811
    """An account and its key limited to LIMIT ai_tokens a month, once quota judges holds by it."""
    account, owner = await signup(stage.client)
    account_id = uuid.UUID(account["id"])
    key = await new_key(stage.client, owner, limits=[{"resource": "ai_tokens", "amount": LIMIT, "period": "month"}])
    async with AsyncTollgate(f"http://{stage.tollgate}", token) as tollgate:

        async def limited() -> bool:  # quota has the key's limit from keys.v1
            try:
                async with tollgate.reserve(account_id, "ai_tokens", LIMIT + 1, ttl=60, api_key_id=uuid.UUID(key["id"])):
                    return False  # released on leaving: nothing held
            except InsufficientQuota:
                return True

        await wait_until(limited, timeout=30)
    return account_id, key


def _key_used(stage: Stage, key_id: str) -> int:  # noqa: F811
    edge = stage.app.state.runtime.edge  # type: ignore[attr-defined]
    [usage] = edge.key_usage(uuid.UUID(key_id), datetime.now(UTC))
    return int(usage.used)


async def test_the_clients_reservation_for_a_key_fits_its_limit_and_settles_against_it(stage: Stage):  # noqa: F811
    token = await service_token(stage.client, stage.app.state.runtime.settings, ["keys:verify", "usage:write"])  # type: ignore[attr-defined]
    account_id, key = await _limited_key(stage, token)
    key_id = uuid.UUID(key["id"])
    async with AsyncTollgate(f"http://{stage.tollgate}", token) as tollgate:
        async with tollgate.reserve(account_id, "ai_tokens", 80, ttl=60, api_key_id=key_id) as hold:
            # 80 held for the key: 21 more do not fit the key's 100, whatever the account has left
            with pytest.raises(InsufficientQuota) as refused:
                async with tollgate.reserve(account_id, "ai_tokens", 21, ttl=60, api_key_id=key_id):
                    pytest.fail("a hold past the key's limit was made")
            assert refused.value.details["scope"] == "api_key" and refused.value.details["total"] == LIMIT
            hold.settle(70)  # counted against the key it was held for (no api_key_id given again)

        async def settled() -> bool:
            return _key_used(stage, key["id"]) == 70

        await wait_until(settled, timeout=30)

    def blocking_hold() -> InsufficientQuota:  # in a thread: the server runs on this loop
        with Tollgate(f"http://{stage.tollgate}", token) as blocking, pytest.raises(InsufficientQuota) as refused:
            with blocking.reserve(account_id, "ai_tokens", 31, ttl=60, api_key_id=key_id):
                pytest.fail("a hold past the key's limit was made (sync)")
        return refused.value

    assert (await asyncio.to_thread(blocking_hold)).details["scope"] == "api_key"


async def test_concurrent_streams_through_the_example_gateway_never_spend_past_a_keys_limit(stage: Stage):  # noqa: F811
    token = await service_token(stage.client, stage.app.state.runtime.settings, ["keys:verify", "usage:write"])  # type: ignore[attr-defined]
    _account_id, key = await _limited_key(stage, token)
    gateway = create_app(GatewaySettings(f"http://{stage.tollgate}", token, token_delay=0.02))
    body = {"model": "anything", "messages": [{"role": "user", "content": "hello there tollgate"}], "max_tokens": 20}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://gw", timeout=30) as http:
        answers = await asyncio.gather(
            *(http.post("/v1/chat/completions", json=body, headers=bearer(key["key"])) for _ in range(10))
        )
    served = [a.json()["usage"]["total_tokens"] for a in answers if a.status_code == 200]
    refused = [a.json()["error"] for a in answers if a.status_code != 200]
    assert served and refused, [a.status_code for a in answers]
    assert all(e["code"] == "insufficient_quota" and e["details"]["scope"] == "api_key" for e in refused), refused
    assert sum(served) <= LIMIT  # each hold (prompt + max_tokens = 26) fit the key's limit when made

    async def counted() -> bool:
        return _key_used(stage, key["id"]) == sum(served)

    await wait_until(counted, timeout=30)
