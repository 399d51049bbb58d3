"""Accounts, sessions and keys through the real keys endpoints; polling without sleeps-as-asserts."""

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

T = TypeVar("T")
PASSWORD = "correct horse battery staple"


@dataclass
class Account:
    id: str
    email: str
    password: str
    headers: dict[str, str]  # the console session


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_contract_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """The contract's error body: {"error": {"code", "message", "request_id"}} matching X-Request-ID."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    error = response.json()["error"]
    assert isinstance(error["code"], str) and error["message"] and error["request_id"] == response.headers["X-Request-ID"]
    if code is not None:
        assert error["code"] == code, error
    return error


async def new_account(client: httpx.AsyncClient, user_type: str = "individual") -> Account:
    email = f"u{uuid.uuid4().hex[:12]}@example.com"
    registered = await client.post(
        "/api/auth/register", json={"email": email, "password": PASSWORD, "name": "Hostile Test", "user_type": user_type}
    )
    assert registered.status_code == 201, registered.text
    login = await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})
    assert login.status_code == 200, login.text
    return Account(registered.json()["id"], email, PASSWORD, bearer(login.json()["access_token"]))


async def new_key(client: httpx.AsyncClient, account: Account, name: str = "hostile") -> dict[str, Any]:
    created = await client.post("/api/api-keys", json={"name": name}, headers=account.headers)
    assert created.status_code == 201, created.text
    return dict(created.json())


async def eventually(probe: Callable[[], Awaitable[T | bool | None]], within: float = 30.0, what: str = "") -> T:
    """Poll `probe` until it returns something truthy; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = await probe()
        if result:
            return result  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what or probe}")
        await asyncio.sleep(0.1)
