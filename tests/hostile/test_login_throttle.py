"""Brute-force login throttling: per e-mail and per client IP, 429 with Retry-After, argon2 always."""

import asyncio
import itertools

import pytest
from argon2 import PasswordHasher

from services.keys import login_throttle
from services.keys.login_throttle import WINDOW_S, Limit, LoginThrottle
from services.runtime.platform.settings import Settings
from tests.hostile.helpers import PASSWORD, assert_contract_error, new_account
from tests.support.apps import running_app


def _login(email: str, password: str, ip: str) -> dict:
    return {"json": {"email": email, "password": password}, "headers": {"X-Forwarded-For": ip}}


def _retry_after(response) -> int:
    assert_contract_error(response, 429, "rate_limited")
    seconds = int(response.headers["Retry-After"])
    assert 1 <= seconds <= WINDOW_S
    return seconds


@pytest.mark.integration
async def test_logins_are_throttled_per_email_and_per_ip_and_unknown_emails_still_cost_an_argon2_check(
    settings: Settings, monkeypatch
):
    verified = itertools.count()
    real_verify = PasswordHasher.verify

    def counting_verify(self, stored, password):  # a spy on the real argon2 check, not a fake
        next(verified)
        return real_verify(self, stored, password)

    monkeypatch.setattr(PasswordHasher, "verify", counting_verify)
    # Lower limits than production's (fewer logins to make); the rules are the same.
    EMAIL_LIMIT, IP_LIMIT = 3, 9
    monkeypatch.setattr(login_throttle, "EMAIL_LIMIT", EMAIL_LIMIT)
    monkeypatch.setattr(login_throttle, "IP_LIMIT", IP_LIMIT)
    # The test client is a trusted proxy, so X-Forwarded-For gives each request its client IP.
    settings = settings.model_copy(update={"trusted_proxies": ["127.0.0.1/32"]})
    async with running_app(settings) as (_app, client):
        first, second, third = [await new_account(client) for _ in range(3)]
        attacker, other_ip = "198.51.100.7", "203.0.113.9"

        # 1. Per e-mail: EMAIL_LIMIT wrong passwords, then even the right one is refused (no oracle).
        for _ in range(EMAIL_LIMIT):
            assert_contract_error(
                await client.post("/api/auth/login", **_login(first.email, "wrong password", attacker)),
                401,
                "invalid_credentials",
            )
        before = next(verified)
        _retry_after(await client.post("/api/auth/login", **_login(first.email, PASSWORD, attacker)))
        _retry_after(await client.post("/api/auth/login", **_login(first.email.upper(), PASSWORD, other_ip)))  # any IP, any case
        assert next(verified) == before + 1, "a throttled attempt must not reach argon2"

        # 2. Parallel guesses cannot slip past the limit before the first of them has failed.
        answers = await asyncio.gather(
            *(client.post("/api/auth/login", **_login(second.email, f"guess {i}", attacker)) for i in range(EMAIL_LIMIT + 5))
        )
        assert sorted(r.status_code for r in answers) == [401] * EMAIL_LIMIT + [429] * 5

        # 3. Unknown e-mails: same answer, and argon2 still runs (timing does not reveal existence).
        unknown = IP_LIMIT - 2 * EMAIL_LIMIT
        before = next(verified)
        for i in range(unknown):
            assert_contract_error(
                await client.post("/api/auth/login", **_login(f"nobody{i}@example.com", "x" * 12, attacker)),
                401,
                "invalid_credentials",
            )
        assert next(verified) == before + 1 + unknown

        # 4. Per IP: the attacker's address has used its IP_LIMIT failures; a right password from it is refused,
        #    while the same account from another address logs in.
        _retry_after(await client.post("/api/auth/login", **_login(third.email, PASSWORD, attacker)))
        ok = await client.post("/api/auth/login", **_login(third.email, PASSWORD, other_ip))
        assert ok.status_code == 200 and ok.json()["access_token"]

        # 5. A success clears the e-mail's failures: a user who mistypes a few times is never locked out.
        for i in range(EMAIL_LIMIT - 1):
            wrong = await client.post("/api/auth/login", **_login(third.email, "typo typo", f"192.0.2.{i}"))
            assert wrong.status_code == 401
        assert (await client.post("/api/auth/login", **_login(third.email, PASSWORD, "192.0.2.200"))).status_code == 200
        wrong = await client.post("/api/auth/login", **_login(third.email, "typo typo", "192.0.2.201"))
        assert wrong.status_code == 401  # would be the EMAIL_LIMIT-th failure without the success in between


# ---- the throttle's rules with a controlled clock (no I/O) ---------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _fail(throttle: LoginThrottle, email: str, ip: str) -> None:
    from contracts.errors import ErrorCode
    from services.edge.errors import ApiError

    with pytest.raises(ApiError) as caught:
        async with throttle.attempt(email, ip):
            raise ApiError(401, ErrorCode.INVALID_CREDENTIALS, "wrong")
    assert caught.value.status == 401


async def test_retry_after_is_when_the_oldest_counted_failure_leaves_the_window():
    from services.edge.errors import ApiError

    clock = Clock()
    throttle = LoginThrottle(Limit(3, 60), Limit(100, 60), clock=clock)
    for step in range(3):
        await _fail(throttle, "a@example.com", "10.0.0.1")
        clock.now += 10  # failures at 1000, 1010, 1020; now 1030
    with pytest.raises(ApiError) as caught:
        async with throttle.attempt("a@example.com", "10.0.0.2"):
            pass
    assert caught.value.status == 429 and caught.value.headers["Retry-After"] == "30"
    clock.now = 1060.0  # the first failure has left the window: one more try
    async with throttle.attempt("A@example.com ", "10.0.0.2"):
        pass
    await _fail(throttle, "a@example.com", "10.0.0.2")  # success cleared the e-mail's log


async def test_other_errors_are_forgiven_and_memory_is_bounded():
    from contracts.errors import ErrorCode
    from services.edge.errors import ApiError

    throttle = LoginThrottle(Limit(1, 60), Limit(1, 60), max_subjects=10, clock=Clock())
    for _ in range(3):  # a 503 from the database is not the caller's failure
        with pytest.raises(ApiError):
            async with throttle.attempt("b@example.com", "10.0.0.1"):
                raise ApiError(503, ErrorCode.SERVICE_UNAVAILABLE, "down")
    for i in range(50):
        await _fail(throttle, f"user{i}@example.com", f"10.1.0.{i}")
    assert throttle.logs.subjects(throttle._emails) == 10 and throttle.logs.subjects(throttle._ips) == 10
