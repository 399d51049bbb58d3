"""The login and sign-up throttles hold across replicas: two platforms in this process share the
real Redis, and an attacker alternating between them gets each limit once, not twice. Without
Redis (unreachable, or accepting and never answering) a platform still logs in, throttled by its
own logs. And the script's keys on real Redis: namespaced, bounded, expiring with the window.

Each test uses addresses of its own (a random IPv6 /64) and e-mails of its own, and the keys carry
its environment's prefix and expire with the window, so no test inherits another's counts."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from argon2 import PasswordHasher
from redis.asyncio import Redis

from services.keys import login_throttle, registration_throttle
from services.keys import service as keys_service
from services.keys.attempt_logs import Log
from services.keys.redis_logs import RedisLogs
from services.keys.throttle import Limit
from services.runtime.platform.settings import Settings
from tests.hostile.helpers import PASSWORD, assert_contract_error, new_account
from tests.support.apps import free_port, running_app

pytestmark = pytest.mark.integration


def _own_address() -> str:
    """An address no other test uses: one host of a random /64 of the documentation prefix."""
    return f"2001:db8:{uuid.uuid4().hex[:4]}:{uuid.uuid4().hex[:4]}::7"


def _login(email: str, password: str, ip: str) -> dict:
    return {"json": {"email": email, "password": password}, "headers": {"X-Forwarded-For": ip}}


def _signup(ip: str) -> dict:
    body = {"email": f"r{uuid.uuid4().hex[:12]}@example.com", "password": PASSWORD, "name": "Flood", "user_type": "individual"}
    return {"json": body, "headers": {"X-Forwarded-For": ip}}


def _behind_proxy(settings: Settings) -> Settings:
    # The test client is a trusted proxy, so X-Forwarded-For gives each request its client IP.
    return settings.model_copy(update={"trusted_proxies": ["127.0.0.1/32"]})


async def test_failed_logins_alternated_between_two_replicas_meet_each_limit_once(settings: Settings, monkeypatch):
    EMAIL_LIMIT, IP_LIMIT = 3, 5
    monkeypatch.setattr(login_throttle, "EMAIL_LIMIT", EMAIL_LIMIT)
    monkeypatch.setattr(login_throttle, "IP_LIMIT", IP_LIMIT)
    settings = _behind_proxy(settings)
    async with running_app(settings) as (_a, a), running_app(settings) as (_b, b):
        victim, attacker = await new_account(a), _own_address()

        # Per e-mail: the replicas in turn, EMAIL_LIMIT failures in all; then both refuse, the right
        # password too (alone, each replica would have allowed EMAIL_LIMIT).
        for i in range(EMAIL_LIMIT):
            wrong = await (a, b)[i % 2].post("/api/auth/login", **_login(victim.email, "wrong password", attacker))
            assert_contract_error(wrong, 401, "invalid_credentials")
        for replica in (b, a):
            refused = await replica.post("/api/auth/login", **_login(victim.email, PASSWORD, _own_address()))
            assert_contract_error(refused, 429, "rate_limited")
            assert 1 <= int(refused.headers["Retry-After"]) <= login_throttle.WINDOW_S

        # Parallel guesses at both replicas at once cannot slip past the limit.
        second = await new_account(b)
        answers = await asyncio.gather(
            *(
                (a, b)[i % 2].post("/api/auth/login", **_login(second.email, f"guess {i}", _own_address()))
                for i in range(EMAIL_LIMIT + 4)
            )
        )
        assert sorted(r.status_code for r in answers) == [401] * EMAIL_LIMIT + [429] * 4

        # Per address: the attacker has IP_LIMIT - EMAIL_LIMIT failures left, on either replica.
        for i in range(IP_LIMIT - EMAIL_LIMIT):
            wrong = await (b, a)[i % 2].post("/api/auth/login", **_login(f"nobody{i}@example.com", "x" * 12, attacker))
            assert_contract_error(wrong, 401, "invalid_credentials")
        third = await new_account(a)
        for replica in (a, b):
            refused = await replica.post("/api/auth/login", **_login(third.email, PASSWORD, attacker))
            assert_contract_error(refused, 429, "rate_limited")
        assert (await b.post("/api/auth/login", **_login(third.email, PASSWORD, _own_address()))).status_code == 200


async def test_sign_ups_from_one_address_alternated_between_two_replicas_meet_the_limit_once(settings: Settings, monkeypatch):
    LIMIT = 2
    monkeypatch.setattr(keys_service, "PasswordHasher", PasswordHasher)  # production's cost: the limit applies
    monkeypatch.setattr(registration_throttle, "REGISTRATIONS_PER_IP", LIMIT)
    settings = _behind_proxy(settings)
    async with running_app(settings) as (_a, a), running_app(settings) as (_b, b):
        flooder = _own_address()
        assert (await a.post("/api/auth/register", **_signup(flooder))).status_code == 201
        assert (await b.post("/api/auth/register", **_signup(flooder))).status_code == 201
        for replica in (a, b):
            refused = await replica.post("/api/auth/register", **_signup(flooder))
            assert_contract_error(refused, 429, "rate_limited")
            assert 1 <= int(refused.headers["Retry-After"]) <= registration_throttle.WINDOW_S
        assert (await b.post("/api/auth/register", **_signup(_own_address()))).status_code == 201


@asynccontextmanager
async def _silent_redis() -> AsyncIterator[str]:
    """A Redis that accepts connections and never answers (hung, or a black hole on the way)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        for writer in held:
            writer.close()
        server.close()


@pytest.mark.parametrize("redis", ["refused", "silent"])
async def test_without_redis_login_still_works_throttled_by_the_process_alone(settings: Settings, monkeypatch, redis: str):
    EMAIL_LIMIT = 3
    monkeypatch.setattr(login_throttle, "EMAIL_LIMIT", EMAIL_LIMIT)
    async with _silent_redis() as silent:
        url = f"redis://127.0.0.1:{free_port()}/0" if redis == "refused" else silent
        settings = _behind_proxy(settings.model_copy(update={"redis_url": url}))
        async with running_app(settings) as (_app, client):
            victim, attacker = await new_account(client), _own_address()
            for _ in range(EMAIL_LIMIT):
                wrong = await client.post("/api/auth/login", **_login(victim.email, "wrong password", attacker))
                assert_contract_error(wrong, 401, "invalid_credentials")  # never a 500
            assert_contract_error(
                await client.post("/api/auth/login", **_login(victim.email, PASSWORD, attacker)), 429, "rate_limited"
            )
            other = await new_account(client)
            ok = await asyncio.wait_for(client.post("/api/auth/login", **_login(other.email, PASSWORD, attacker)), 10)
            assert ok.status_code == 200 and ok.json()["access_token"]


async def test_the_shared_logs_are_namespaced_bounded_and_expire_with_their_window(settings: Settings):
    assert settings.redis_url is not None
    logs = RedisLogs(settings.redis_url, settings.topic_prefix)
    redis: Redis[bytes] = Redis.from_url(settings.redis_url)
    try:
        log, subject = Log("login-ip", Limit(3, 60.0)), _own_address()
        key = logs.key((log, subject))
        assert key == f"{settings.topic_prefix}tollgate:throttle:login-ip:{subject}"
        counted = [await logs.count([(log, subject)]) for _ in range(3)]
        assert all(c.shared and c.wait == 0 for c in counted) and len({c.stamp for c in counted}) == 3
        refused = await logs.count([(log, subject)])
        assert 0 < refused.wait <= 60.0 and not refused.stamp  # refused: nothing counted
        assert await redis.zcard(key) == 3
        assert 0 < await redis.pttl(key) <= 60_000  # expires a window after its newest attempt

        await logs.forgive([(log, subject)], counted[1])  # one taken back: room for one more
        assert await redis.zcard(key) == 2
        assert (await logs.count([(log, subject)])).stamp
        assert (await logs.count([(log, subject)])).wait > 0
        await logs.clear([(log, subject)])
        assert not await redis.exists(key)

        # Bounded to the limit's size: a lower limit keeps only the last attempts.
        small = Log("signup-ip", Limit(2, 60.0))
        for _ in range(2):
            await logs.count([(small, subject)])
        await redis.zadd(logs.key((small, subject)), {"old": 1.0})  # long out of the window: trimmed
        assert (await logs.count([(small, subject)])).wait > 0
        assert await redis.zcard(logs.key((small, subject))) == 2
    finally:
        await logs.close()
        await redis.aclose()  # type: ignore[attr-defined]
