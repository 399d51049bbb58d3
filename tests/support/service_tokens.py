"""Service tokens (`st-...`) for tests: the only credential that may write usage."""

import httpx

from services.runtime.settings import Settings

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
