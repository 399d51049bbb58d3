"""The login and sign-up throttles of several replicas over one shared store, and the fallback to a
process's own logs while that store (Redis) fails or hangs: services/keys/failover_logs.py, on a
fake of Redis (tests/unit/fakes.py: FakeSharedLogs). The Lua itself runs on real Redis in
tests/integration/test_shared_throttles.py."""

import logging

import pytest

from contracts.errors import ErrorCode
from services.edge.errors import ApiError
from services.keys.attempt_logs import LocalLogs
from services.keys.failover_logs import FailoverLogs
from services.keys.login_throttle import Limit, LoginThrottle
from services.keys.registration_throttle import RegistrationThrottle
from tests.unit.fakes import FakeSharedLogs


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _replica(shared: FakeSharedLogs, clock: Clock, *, timeout_s: float = 0.5) -> FailoverLogs:
    """One replica's store: the shared logs, its own as the fallback."""
    return FailoverLogs(shared, LocalLogs(clock=clock), timeout_s=timeout_s, retry_s=5.0, clock=clock)


async def _login(throttle: LoginThrottle, email: str, ip: str, outcome: str = "wrong") -> int:
    """The status a login with this outcome gets through the throttle."""
    try:
        async with throttle.attempt(email, ip):
            if outcome == "wrong":
                raise ApiError(401, ErrorCode.INVALID_CREDENTIALS, "wrong")
            if outcome == "down":
                raise ApiError(503, ErrorCode.SERVICE_UNAVAILABLE, "down")
    except ApiError as exc:
        return exc.status
    return 200


async def test_two_replicas_together_allow_the_limit_once_not_twice():
    clock = Clock()
    shared = FakeSharedLogs(clock)
    a, b = (LoginThrottle(Limit(4, 60), Limit(100, 60), logs=_replica(shared, clock)) for _ in range(2))
    answers = [await _login(a if i % 2 else b, "ada@example.com", f"10.0.0.{i}") for i in range(6)]
    assert answers == [401] * 4 + [429] * 2  # alone, each replica would have allowed 4
    assert await _login(a, "ada@example.com", "10.0.0.9", "right") == 429  # the right one too: no oracle
    clock.now += 60
    assert await _login(b, "ada@example.com", "10.0.0.9", "right") == 200


async def test_a_success_on_one_replica_clears_the_failures_counted_by_another():
    clock = Clock()
    shared = FakeSharedLogs(clock)
    a, b = (LoginThrottle(Limit(2, 60), Limit(100, 60), logs=_replica(shared, clock)) for _ in range(2))
    assert await _login(a, "ada@example.com", "10.0.0.1") == 401
    assert await _login(b, "ada@example.com", "10.0.0.1", "right") == 200
    assert [await _login(a, "ada@example.com", "10.0.0.1") for _ in range(3)] == [401, 401, 429]


async def test_other_errors_are_forgiven_in_the_shared_logs():
    clock = Clock()
    shared = FakeSharedLogs(clock)
    a, b = (LoginThrottle(Limit(1, 60), Limit(1, 60), logs=_replica(shared, clock)) for _ in range(2))
    for throttle in (a, b, a):
        assert await _login(throttle, "ada@example.com", "10.0.0.1", "down") == 503
    assert await _login(b, "ada@example.com", "10.0.0.1") == 401
    assert await _login(a, "ada@example.com", "10.0.0.1") == 429


async def test_sign_ups_from_one_address_are_counted_across_replicas():
    clock = Clock()
    shared = FakeSharedLogs(clock)
    a, b = (RegistrationThrottle(Limit(3, 60), logs=_replica(shared, clock)) for _ in range(2))
    for throttle in (a, b, a):
        await throttle.admit("2001:db8:1:2::1")
    with pytest.raises(ApiError) as caught:
        await b.admit("2001:db8:1:2::99")  # the same /64
    assert caught.value.status == 429 and caught.value.headers == {"Retry-After": "60"}


async def test_while_redis_is_down_each_replica_throttles_alone_and_says_so_once(caplog):
    clock = Clock()
    shared = FakeSharedLogs(clock)
    replica = _replica(shared, clock)
    throttle = LoginThrottle(Limit(3, 60), Limit(100, 60), logs=replica)
    shared.down = True
    with caplog.at_level(logging.WARNING, logger="services.keys.failover_logs"):
        answers = [await _login(throttle, "ada@example.com", "10.0.0.1") for _ in range(5)]
        assert answers == [401, 401, 401, 429, 429]  # the process's own log: never a 500
        assert await _login(throttle, "bob@example.com", "10.0.0.1", "right") == 200
        assert [r.getMessage() for r in caplog.records].count(
            "the throttles' Redis failed; throttling in this process alone until it answers"
        ) == 1
        asked = shared.calls
        clock.now += 1
        await _login(throttle, "carl@example.com", "10.0.0.1")
        assert shared.calls == asked, "not asked again before RETRY_S"

        shared.down = False
        clock.now += 5
        assert await _login(throttle, "dora@example.com", "10.0.0.1") == 401
        assert "the throttles' Redis answers again; throttles are shared again" in [r.getMessage() for r in caplog.records]
    assert shared.calls > asked and shared.logs.subjects(throttle._emails) == 1  # dora's failure is shared


async def test_a_hung_redis_costs_an_attempt_its_timeout_and_the_local_log_judges():
    clock = Clock()
    shared = FakeSharedLogs(clock)
    shared.hung = True
    throttle = RegistrationThrottle(Limit(1, 60), logs=_replica(shared, clock, timeout_s=0.05))
    await throttle.admit("198.51.100.7")
    with pytest.raises(ApiError) as caught:
        await throttle.admit("198.51.100.7")
    assert caught.value.status == 429
    assert shared.calls == 1  # the second did not wait for Redis again


async def test_an_attempt_is_forgiven_where_it_was_counted():
    """Counted in the process's own log during an outage, forgiven there even if Redis is back."""
    clock = Clock()
    shared = FakeSharedLogs(clock)
    replica = _replica(shared, clock)
    throttle = LoginThrottle(Limit(1, 60), Limit(1, 60), logs=replica)
    shared.down = True
    async with throttle.attempt("ada@example.com", "10.0.0.1"):
        shared.down = False
        clock.now += 5  # Redis answers again before this attempt ends
    # a success: its e-mail cleared, its address forgiven, in the log that counted them
    assert replica._local.subjects(throttle._ips) == 0 and replica._local.subjects(throttle._emails) == 0
    assert await _login(throttle, "ada@example.com", "10.0.0.1") == 401
    assert shared.logs.subjects(throttle._emails) == 1
