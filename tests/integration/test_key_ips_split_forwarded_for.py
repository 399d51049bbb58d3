"""(v4) X-Forwarded-For sent as several header lines (HAProxy's `option forwardfor` adds a line
of its own; RFC 9110 5.3: the lines are one comma-separated list) is read as a whole: the
rightmost untrusted hop is the proxy's line, never a line the caller wrote above it."""

import pytest

from tests.integration.test_edge_verify import AUTHORIZE, service_token
from tests.integration.test_keys_api import bearer, code, new_key, signup
from tests.support.apps import running_app

pytestmark = pytest.mark.integration
OFFICE = ["198.51.100.0/24"]


async def test_a_callers_own_forwarded_for_line_is_not_its_address(settings):
    trusting = settings.model_copy(update={"trusted_proxies": ["127.0.0.1/32"]})
    async with running_app(trusting) as (_app, client):
        _, owner = await signup(client)
        key = await new_key(client, owner, allowed_ips=OFFICE)
        token = await service_token(client, trusting, ["keys:verify"], name="ingress")
        # the caller (203.0.113.1, outside the office) wrote the first line; its proxy added the second
        lines = [("X-Forwarded-For", "198.51.100.9"), ("X-Forwarded-For", "203.0.113.1")]

        route = await client.get("/api/geo/projects", headers=[*bearer(key["key"]).items(), *lines])
        assert (route.status_code, code(route)) == (403, "ip_not_allowed"), route.text

        forwarded = [("X-Tollgate-Service-Token", token), ("X-Forwarded-Method", "POST"), ("X-Forwarded-Uri", "/v1/chat")]
        authorized = await client.get(AUTHORIZE, headers=[*bearer(key["key"]).items(), *forwarded, *lines])
        assert (authorized.status_code, code(authorized)) == (403, "ip_not_allowed"), authorized.text
