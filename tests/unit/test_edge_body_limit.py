"""The body limit (services/edge/body_limit.py): a request that can carry no body passes with its own
receive and send (nothing to count, no wrapper per message); any request that can carry one is
still counted and refused past the limit, declared or chunked, over HTTP/1.1 or HTTP/2."""

import json
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from services.edge.body_limit import BodyLimitMiddleware


class Inner:
    """The app behind the limit: what it was handed, and it reads the whole body."""

    def __init__(self) -> None:
        self.handed: tuple[Receive, Send] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.handed = (receive, send)
        while (await receive()).get("more_body", False):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def serve(headers: list[tuple[bytes, bytes]], chunks: list[bytes], http_version: str = "1.1") -> tuple[int, Any, Inner]:
    inner = Inner()
    limit = BodyLimitMiddleware(inner, max_bytes=10)
    scope = {"type": "http", "http_version": http_version, "method": "POST", "path": "/", "headers": headers}
    incoming: list[Message] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ] or [{"type": "http.request", "body": b"", "more_body": False}]
    sent: list[Message] = []

    async def receive() -> Message:
        return incoming.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    await limit(scope, receive, send)
    status = sent[0]["status"]
    body = json.loads(sent[1]["body"]) if status == 413 else sent[1]["body"]
    if inner.handed is not None:
        inner.handed = (inner.handed[0] is receive, inner.handed[1] is send)  # type: ignore[assignment]
    return status, body, inner


@pytest.mark.parametrize("http_version", ["1.0", "1.1"])
async def test_a_request_without_a_body_passes_with_its_own_receive_and_send(http_version: str) -> None:
    status, body, inner = await serve([(b"host", b"t")], [], http_version)
    assert (status, body, inner.handed) == (200, b"ok", (True, True))


@pytest.mark.parametrize(
    ("name", "headers", "chunks", "http_version"),
    [
        ("declared over the limit", [(b"content-length", b"11")], [b"x" * 11], "1.1"),
        ("chunked over the limit", [(b"transfer-encoding", b"chunked")], [b"x" * 6, b"x" * 6], "1.1"),
        ("HTTP/2 needs neither header", [], [b"x" * 6, b"x" * 6], "2"),
    ],
)
async def test_a_body_over_the_limit_is_still_refused(
    name: str, headers: list[tuple[bytes, bytes]], chunks: list[bytes], http_version: str
) -> None:
    status, body, _ = await serve(headers, chunks, http_version)
    assert (status, body["error"]["code"]) == (413, "payload_too_large"), name


async def test_a_body_within_the_limit_is_counted_and_served() -> None:
    status, body, inner = await serve([(b"transfer-encoding", b"chunked")], [b"x" * 5, b"x" * 5])
    assert (status, body) == (200, b"ok") and inner.handed == (False, False)  # counted on the way in
