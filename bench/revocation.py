"""Logout-to-refusal lag across two `serve` processes, against the key-toggle lag in the same run.

Process A answers `POST /api/auth/logout`; the clock starts when that 204 arrives and stops when
process B first answers 401 `invalid_session` for the session (B polled back to back with
`GET /api/geo/projects`). Baseline, same run, same poll loop, same endpoint, interleaved trial by
trial: a key toggled off on A until B answers 401 `api_key_disabled` (the established "at once"
path: keys.v1 through the keys outbox). Contract: p99 <= 50 ms, never more than 1 s (API.md).
Printed, never asserted (tests/integration/test_sessions_two_processes.py asserts the 1 s bound).
With `--quiet S`, S seconds without traffic before each logout and each toggle (and fetch_pace's
settling first): B's follower is idle then, its fetch held by the broker with the long idle wait.

Real Kafka and Postgres: the local test stack or TEST_KAFKA_BOOTSTRAP_SERVERS / TEST_DATABASE_URL.

    .venv/bin/python bench/revocation.py [--trials 200] [--quiet 0]
"""

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.edge import PASSWORD, PATH, signup
from bench.stats import percentile, ratio_line
from bench.support import bench_settings, endpoints
from services.runtime.platform.fetch_pace import SETTLE_S
from services.runtime.platform.settings import Settings
from tests.support.apps import ServeProcess


async def _until(client: httpx.AsyncClient, headers: dict[str, str], status: int, code: str | None = None) -> None:
    """Poll as fast as the process answers until it gives `status` (and error `code`)."""
    deadline = time.monotonic() + 5
    while True:
        response = await client.get(PATH, headers=headers)
        if response.status_code == status and (code is None or response.json()["error"]["code"] == code):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"still {response.status_code} after 5 s: {response.text}")


async def lags(settings: Settings, trials: int, quiet: float = 0) -> tuple[list[float], list[float]]:
    a, b = ServeProcess(settings, "keys,geo"), ServeProcess(settings, "keys,geo")
    try:
        a.wait_ready()
        b.wait_ready()
        async with httpx.AsyncClient(base_url=a.base_url) as on_a, httpx.AsyncClient(base_url=b.base_url) as on_b:
            _, console = await signup(on_a, settings)
            email = (await on_a.get("/api/account", headers=console)).json()["email"]
            key = (await on_a.post("/api/api-keys", json={"name": "lag"}, headers=console)).json()
            auth = {"Authorization": f"Bearer {key['key']}"}
            await _until(on_b, auth, 200)
            if quiet:
                await asyncio.sleep(SETTLE_S)
            logout: list[float] = []
            toggle: list[float] = []
            for _ in range(trials):
                # a fresh session, in use on B, logged out on A
                login = await on_b.post("/api/auth/login", json={"email": email, "password": PASSWORD})
                session = {"Authorization": f"Bearer {login.json()['access_token']}"}
                await _until(on_b, session, 200)
                await asyncio.sleep(quiet)
                out = await on_a.post("/api/auth/logout", headers=session)
                started = time.perf_counter()
                assert out.status_code == 204, out.text
                await _until(on_b, session, 401, "invalid_session")
                logout.append(time.perf_counter() - started)
                # baseline: the key toggled off on A, the same poll loop on B
                await asyncio.sleep(quiet)
                off = await on_a.post(f"/api/api-keys/{key['id']}/toggle", headers=console)
                started = time.perf_counter()
                assert off.json()["status"] == "disabled", off.text
                await _until(on_b, auth, 401, "api_key_disabled")
                toggle.append(time.perf_counter() - started)
                await on_a.post(f"/api/api-keys/{key['id']}/toggle", headers=console)
                await _until(on_b, auth, 200)
            return logout, toggle
    finally:
        a.stop()
        b.stop()


def _line(name: str, samples_s: list[float]) -> str:
    ms = [s * 1000 for s in samples_s]
    return f"{name}: p50={percentile(ms, 50):.2f}ms p99={percentile(ms, 99):.2f}ms max={max(ms):.2f}ms n={len(ms)}"


async def main(trials: int, quiet: float) -> None:
    with endpoints() as infra:
        async with bench_settings(infra) as settings:
            logout, toggle = await lags(settings, trials, quiet)
    if quiet:
        print(f"each after {quiet:.1f} s without traffic")
    print(_line("logout -> refused on the other process", logout))
    print(_line("key toggle -> refused on the other process (baseline)", toggle))
    logout_ms = [s * 1000 for s in logout]
    toggle_ms = [s * 1000 for s in toggle]
    print(ratio_line("p50 lag, logout vs key toggle", percentile(logout_ms, 50), percentile(toggle_ms, 50), "ms"))
    print(ratio_line("p99 lag, logout vs key toggle", percentile(logout_ms, 99), percentile(toggle_ms, 99), "ms"))
    print(f"over the contract's 1 s: {sum(1 for s in logout if s > 1.0)} logouts (must be 0)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--quiet", type=float, default=0)
    args = parser.parse_args()
    asyncio.run(main(args.trials, args.quiet))
