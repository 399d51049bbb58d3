"""The request an ingress asks Tollgate about is the one the caller really sent: a caller's own
X-Forwarded-Method / X-Forwarded-Uri (or X-Original-*) never replace it, so a key's
allowed_routes cannot be dodged through the shipped snippets (and the activity log is true)."""

from pathlib import Path

import httpx
import pytest

from tests.integration.test_ingress_snippets import INGRESSES, Stage, _body, _installed, stage  # noqa: F401
from tests.integration.test_keys_api import bearer, new_key, signup

pytestmark = pytest.mark.integration

FORGED_REQUEST = {
    "X-Forwarded-Method": "GET",
    "X-Forwarded-Uri": "/v1/models",
    "X-Original-Method": "GET",
    "X-Original-URI": "/v1/models",
}


@pytest.mark.parametrize("kind", ["nginx", "caddy"])
async def test_a_caller_cannot_name_the_route_the_ingress_judges(stage: Stage, kind: str, tmp_path: Path):  # noqa: F811
    if not _installed(kind):
        pytest.fail(f"{kind} is not installed")
    _, owner = await signup(stage.client)
    key = await new_key(stage.client, owner)
    patched = await stage.client.patch(f"/api/api-keys/{key['id']}", headers=owner, json={"allowed_routes": ["GET /v1/models"]})
    assert patched.status_code == 200, patched.text
    with INGRESSES[kind](stage, tmp_path) as ingress:
        async with httpx.AsyncClient(base_url=ingress, timeout=10) as http:
            allowed = await http.get("/v1/models", headers=bearer(key["key"]))
            assert allowed.status_code == 200, allowed.text
            outside = await http.get("/v1/secret", headers={**bearer(key["key"]), **FORGED_REQUEST})
            assert (outside.status_code, _body(outside)["error"]["code"]) == (403, "route_not_allowed"), outside.text


@pytest.mark.parametrize("kind", ["nginx", "caddy"])
async def test_a_request_authorize_cannot_judge_is_the_contracts_422_not_a_retryable_503(
    stage: Stage,  # noqa: F811
    kind: str,
    tmp_path: Path,
):
    """A path verify's model refuses (longer than 512 characters): the route's 422 reaches the
    caller through every ingress, never nginx's 503 `service_unavailable` with `Retry-After`, which
    tells a client to retry, forever, a request that can never pass."""
    if not _installed(kind):
        pytest.fail(f"{kind} is not installed")
    _, owner = await signup(stage.client)
    key = await new_key(stage.client, owner)
    with INGRESSES[kind](stage, tmp_path) as ingress:
        async with httpx.AsyncClient(base_url=ingress, timeout=10) as http:
            answer = await http.get("/v1/" + "a" * 600, headers=bearer(key["key"]))
            assert (answer.status_code, _body(answer)["error"]["code"]) == (422, "validation_error"), answer.text
            assert "retry-after" not in answer.headers
