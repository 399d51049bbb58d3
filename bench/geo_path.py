"""CPU time of one metered GEO list (GET /api/geo/projects with an API key, bench/http_load.py's
metered call) and of one /healthz inside a request worker, no I/O: the product's whole app
(`create_app`: its middleware, error handlers, routing and fast routes) driven through ASGI, the
rate limiter and the api_calls admission in process (no Redis), the calls left in their lanes (no
Kafka), geo's store in memory (no Postgres). What is left of a request worker's per-call CPU is
uvicorn's parsing and writing, the Redis round trip and the Postgres read (bench/http_load.py
measures them all, on the stack). Measured in process CPU time (`time.process_time`), so other
processes on a shared machine count less than in bench/http_load.py's figures.

    .venv/bin/python bench/geo_path.py [--requests 5000] [--runs 5] [--projects 0]
"""

import argparse
import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from bench.support import asgi_status, print_cpu_per_request
from contracts.common import Resource, Role
from contracts.credentials import hash_secret
from contracts.events import KeyState, QuotaState
from contracts.period import period_of
from contracts.rate_limit import RateLimit
from services.edge.edge import Edge
from services.geo import app as geo_app
from services.geo.store import ProjectRow
from services.runtime.host.app import create_app
from services.runtime.platform.settings import Settings

KEY = "sk-" + "a" * 40
REQUESTS: dict[str, tuple[str, list[tuple[bytes, bytes]]]] = {
    "/healthz": ("/healthz", []),
    "geo list": ("/api/geo/projects", [(b"authorization", f"Bearer {KEY}".encode())]),
}


class _Rows:
    """geo's store in memory: the account's rows, read as one statement would return them."""

    def __init__(self, rows: list[ProjectRow]) -> None:
        self.rows = rows

    async def list_projects(self, _account_id: uuid.UUID) -> list[ProjectRow]:
        return list(self.rows)


class _Store:
    def __init__(self, rows: list[ProjectRow]) -> None:
        self._tx = _Rows(rows)

    @asynccontextmanager
    async def read(self) -> AsyncIterator[_Rows]:
        yield self._tx


def app_with_a_key(projects: int) -> Any:
    now = datetime.now(UTC)
    rows = [ProjectRow(uuid.uuid4(), f"project {i}", now + timedelta(seconds=i)) for i in range(projects)]
    geo_app.GeoStore = lambda _pool: _Store(rows)  # type: ignore[assignment,misc,method-assign]
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@h/d", session_secret="bench")
    app = create_app(("geo",), settings, consumers=False)
    edge: Edge = app.state.runtime.edge
    edge.assume_caught_up()  # fed by hand below
    edge.plans.default = RateLimit(per_second=1_000_000, burst=1_000_000, per_minute=100_000_000)  # never says no
    account = uuid.uuid4()
    key = KeyState(time=now, account_id=account, key_id=uuid.uuid4(), hash=hash_secret(KEY), status="enabled", roles=[Role.OWNER])
    edge.keys.apply(key)
    period = period_of(now, edge.settings.tz)
    edge.quota.apply(
        QuotaState(time=now, account_id=account, resource=Resource.API_CALLS, period=period, total=10**12, used=0, blocked=False)
    )
    return app


async def main(requests: int, runs: int, projects: int) -> None:
    app = app_with_a_key(projects)
    lanes = app.state.runtime.edge.calls.lanes

    async def one(path: str, headers: list[tuple[bytes, bytes]]) -> int:
        return await asgi_status(app, "GET", path, headers)  # no body headers, as wrk's GET

    await print_cpu_per_request(REQUESTS, one, lanes, requests, runs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--projects", type=int, default=0, help="the account's projects (http_load's accounts have none)")
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.runs, args.projects))
