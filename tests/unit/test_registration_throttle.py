"""The sign-up throttle's rules with a controlled clock (no I/O): services/keys/registration_throttle.py."""

import pytest
from argon2 import PasswordHasher, profiles

from services.edge.errors import ApiError
from services.keys import registration_throttle
from services.keys.registration_throttle import REGISTRATIONS_PER_IP, WINDOW_S, RegistrationThrottle, limit_for
from services.keys.throttle import Limit, SlidingLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _refused(throttle: RegistrationThrottle, ip: str) -> ApiError:
    with pytest.raises(ApiError) as caught:
        await throttle.admit(ip)
    return caught.value


async def test_the_n_plus_first_sign_up_from_an_address_in_the_window_is_429_with_retry_after():
    clock = Clock()
    throttle = RegistrationThrottle(Limit(3, 60), clock=clock)
    for _ in range(3):
        await throttle.admit("198.51.100.7")  # sign-ups at 1000, 1010, 1020
        clock.now += 10
    refused = await _refused(throttle, "198.51.100.7")  # at 1030
    assert (refused.status, refused.code.value) == (429, "rate_limited")
    assert refused.headers == {"Retry-After": "30"}  # when the sign-up at 1000 leaves the window
    await throttle.admit("203.0.113.9")  # another address is not affected

    clock.now = 1059.5
    assert (await _refused(throttle, "198.51.100.7")).headers == {"Retry-After": "1"}  # never 0
    clock.now = 1060.0
    await throttle.admit("198.51.100.7")  # the oldest has left: one more
    assert (await _refused(throttle, "198.51.100.7")).headers == {"Retry-After": "10"}


async def test_a_refused_sign_up_is_not_counted_and_a_successful_one_is():
    """Every admitted sign-up costs a hash, so none is forgiven; a refusal costs none and adds nothing."""
    clock = Clock()
    throttle = RegistrationThrottle(Limit(2, 60), clock=clock)
    await throttle.admit("10.0.0.1")
    await throttle.admit("10.0.0.1")
    for _ in range(5):
        clock.now += 1
        await _refused(throttle, "10.0.0.1")
    clock.now = 1060.0
    await throttle.admit("10.0.0.1")  # the refusals did not push the window further


async def test_memory_is_bounded_under_a_flood_of_addresses():
    throttle = RegistrationThrottle(Limit(1, 60), max_subjects=10, clock=Clock())
    for i in range(50):
        await throttle.admit(f"10.1.{i // 250}.{i % 250}")
    assert throttle.logs.subjects(throttle._ips) == 10


def test_the_limit_is_production_sign_ups_worth_of_argon2_work():
    assert limit_for(PasswordHasher()) == Limit(REGISTRATIONS_PER_IP, WINDOW_S) == Limit(20, 600.0)
    cheapest = PasswordHasher.from_parameters(profiles.CHEAPEST)  # the tests' platforms
    assert limit_for(cheapest).attempts == 20 * (3 * 65536) // (1 * 8)
    costlier = PasswordHasher(time_cost=6)
    assert limit_for(costlier).attempts == 10


def test_the_limit_is_read_when_an_app_is_built(monkeypatch):
    monkeypatch.setattr(registration_throttle, "REGISTRATIONS_PER_IP", 3)
    assert limit_for(PasswordHasher()).attempts == 3


async def test_an_ipv6_client_is_counted_by_its_64_not_by_each_address_it_picks():
    """A host picks any of its /64's 2^64 addresses at will (privacy addresses, or on purpose): counted
    one by one, a flood from one machine would never meet the limit."""
    throttle = RegistrationThrottle(Limit(2, 60), clock=Clock())
    await throttle.admit("2001:db8:1:2::1")
    await throttle.admit("2001:db8:1:2:aaaa:bbbb:cccc:dddd")
    assert (await _refused(throttle, "2001:db8:1:2::3")).status == 429
    await throttle.admit("2001:db8:1:3::1")  # the next /64 is another subscriber's


async def test_an_ipv4_client_on_a_dual_stack_listener_is_one_subject_with_its_plain_address():
    throttle = RegistrationThrottle(Limit(1, 60), clock=Clock())
    await throttle.admit("::ffff:198.51.100.7")
    assert (await _refused(throttle, "198.51.100.7")).status == 429


def test_a_subject_costs_a_few_hundred_bytes_so_a_full_log_is_tens_of_megabytes():
    # At MAX_SUBJECTS (100k) per log, and login keeping two: a deque(maxlen=...) per subject took
    # ~0.9 KB (a 64-slot block), ~94 MB per log, for subjects a /48's 65k /64s can fill.
    import tracemalloc

    log = SlidingLog(Limit(30, 900.0))
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(10_000):
            log.add(f"2001:db8:{i:x}::/64", float(i))
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (after - before) / 10_000 < 400


def test_a_subject_keeps_only_its_last_attempts_times():
    log = SlidingLog(Limit(3, 60.0))
    for t in (1.0, 2.0, 3.0, 4.0, 5.0):
        log.add("198.51.100.7", t)
    assert log.retry_after("198.51.100.7", 10.0) == 3.0 + 60.0 - 10.0  # the oldest of the last three
