"""A caller's `Connection` header names hop-by-hop headers, which a proxy drops before it forwards
the request. Through the shipped snippets it must not drop what the ingress itself sets for
Tollgate: the resource the location gates on (`X-Tollgate-Resource`), the model, the original
method and URI. Dropped, a spent account's key was let through to the upstream (fresh-eyes
review 2, finding F3)."""

import uuid
from pathlib import Path

import httpx
import pytest

from tests.integration.test_ingress_snippets import INGRESSES, Stage, _body, _exhaust_ai_tokens, _installed, stage  # noqa: F401
from tests.integration.test_keys_api import bearer, new_key, signup

pytestmark = pytest.mark.integration
NAMED = "X-Tollgate-Resource, X-Tollgate-Model, X-Forwarded-Method, X-Forwarded-Uri, X-Tollgate-Service-Token"


@pytest.mark.parametrize("kind", ["nginx", "caddy"])
async def test_a_caller_cannot_drop_what_the_ingress_sets_for_tollgate(stage: Stage, kind: str, tmp_path: Path):  # noqa: F811
    if not _installed(kind):
        pytest.fail(f"{kind} is not installed")
    account, owner = await signup(stage.client)
    spent = await new_key(stage.client, owner)
    narrow = await new_key(stage.client, owner)
    patched = await stage.client.patch(
        f"/api/api-keys/{narrow['id']}", headers=owner, json={"allowed_routes": ["GET /v1/models"]}
    )
    assert patched.status_code == 200, patched.text
    await _exhaust_ai_tokens(stage, uuid.UUID(account["id"]))
    hop = {"Connection": f"keep-alive, {NAMED}", "X-Original-URI": "/v1/models", "X-Original-Method": "GET"}
    with INGRESSES[kind](stage, tmp_path) as ingress:
        async with httpx.AsyncClient(base_url=ingress, timeout=10) as http:
            exhausted = await http.get("/v1/models", headers={**bearer(spent["key"]), **hop})
            assert exhausted.status_code == 403, exhausted.text
            assert _body(exhausted)["error"]["code"] == "insufficient_quota"
            outside = await http.get("/v1/secret", headers={**bearer(narrow["key"]), **hop})
            assert outside.status_code == 403, outside.text
            assert _body(outside)["error"]["code"] in ("route_not_allowed", "insufficient_quota")
