"""(v2) Two real `serve` processes: a logout answered by one is refused by the other within a
second (the contract's bound; the lag is measured in bench/revocation.py), and a password change
answered by one ends every session of the user on both."""

import httpx
import pytest

from tests.integration.test_keys_api import PASSWORD, bearer, code
from tests.support.apps import ServeProcess
from tests.support.propagation import refused_within

pytestmark = pytest.mark.integration
NEW_PASSWORD = "another good passphrase"


async def test_logout_and_password_change_are_seen_by_a_second_process(settings):
    a, b = ServeProcess(settings, "keys,geo"), ServeProcess(settings, "keys,geo")
    try:
        a.wait_ready()
        b.wait_ready()
        async with (
            httpx.AsyncClient(base_url=a.base_url, timeout=10) as on_a,
            httpx.AsyncClient(base_url=b.base_url, timeout=10) as on_b,
        ):
            email = "sessions@example.com"
            body = {"email": email, "password": PASSWORD, "name": "S", "user_type": "individual"}
            assert (await on_a.post("/api/auth/register", json=body)).status_code == 201

            async def login(client: httpx.AsyncClient, password: str = PASSWORD) -> str:
                response = await client.post("/api/auth/login", json={"email": email, "password": password})
                assert response.status_code == 200, response.text
                return str(response.json()["access_token"])

            # logout answered by A: A refuses at once, B within 1 s
            lags = []
            for _ in range(3):
                token = await login(on_b)
                assert (await on_b.get("/api/account", headers=bearer(token))).status_code == 200
                assert (await on_a.post("/api/auth/logout", headers=bearer(token))).status_code == 204
                now_a = await on_a.get("/api/account", headers=bearer(token))
                assert (now_a.status_code, code(now_a)) == (401, "invalid_session")
                lags.append(await refused_within(on_b, "/api/account", bearer(token), "invalid_session", 1.0))
                again = await on_b.post("/api/auth/logout", headers=bearer(token))
                assert (again.status_code, code(again)) == (401, "invalid_session")
            print(f"logout-to-refusal lag on the other process: {[round(x * 1000, 1) for x in lags]} ms")

            # password change answered by B ends every session of the user on both processes
            sessions = [await login(on_a), await login(on_b), await login(on_a)]
            for token in sessions:
                for client in (on_a, on_b):
                    assert (await client.get("/api/account", headers=bearer(token))).status_code == 200
            changed = await on_b.put(
                "/api/account/password",
                json={"current_password": PASSWORD, "new_password": NEW_PASSWORD},
                headers=bearer(sessions[1]),
            )
            assert changed.status_code == 204, changed.text
            for token in sessions:
                refused = await on_b.get("/api/account", headers=bearer(token))
                assert (refused.status_code, code(refused)) == (401, "invalid_session")
                await refused_within(on_a, "/api/account", bearer(token), "invalid_session", 1.0)
            # the new password works on both, at once, and the old one on neither
            for client in (on_a, on_b):
                assert code(await client.post("/api/auth/login", json={"email": email, "password": PASSWORD})) == (
                    "invalid_credentials"
                )
                fresh = await login(client, NEW_PASSWORD)
                for other in (on_a, on_b):
                    assert (await other.get("/api/account", headers=bearer(fresh))).status_code == 200
    finally:
        a.stop()
        b.stop()
