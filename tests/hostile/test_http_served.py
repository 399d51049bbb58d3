"""Hostile HTTP against a real `tollgate serve` (uvicorn, sockets): oversized heads, URLs, query
strings and bodies are refused with a bounded 4xx; then schemathesis over the whole OpenAPI."""

import socket
import time

import httpx
import pytest

from services.edge.body_limit import MAX_BODY_BYTES
from services.runtime.host.http_limits import MAX_HEAD_BYTES, MAX_URL_BYTES
from tests.hostile.conftest import Served

pytestmark = pytest.mark.integration


def _raw(served: Served, head: bytes, *, read: bool = True) -> tuple[int, bytes]:
    """Send a raw request head; return the status and the rest of the response."""
    with socket.create_connection(("127.0.0.1", served.proc.port), timeout=20) as sock:
        sock.sendall(head)
        if not read:
            return 0, b""
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    status_line, _, rest = response.partition(b"\r\n")
    return int(status_line.split()[1]), rest


def _contract_body(rest: bytes, code: str = "payload_too_large") -> None:
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"x-request-id:" in headers.lower() and b"connection: close" in headers.lower()
    import json

    error = json.loads(body)["error"]
    assert error["code"] == code and error["message"] and error["request_id"]


def test_a_huge_header_is_refused_with_431_before_the_app(served: Served):
    status, rest = _raw(served, b"GET /api/account HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 1) + b"\r\n\r\n")
    assert status == 431
    _contract_body(rest)


def test_many_small_headers_are_refused_with_431(served: Served):
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(2000))
    status, rest = _raw(served, b"GET /api/account HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert status == 431
    _contract_body(rest)


def test_an_endless_header_is_cut_off_not_buffered(served: Served):
    """The server hangs up after ~MAX_HEAD_BYTES; a client that keeps sending gets a broken pipe
    long before 200 MB (the kernel's socket buffers hold a few MB at most)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", served.proc.port), timeout=20) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        piece = b"a" * (1024 * 1024)
        with pytest.raises(OSError):
            while sent < 200 * 1024 * 1024:
                sock.sendall(piece)
                sent += len(piece)
            sock.recv(1)  # the server must have hung up by now
    assert sent < 64 * 1024 * 1024
    assert httpx.get(f"{served.base_url}/readyz", timeout=10).status_code == 200


def test_a_huge_url_is_refused_with_414(served: Served):
    status, rest = _raw(served, b"GET /api/activity-log?ip=" + b"1" * (MAX_URL_BYTES + 1) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 414
    _contract_body(rest)


def test_a_long_query_string_within_the_head_limit_is_a_422_not_a_5xx(served: Served):
    long_query = "x" * (MAX_URL_BYTES - 200)
    login = _login(served)
    for path in (
        f"/api/activity-log?ip={long_query}",
        f"/api/activity-log?cursor={long_query}",
        f"/api/ai/usage/overview?tz={long_query}",
    ):
        response = httpx.get(f"{served.base_url}{path}", headers=login, timeout=20)
        assert response.status_code == 422, (path[:40], response.text[:300])
        assert response.json()["error"]["code"] == "validation_error"
    # Unknown parameters are ignored, whatever their size, and repeated ones are bounded by the head limit.
    response = httpx.get(f"{served.base_url}/api/geo/projects?junk={long_query}", headers=login, timeout=20)
    assert response.status_code == 200


def test_huge_bodies_are_refused_with_413_declared_or_chunked(served: Served):
    too_big = b"{" + b" " * MAX_BODY_BYTES + b"}"
    response = httpx.post(f"{served.base_url}/api/auth/login", content=too_big, headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"

    def chunks():
        for _ in range(64):
            yield b"x" * (64 * 1024)

    response = httpx.post(f"{served.base_url}/api/usage/events", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"
    # Deeply nested JSON within the size limit: the parser's recursion error is a 400 validation_error
    # (FastAPI's "error parsing the body"), not a 500, and the process lives on.
    nested = b"[" * 100_000 + b"]" * 100_000
    response = httpx.post(f"{served.base_url}/api/auth/login", content=nested, headers={"content-type": "application/json"})
    assert response.status_code in (400, 422) and response.json()["error"]["code"] == "validation_error", response.text[:300]
    assert httpx.get(f"{served.base_url}/readyz", timeout=10).status_code == 200


def _login(served: Served) -> dict[str, str]:
    import uuid

    email = f"h{uuid.uuid4().hex[:10]}@example.com"
    body = {"email": email, "password": "hostile-password-1", "name": "h", "user_type": "individual"}
    assert httpx.post(f"{served.base_url}/api/auth/register", json=body, timeout=30).status_code == 201
    deadline = time.monotonic() + 30
    while True:
        login = httpx.post(f"{served.base_url}/api/auth/login", json={"email": email, "password": body["password"]}, timeout=30)
        if login.status_code == 200 or time.monotonic() > deadline:
            break
    assert login.status_code == 200, login.text
    return {"Authorization": f"Bearer {login.json()['access_token']}"}


def test_a_body_that_is_not_even_text_is_a_422(served: Served):
    """Found by schemathesis' status-code check: FastAPI answered a body it could not decode
    (not UTF-8) with 400; the contract's answer to a bad body is 422 `validation_error`."""
    for body in (b"\x2e\xff\x2d\xfe", b'{"email": "\xff"}'):
        response = httpx.post(
            f"{served.base_url}/api/auth/login", content=body, headers={"Content-Type": "application/json"}, timeout=30
        )
        assert response.status_code == 422, (body, response.status_code, response.text[:300])
        error = response.json()["error"]
        assert error["code"] == "validation_error" and error["request_id"] == response.headers["X-Request-ID"]


def test_values_the_database_cannot_store_are_a_422_never_a_500(served: Served):
    """Found by schemathesis: a NUL character in any stored text was a 500 (psycopg.DataError)."""
    session = _login(served)
    cases = [
        ("POST", "/api/geo/projects", {"name": "nul\u0000name"}, session),
        ("POST", "/api/api-keys", {"name": "key\u0000"}, session),
        (
            "POST",
            "/api/auth/register",
            {"email": "a\u0000b@example.com", "password": "x" * 12, "name": "n", "user_type": "individual"},
            {},
        ),
        ("POST", "/api/auth/login", {"email": "a\u0000b@example.com", "password": "x" * 12}, {}),
        (
            "POST",
            "/api/billing/orders",
            {"kind": "quota_package", "package": {"resource": "geo_projects", "amount": 10**15}},
            session,
        ),
        ("GET", "/api/activity-log?start=0382-01-17T22:49:20Z", None, session),
        ("GET", "/api/ai/usage/overview?range=custom&start=0382-01-17T00:00:00Z&end=0382-01-18T00:00:00Z", None, session),
    ]
    for method, path, body, headers in cases:
        response = httpx.request(method, f"{served.base_url}{path}", json=body, headers=headers, timeout=30)
        assert response.status_code == 422, (path, response.status_code, response.text[:300])
        error = response.json()["error"]
        assert error["code"] == "validation_error" and error["request_id"] == response.headers["X-Request-ID"]
