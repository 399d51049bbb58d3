"""Service tokens (`st-...`) for tests: the only credential that may write usage."""

from typing import Any

import httpx

from contracts.common import ServiceScope
from contracts.credentials import hash_secret
from services.keys import operator_cli
from services.runtime.platform.settings import Settings
from tests.support.metering import wait_until

ADMIN_PATH = "/api/admin/service-tokens"


def admin_headers(settings: Settings) -> dict[str, str]:
    assert settings.admin_token is not None, "the test settings carry an ADMIN_TOKEN"
    return {"Authorization": f"Bearer {settings.admin_token.get_secret_value()}"}


async def create_service_token(client: httpx.AsyncClient, settings: Settings, name: str = "test platform service") -> dict:
    """A new `usage:write` token through the operator's API: the 201 body (`id`, `token`, ...)."""
    response = await client.post(ADMIN_PATH, json={"name": name, "scopes": ["usage:write"]}, headers=admin_headers(settings))
    assert response.status_code == 201, response.text
    return dict(response.json())


async def service_headers(client: httpx.AsyncClient, settings: Settings) -> dict[str, str]:
    """Authorization headers of a fresh `usage:write` service token (in force in `client`'s process)."""
    return {"Authorization": f"Bearer {(await create_service_token(client, settings))['token']}"}


async def operator_service_headers(app: Any, name: str = "test platform service") -> dict[str, str]:
    """A `usage:write` token made the way `tollgate service-token create` makes it (Postgres and
    Kafka, no HTTP): for an app that does not run the keys service. Returns once `app`'s edge knows it."""
    runtime = app.state.runtime
    created = await operator_cli.create(runtime.settings, name, [ServiceScope.USAGE_WRITE])
    digest = hash_secret(created["token"])

    async def known() -> bool:
        return runtime.edge.service_tokens.get(digest) is not None

    await wait_until(known, timeout=20, interval=0.01)
    return {"Authorization": f"Bearer {created['token']}"}
