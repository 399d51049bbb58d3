"""The OpenAPI and AsyncAPI documents are generated from the code (`tollgate docs`)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.runtime.host.cli import app


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tollgate docs` once for the module: building every service's app is the slow part."""
    out = tmp_path_factory.mktemp("docs")
    result = CliRunner().invoke(app, ["docs", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_tollgate_docs_writes_openapi_and_asyncapi(docs):
    openapi = json.loads((docs / "openapi.json").read_text())
    asyncapi = json.loads((docs / "asyncapi.json").read_text())
    assert openapi["openapi"].startswith("3.") and openapi["info"]["title"] == "Tollgate"
    assert asyncapi["asyncapi"].startswith("3.")


def test_every_subscriber_has_its_own_operation_in_asyncapi(docs):
    # Same-named handlers (every Subscriber handler is `on_message`) would overwrite each other.
    operations = set(json.loads((docs / "asyncapi.json").read_text())["operations"])
    assert {"keys.plans", "keys.audit", "quota.billing", "billing.user-types", "alerts.on_threshold"} <= operations


def test_every_operation_declares_the_credentials_it_takes(docs):
    openapi = json.loads((docs / "openapi.json").read_text())
    assert set(openapi["components"]["securitySchemes"]) == {
        "ApiKey",
        "ConsoleSession",
        "ServiceToken",
        "AdminToken",
        "IngressServiceToken",
    }

    def schemes(path: str, method: str) -> set[str]:
        return {name for alternative in openapi["paths"][path][method]["security"] for name in alternative}

    operations = [(p, m) for p, methods in openapi["paths"].items() for m in methods if p.startswith("/api/")]
    assert operations and all("security" in openapi["paths"][p][m] for p, m in operations)
    assert schemes("/api/geo/projects", "get") == {"ApiKey", "ConsoleSession"}
    assert schemes("/api/api-keys", "post") == {"ConsoleSession"}
    assert schemes("/api/account", "get") == {"ApiKey", "ConsoleSession"}  # a script learns its account id there
    assert schemes("/api/account/user-type", "put") == {"ConsoleSession"}
    assert schemes("/api/admin/accounts/{account_id}/roles", "put") == {"AdminToken"}
    assert schemes("/api/admin/service-tokens", "post") == {"AdminToken"}
    assert schemes("/api/usage/events", "post") == {"ServiceToken"}
    assert schemes("/api/billing/plans", "get") == set()  # public
    assert schemes("/api/auth/login", "post") == set()
    assert schemes("/api/audit-log", "get") == {"ConsoleSession"}
    assert schemes("/api/edge/verify", "post") == {"ServiceToken"}
    # an ingress's service token, in its own header: Authorization carries the caller's key
    assert schemes("/api/edge/authorize", "get") == {"IngressServiceToken"}


def test_the_audit_log_route_has_its_response_model_and_filters(docs):
    operation = json.loads((docs / "openapi.json").read_text())["paths"]["/api/audit-log"]["get"]
    assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/AuditLog"}
    assert {p["name"] for p in operation["parameters"]} == {"start", "end", "action", "limit", "cursor"}
    assert "audit:read" in operation["description"]


def test_the_overview_says_its_calls_are_not_the_api_calls_quota(docs):
    """`calls` (model calls reported as usage) and the `api_calls` quota (admitted API-key calls) read alike."""
    openapi = json.loads((docs / "openapi.json").read_text())
    described = openapi["paths"]["/api/ai/usage/overview"]["get"]["description"]
    assert "not the `api_calls` quota" in described
    assert "api_calls" in openapi["components"]["schemas"]["Overview"]["properties"]["calls"]["description"]
