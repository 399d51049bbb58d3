"""Sign-up flooding: `POST /api/auth/register` per client IP, 429 with Retry-After before any argon2
hash, on the real stack (Postgres, Kafka) at argon2's production parameters."""

import itertools
import uuid

import pytest
from argon2 import PasswordHasher

from services.keys import registration_throttle
from services.keys import service as keys_service
from services.keys.registration_throttle import WINDOW_S
from services.runtime.platform.settings import Settings
from tests.hostile.helpers import PASSWORD, assert_contract_error
from tests.support.apps import running_app

LIMIT = 3  # lower than production's 20 (fewer 0.4 s hashes to make); the rule is the same


def _signup(ip: str | None) -> dict:
    body = {"email": f"r{uuid.uuid4().hex[:12]}@example.com", "password": PASSWORD, "name": "Flood", "user_type": "individual"}
    return {"json": body, "headers": {"X-Forwarded-For": ip} if ip else {}}


@pytest.mark.integration
async def test_the_n_plus_first_sign_up_from_one_address_is_429_and_other_addresses_are_not(settings: Settings, monkeypatch):
    hashed = itertools.count()

    class CountingHasher(PasswordHasher):  # argon2's production parameters, with a spy on hash
        def hash(self, password: str | bytes, *, salt: bytes | None = None) -> str:
            next(hashed)
            return super().hash(password, salt=salt)

    # This app hashes as production does (the suite's platforms hash at the cheapest parameters,
    # which the throttle counts as a sliver of a production sign-up each: tests/support/cheap_hashes.py).
    monkeypatch.setattr(keys_service, "PasswordHasher", CountingHasher)
    monkeypatch.setattr(registration_throttle, "REGISTRATIONS_PER_IP", LIMIT)
    # The test client is a trusted proxy, so X-Forwarded-For gives each request its client IP.
    settings = settings.model_copy(update={"trusted_proxies": ["127.0.0.1/32"]})
    async with running_app(settings) as (_app, client):
        flooder, neighbour = "198.51.100.7", "203.0.113.9"
        for _ in range(LIMIT):
            assert (await client.post("/api/auth/register", **_signup(flooder))).status_code == 201

        before = next(hashed)
        refused = await client.post("/api/auth/register", **_signup(flooder))
        assert_contract_error(refused, 429, "rate_limited")
        assert 1 <= int(refused.headers["Retry-After"]) <= WINDOW_S
        assert next(hashed) == before + 1, "a refused sign-up must not reach argon2"

        # Another address behind the same trusted proxy signs up; so does the proxy itself.
        assert (await client.post("/api/auth/register", **_signup(neighbour))).status_code == 201
        assert (await client.post("/api/auth/register", **_signup(None))).status_code == 201
        # The refused address still is, and the new account was not made.
        assert_contract_error(await client.post("/api/auth/register", **_signup(flooder)), 429, "rate_limited")


@pytest.mark.integration
async def test_x_forwarded_for_from_an_untrusted_peer_is_not_believed(settings: Settings, monkeypatch):
    monkeypatch.setattr(keys_service, "PasswordHasher", PasswordHasher)
    monkeypatch.setattr(registration_throttle, "REGISTRATIONS_PER_IP", 1)
    async with running_app(settings.model_copy(update={"trusted_proxies": []})) as (_app, client):
        assert (await client.post("/api/auth/register", **_signup("198.51.100.7"))).status_code == 201
        # A made-up X-Forwarded-For does not buy a flooder a fresh address: the peer is counted.
        assert_contract_error(await client.post("/api/auth/register", **_signup("198.51.100.8")), 429, "rate_limited")
