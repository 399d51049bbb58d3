"""Helpers of the quota and billing integration tests: accounts and keys straight on their topics."""

import asyncio
import hashlib
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
from aiokafka import AIOKafkaProducer
from fastapi import FastAPI
from pydantic import BaseModel

from contracts.common import KeyStatus, Role, UserType
from contracts.events import AccountState, KeyState
from contracts.topics import ACCOUNTS, KEYS
from services.runtime.platform.settings import Settings

T = TypeVar("T")


async def publish(settings: Settings, topic: str, events: list[BaseModel], key: Callable[[Any], str]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    await producer.start()
    try:
        for event in events:
            await producer.send_and_wait(settings.topic(topic), event.model_dump_json().encode(), key=key(event).encode())
    finally:
        await producer.stop()


async def eventually(probe: Callable[[], Awaitable[T | None]], within: float = 20.0) -> T:
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def new_account(app: FastAPI, settings: Settings, user_type: UserType = UserType.INDIVIDUAL) -> tuple[uuid.UUID, str]:
    """An account known to every service (accounts.v1) and a console session token for it."""
    account_id = uuid.uuid4()
    state = AccountState(time=datetime.now(UTC), account_id=account_id, roles=[Role.OWNER], user_type=user_type)
    await publish(settings, ACCOUNTS.name, [state], key=lambda e: str(e.account_id))
    edge = app.state.runtime.edge

    async def known() -> bool:
        return edge.accounts.get(account_id) is not None

    await eventually(known)
    return account_id, edge.issue_session(account_id, "sid", datetime.now(UTC))


async def new_api_key(app: FastAPI, settings: Settings, account_id: uuid.UUID) -> str:
    """An API key of `account_id`, published on keys.v1 as the keys service would."""
    secret = "sk-" + secrets.token_urlsafe(40)
    state = KeyState(
        time=datetime.now(UTC),
        account_id=account_id,
        key_id=uuid.uuid4(),
        hash=hashlib.sha256(secret.encode()).hexdigest(),
        status=KeyStatus.ENABLED,
        roles=[Role.OWNER],
    )
    await publish(settings, KEYS.name, [state], key=lambda e: str(e.key_id))
    edge = app.state.runtime.edge

    async def known() -> bool:
        return edge.keys.get(state.hash) is not None

    await eventually(known)
    return secret


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def api_calls_used(client: httpx.AsyncClient, console: dict[str, str]) -> int:
    """The account's api_calls used this period, as check-quota answers its console."""
    r = await client.get("/api/billing/check-quota", headers=console)
    assert r.status_code == 200, r.text
    return int(next(i for i in r.json()["items"] if i["resource"] == "api_calls")["used"])


class SettableClock:
    """A Clock for `Overrides(clock=...)`: the system's time until a test sets another moment."""

    def __init__(self) -> None:
        self.fixed: datetime | None = None

    def __call__(self) -> datetime:
        return self.fixed or datetime.now(UTC)
