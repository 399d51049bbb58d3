"""Helpers for metering's integration tests: a signed-in account without the keys service,
usage and call events on the real topics, polling without sleeps longer than needed."""

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from faststream.kafka import KafkaBroker
from pydantic import BaseModel

from contracts.common import KeyStatus, Resource, Role, UserType
from contracts.credentials import hash_secret
from contracts.events import AccountState, KeyState, UsageEvent
from contracts.topics import ACCOUNTS
from services.edge import sessions
from services.metering.consumers import Sink
from services.runtime.platform.settings import Settings

T = TypeVar("T")


def metering_sink(app: Any) -> Sink:
    """The metering sink of an app that runs the metering service (its consumers are aiokafka's
    own, not FastStream subscribers)."""
    (metering,) = [c for c in app.state.components if c.name == "metering"]
    (sink,) = metering.consumers
    assert isinstance(sink, Sink)
    return sink


def session_token(settings: Settings, account_id: uuid.UUID) -> str:
    """A console session token signed like the edge signs them (same SESSION_SECRET)."""
    now = time.time()
    claims = sessions.SessionClaims(account_id, "sid", int(now) + 3600, now)  # issued now: the edge bounds a session's age
    return sessions.issue(settings.session_secret.get_secret_value().encode(), claims)


async def publish_account(broker: KafkaBroker, settings: Settings, account_id: uuid.UUID, roles: list[Role]) -> None:
    state = AccountState(account_id=account_id, time=datetime.now(UTC), roles=roles, user_type=UserType.INDIVIDUAL)
    await broker.publish(state, settings.topic(ACCOUNTS.name), key=str(account_id).encode())


async def sign_in(app: Any, roles: list[Role] | None = None) -> tuple[uuid.UUID, dict[str, str]]:
    """A new account known to the in-process edge, and headers carrying its console session."""
    runtime = app.state.runtime
    account_id = uuid.uuid4()
    await publish_account(runtime.broker, runtime.settings, account_id, [Role.OWNER] if roles is None else roles)
    await wait_until(lambda: _known(runtime, account_id), timeout=20)
    token = runtime.edge.issue_session(account_id, "sid", datetime.now(UTC))
    return account_id, {"Authorization": f"Bearer {token}"}


async def _known(runtime: Any, account_id: uuid.UUID) -> bool:
    return runtime.edge.accounts.get(account_id) is not None


def key_state(account: uuid.UUID, key: uuid.UUID, mask: str, **rules: Any) -> KeyState:
    """An owner's enabled key as keys.v1 carries it; `rules`: its limits, allowed_models, version."""
    return KeyState(
        time=datetime.now(UTC),
        account_id=account,
        key_id=key,
        hash=hash_secret(str(key)),
        status=KeyStatus.ENABLED,
        roles=[Role.OWNER],
        masked_key=mask,
        **rules,
    )


def ai_tokens(
    t: datetime, account: uuid.UUID, key: uuid.UUID | None, n: int, provider: str = "openai", model: str = "gpt-4o"
) -> UsageEvent:
    """`n` AI tokens of `provider/model` used at `t` by the account, through `key` (None: no key)."""
    return UsageEvent(
        time=t,
        account_id=account,
        resource=Resource.AI_TOKENS,
        quantity=n,
        provider=provider,
        model=model,
        source="t",
        api_key_id=key,
    )


async def publish_all(
    broker: KafkaBroker, topic: str, events: list[BaseModel], key_of: Callable[[Any], bytes], *, stamped: bool = False
) -> None:
    """Publish concurrently (the producer batches them) and wait for every ack. `stamped`: each
    record's timestamp is its event's `time`, as a backfill of history sets it (usage.v1's
    consumers judge an event's time against its record's: contracts/usage_rules.py)."""

    def stamp(e: Any) -> int | None:
        return int(e.time.timestamp() * 1000) if stamped else None

    for i in range(0, len(events), 2000):
        await asyncio.gather(*(broker.publish(e, topic, key=key_of(e), timestamp_ms=stamp(e)) for e in events[i : i + 2000]))


async def wait_until(check: Callable[[], Awaitable[T]], timeout: float = 30, interval: float = 0.1) -> T:  # noqa: ASYNC109
    """Poll `check` until it returns something truthy; fail with the last value after `timeout`."""
    deadline = time.monotonic() + timeout
    last: T = await check()
    while not last:
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met in {timeout}s; last value: {last!r}")
        await asyncio.sleep(interval)
        last = await check()
    return last
