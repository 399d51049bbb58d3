"""(v4, #40) A key's `allowed_ips` judge the caller's address as the edge sees it behind
`TRUSTED_PROXIES`, IPv4 and IPv6, on a route of Tollgate's own and through authorize: the
rightmost untrusted hop of X-Forwarded-For, never an address the caller wrote to its left; each
refusal is 403 `ip_not_allowed` and counts nothing."""

import uuid
from datetime import UTC, datetime

import pytest

from contracts.common import Resource
from tests.integration.test_edge_verify import AUTHORIZE, service_token
from tests.integration.test_keys_api import bearer, code, new_key, signup
from tests.support.apps import running_app
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration
OFFICE = ["198.51.100.0/24", "2001:db8:4::/48"]


async def test_allowed_ips_judge_the_address_behind_trusted_proxies_ipv4_and_ipv6(settings):
    # the test client's peer (127.0.0.1) is the ingress; 10/8 and fd00::/8 are inner proxies
    trusting = settings.model_copy(update={"trusted_proxies": ["127.0.0.1/32", "10.0.0.0/8", "fd00::/8"]})
    async with running_app(trusting) as (app, client):
        account, owner = await signup(client)
        key = await new_key(client, owner, allowed_ips=OFFICE)
        token = await service_token(client, trusting, ["keys:verify"], name="ingress")

        async def route(forwarded_for: str) -> tuple[int, str]:
            answer = await client.get("/api/geo/projects", headers={**bearer(key["key"]), "X-Forwarded-For": forwarded_for})
            return answer.status_code, "" if answer.status_code == 200 else code(answer)

        async def authorize(forwarded_for: str) -> tuple[int, str]:
            headers = {
                "X-Tollgate-Service-Token": token,
                **bearer(key["key"]),
                "X-Forwarded-Method": "POST",
                "X-Forwarded-Uri": "/v1/chat/completions",
                "X-Forwarded-For": forwarded_for,
            }
            answer = await client.get(AUTHORIZE, headers=headers)
            return answer.status_code, "" if answer.status_code == 200 else code(answer)

        refused = (403, "ip_not_allowed")
        assert await route("2001:db8:4::7") == (200, "")
        assert await route("198.51.100.9, 10.1.2.3, fd00::5") == (200, "")  # through inner proxies
        assert await route("2001:db8:5::7") == refused
        assert await route("2001:db8:4::7, 203.0.113.1") == refused  # what the caller wrote is not believed
        assert await authorize("2001:db8:4:ffff::1, fd00::1") == (200, "")
        assert await authorize("2001:db9::1") == refused
        assert await authorize("::ffff:198.51.100.20") == (200, "")  # an IPv4 address in IPv6 form

        edge = app.state.runtime.edge

        async def counted() -> bool:  # the 4 admitted calls only
            state = edge.quota.get(uuid.UUID(account["id"]), Resource.API_CALLS)
            return state is not None and state.used == 4

        await wait_until(counted, timeout=20)
        assert edge.quota.position(uuid.UUID(account["id"]), Resource.API_CALLS, datetime.now(UTC))[0] == 4
