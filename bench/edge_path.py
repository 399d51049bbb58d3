"""CPU time of one admitted API-key request on the edge's own path, no I/O: the request
middleware, the edge dependency (key lookup, rate limiter in process, quota gate, admission) and
the call's finish, around a bare ASGI app (no FastAPI routing, no handler work). Measured in
process CPU time (`time.process_time`) so that other processes on a shared machine count less
than in bench/edge.py's wall-clock figures.

    .venv/bin/python bench/edge_path.py [--requests 20000] [--runs 5]
"""

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from contracts.common import Permission, Resource, Role
from contracts.credentials import hash_secret
from contracts.events import KeyState, QuotaState
from contracts.period import period_of
from contracts.rate_limit import RateLimit
from services.edge.edge import Edge
from services.edge.middleware import RequestMiddleware
from services.runtime.platform.settings import Settings

SECRET = "sk-" + "a" * 40
PATH = "/api/geo/projects"
HEADERS = [(b"authorization", f"Bearer {SECRET}".encode()), (b"user-agent", b"bench")]


class _Route:
    path = PATH


def edge_with_a_key() -> Edge:
    edge = Edge(Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@h/d", session_secret="bench"))
    edge.assume_caught_up()  # fed by hand below
    edge.plans.default = RateLimit(per_second=1_000_000, burst=1_000_000, per_minute=100_000_000)  # never says no
    account, now = uuid.uuid4(), datetime.now(UTC)
    key = KeyState(
        time=now, account_id=account, key_id=uuid.uuid4(), hash=hash_secret(SECRET), status="enabled", roles=[Role.OWNER]
    )
    edge.keys.apply(key)
    period = period_of(now, edge.settings.tz)
    quota = QuotaState(
        time=now, account_id=account, resource=Resource.API_CALLS, period=period, total=10**12, used=0, blocked=False
    )
    edge.quota.apply(quota)
    return edge


async def main(requests: int, runs: int) -> None:
    edge = edge_with_a_key()  # its recorder is not started: the calls stay in the lanes, emptied below
    dependency = edge.requires(Permission.PROJECTS_READ)
    route = _Route()
    body: Message = {"type": "http.response.body", "body": b"[]"}

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = route
        await dependency(Request(scope))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send(body)

    app = RequestMiddleware(inner)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        pass

    async def one() -> None:
        scope: dict[str, Any] = {
            "type": "http", "method": "GET", "scheme": "http", "path": PATH, "raw_path": PATH.encode(),
            "query_string": b"", "root_path": "", "headers": HEADERS, "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8080),
        }  # fmt: skip
        await app(scope, receive, send)

    lanes = edge.calls.lanes
    for _ in range(1000):  # warm up
        await one()
    lanes.sent(lanes.take(10_000))
    per_request = []
    for _ in range(runs):
        started = time.process_time()
        for i in range(requests):
            await one()
            if i % 5000 == 4999:  # what Kafka would acknowledge: the admitted lane never fills
                lanes.sent(lanes.take(10_000))
        per_request.append((time.process_time() - started) / requests * 1e6)
        lanes.sent(lanes.take(10_000))
    if lanes.open:
        raise RuntimeError("a reservation leaked")
    runs_text = " ".join(f"{us:.1f}" for us in per_request)
    print(f"edge path, CPU per admitted API-key request: {runs_text} us (median {statistics.median(per_request):.1f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.runs))
