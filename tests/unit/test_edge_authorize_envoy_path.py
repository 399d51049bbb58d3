"""authorize in Envoy's shape (`/api/edge/authorize/{path}`) judges the original path as the caller
sent it: a percent-encoded `?` (`%3F`) is part of the path, not the start of a query. Judged on
the decoded path, `POST /v1/chat/completions%3F/../../admin` was cut at the decoded `?` to
`/v1/chat/completions`, which a key allowed only that route passed, dot segments unseen, while
an upstream that resolves dot segments serves `/admin` (fresh-eyes review 2, finding F1)."""

import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import pytest

from contracts.common import Role
from contracts.credentials import hash_secret
from contracts.events import KeyState
from services.edge.edge import Edge
from tests.unit.test_edge_verify_fast import VERIFIER, app  # noqa: F401 - the fixture

NARROW = "sk-" + "n" * 43
PREFIX = "/api/edge/authorize"


def narrow_key(edge: Edge, **rules: Any) -> None:
    state = KeyState(
        time=datetime.now(UTC), account_id=uuid.uuid4(), key_id=uuid.uuid4(), hash=hash_secret(NARROW),
        status="enabled", roles=[Role.OWNER], **rules,
    )  # fmt: skip
    edge.keys.apply(state)


async def envoy(asgi: Any, method: str, raw: str, query: bytes = b"", *, raw_path: bool = True) -> tuple[int, dict[str, str]]:
    """Envoy's auth request for `method raw`, as uvicorn hands it over: `path` decoded, `raw_path` not
    (`raw_path=False`: a server that gives no `raw_path`)."""
    target = PREFIX + raw
    headers = [(b"host", b"tollgate"), (b"authorization", f"Bearer {NARROW}".encode()),
               (b"x-tollgate-service-token", VERIFIER.encode()), (b"x-forwarded-for", b"203.0.113.7")]  # fmt: skip
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": unquote(target), "raw_path": target.encode(), "query_string": query, "root_path": "",
        "headers": headers, "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000), "state": {},
    }  # fmt: skip
    if not raw_path:
        del scope["raw_path"]
    sent: list[Any] = []

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    await asgi(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}


@pytest.mark.parametrize(
    "raw",
    [
        "/v1/chat/completions%3F/../../admin",
        "/v1/chat/completions%3f/..%2F..%2Fadmin",
        "/v1/chat/completions%3F",
        "/v1/chat/completions%253F/../../admin",
    ],
)
@pytest.mark.parametrize("raw_path", [True, False])
async def test_an_encoded_question_mark_is_part_of_the_path(app: Any, raw: str, raw_path: bool) -> None:  # noqa: F811
    narrow_key(app.state.runtime.edge, allowed_routes=["POST /v1/chat/completions"])
    status, headers = await envoy(app, "POST", raw, raw_path=raw_path)
    assert status == 403, raw
    assert '"route_not_allowed"' in headers["x-tollgate-error"]


async def test_the_allowed_route_and_its_query_still_pass(app: Any) -> None:  # noqa: F811
    narrow_key(app.state.runtime.edge, allowed_routes=["POST /v1/chat/completions", "GET /v1/chat/*"])
    assert (await envoy(app, "POST", "/v1/chat/completions", b"stream=true"))[0] == 200
    assert (await envoy(app, "GET", "/v1/chat/a%20b"))[0] == 200
    status, headers = await envoy(app, "GET", "/v1/chat/%2e%2e/admin")
    assert status == 403 and '"route_not_allowed"' in headers["x-tollgate-error"]
