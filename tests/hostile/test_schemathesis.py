"""schemathesis over the whole app's generated OpenAPI, against a real `tollgate serve --target all`:
with a console session and without credentials, for every operation: no 5xx, every status
documented for its operation, every error in the contract's body with the response's
X-Request-ID, every response in its documented schema and content type. Bounded: a dozen
examples per operation (positive and negative data)."""

import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance, status_code_conformance

from tests.hostile.conftest import Served

pytestmark = pytest.mark.integration

MAX_EXAMPLES = 12  # per operation and credential (at least 10 a call checks below); the slowest module at 20
PASSWORD = "schemathesis-pass-1"
LOGOUT = "POST /api/auth/logout"  # ends the session it is called with: fuzzed with fresh ones


def contract_error_body(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every status >= 400: {"error": {"code", "message", "request_id"}} and request_id == X-Request-ID."""
    if response.status_code < 400:
        return None
    seen = f"{case.method} {case.formatted_path} -> {response.status_code} {response.headers} {response.text[:500]}"
    error = response.json()["error"]
    assert isinstance(error["code"], str) and error["code"].islower(), seen
    assert isinstance(error["message"], str) and error["message"], seen
    assert [error["request_id"]] == response.headers.get("x-request-id"), seen
    return True


CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, content_type_conformance, contract_error_body]


@pytest.fixture(scope="module")
def new_session(served: Served) -> Callable[[], dict[str, str]]:
    """Logs in again (a new session of the same account) at every call."""
    email = f"s{uuid.uuid4().hex[:10]}@example.com"
    body = {"email": email, "password": PASSWORD, "name": "fuzz", "user_type": "enterprise"}
    assert httpx.post(f"{served.base_url}/api/auth/register", json=body, timeout=30).status_code == 201

    def login() -> dict[str, str]:
        response = httpx.post(f"{served.base_url}/api/auth/login", json={"email": email, "password": PASSWORD}, timeout=30)
        assert response.status_code == 200, response.text
        return {"Authorization": f"Bearer {response.json()['access_token']}"}

    return login


@pytest.fixture(scope="module")
def console_session(new_session: Callable[[], dict[str, str]]) -> dict[str, str]:
    return new_session()


def _fuzz(
    served: Served, headers: dict[str, str], examples: int, new_session: Callable[[], dict[str, str]] | None = None
) -> None:
    """Each operation, positive and negative data; collect every failure, then report them all.
    (schemathesis' own pytest loader, `from_fixture`, does not run on pytest 9: this drives its
    strategies with Hypothesis directly.)"""
    schema = schemathesis.openapi.from_url(f"{served.base_url}/openapi.json")
    failures: list[str] = []
    operations = calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=examples,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=True,
                database=None,
                phases=[Phase.explicit, Phase.generate],  # no shrinking: report, do not minimise
            )
            def run(case: Any) -> None:
                nonlocal calls
                calls += 1
                if case.headers:
                    case.headers.pop("Authorization", None)
                sent = new_session() if new_session is not None and operation.label == LOGOUT else headers
                case.call_and_validate(base_url=served.base_url, headers=sent, checks=CHECKS, timeout=30)

            try:
                run()
            except Unsatisfiable:
                pass  # nothing to make negative: the operation takes no parameters and no body
            except Exception as exc:  # every operation is tried, all failures reported
                failures.append(f"{operation.label} [{mode.value}]: {str(exc)[:1500]}")
    assert operations >= 30 and calls >= 10 * operations, (operations, calls)
    assert not failures, "\n\n".join(failures)


def test_every_operation_with_a_console_session(
    served: Served, console_session: dict[str, str], new_session: Callable[[], dict[str, str]]
):
    _fuzz(served, console_session, MAX_EXAMPLES, new_session)


def test_every_operation_without_credentials(served: Served):
    _fuzz(served, {}, MAX_EXAMPLES // 2)
