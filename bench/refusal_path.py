"""CPU time of the refusal paths in process, against GET /healthz in the same run: the product's
own app (`create_app`, its middleware, error handlers and routing) driven straight through ASGI,
no lifespan and no I/O: an unknown key's 401 and a key over its rate limit's 429 (the in-process
limiter's refusal; with Redis a flood is refused from the same kind of copy), both answered by the
edge's screen before routing (services/edge/screen.py) once a first call has reached the route,
as the bench's first call does. bench/http_load.py measures the same paths as a user sees them
(wrk, a running stack); this one shows the Python alone, with less noise, so that a change to the
error path can be weighed quickly.

    .venv/bin/python bench/refusal_path.py [--requests 20000] [--rounds 5]
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

from starlette.types import ASGIApp, Message

from contracts.common import Role
from contracts.credentials import hash_secret
from contracts.events import KeyState
from contracts.rate_limit import RateLimit
from services.runtime.host.app import create_app
from services.runtime.platform.settings import Settings

FLOODER = "sk-" + "f" * 40
UNKNOWN = "sk-" + "u" * 40


def scope(path: str, token: str | None) -> dict[str, Any]:
    headers = [(b"host", b"tollgate"), (b"user-agent", b"bench")]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000), "state": {},
    }  # fmt: skip


async def cpu_per_request(app: ASGIApp, path: str, token: str | None, requests: int, expect: int) -> float:
    statuses: list[int] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    started = time.process_time()
    for _ in range(requests):
        await app(scope(path, token), receive, send)
    spent = time.process_time() - started
    if set(statuses) != {expect}:
        raise SystemExit(f"{path} answered {set(statuses)}, expected {expect}")
    return spent / requests * 1e6


async def main(requests: int, rounds: int) -> None:
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@127.0.0.1:1/d", session_secret="s")
    app = create_app(("geo",), settings, consumers=False)
    edge = app.state.runtime.edge
    edge.assume_caught_up()  # fed by hand below
    flooder = KeyState(
        time=datetime.now(UTC),
        account_id=uuid.uuid4(),
        key_id=uuid.uuid4(),
        hash=hash_secret(FLOODER),
        status="enabled",
        roles=[Role.OWNER],
    )
    edge.keys.apply(flooder)
    edge.plans.default = RateLimit(per_second=0.001, burst=1, per_minute=1)  # the flooder's first call takes the only token
    paths = {
        "/healthz": ("/healthz", None, 200),
        "401": ("/api/geo/projects", UNKNOWN, 401),
        "429": ("/api/geo/projects", FLOODER, 429),
    }
    await app(scope("/api/geo/projects", FLOODER), _receive, _discard)  # admitted (its handler: 503 without Postgres)
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):  # interleaved: drift on a shared machine touches all three alike
        for name, (path, token, status) in paths.items():
            await cpu_per_request(app, path, token, requests // 10, status)  # warm
            samples[name].append(await cpu_per_request(app, path, token, requests, status))
    base = statistics.median(samples["/healthz"])
    print(f"in process, {requests:,} requests x {rounds} rounds each, median CPU per request:")
    for name, values in samples.items():
        median = statistics.median(values)
        spread = f"({min(values):.1f}-{max(values):.1f})"
        print(f"  {name:9s} {median:6.1f} us  {spread}  -> {base / median:.3f} of /healthz's throughput")


async def _receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _discard(_message: Message) -> None:
    return None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.rounds))
