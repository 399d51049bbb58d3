"""CPU time of one verify (and one authorize, and one /healthz) inside a request worker, no I/O:
the product's whole app (`create_app`: its middleware, error handlers, routing and, where there is
one, verify's fast path) driven through ASGI, the rate limiter and the api_calls admission in
process (no Redis), the calls left in their lanes (no Kafka). What is left of a request worker's
per-call CPU is uvicorn's parsing and writing and the Redis round trip (bench/verify.py measures
them all, on the stack). Measured in process CPU time (`time.process_time`), so other processes on
a shared machine count less than in bench/verify.py's figures.

    .venv/bin/python bench/verify_path.py [--requests 5000] [--runs 5]
"""

import argparse
import asyncio
import functools
import json
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from bench.support import asgi_status, print_cpu_per_request
from contracts.common import Resource, Role, ServiceScope
from contracts.credentials import hash_secret
from contracts.events import KeyState, QuotaState, ServiceTokenState
from contracts.period import period_of
from contracts.rate_limit import RateLimit
from services.edge.edge import Edge
from services.runtime.host.app import create_app
from services.runtime.platform.settings import Settings

KEY = "sk-" + "a" * 40
TOKEN = "st-" + "b" * 43
CALL = {"key": KEY, "method": "GET", "path": "/v1/models", "ip": "203.0.113.7", "user_agent": "bench-verify"}
REQUESTS: dict[str, tuple[str, str, list[tuple[bytes, bytes]], bytes]] = {
    "/healthz": ("GET", "/healthz", [], b""),
    "verify": (
        "POST",
        "/api/edge/verify",
        [(b"authorization", f"Bearer {TOKEN}".encode()), (b"content-type", b"application/json")],
        json.dumps({**CALL, "resource": "ai_tokens"}).encode(),
    ),
    "authorize": (
        "GET",
        "/api/edge/authorize",
        [
            (b"x-tollgate-service-token", TOKEN.encode()),
            (b"authorization", f"Bearer {KEY}".encode()),
            (b"x-original-method", b"GET"),
            (b"x-original-uri", b"/v1/models"),
            (b"x-tollgate-resource", b"ai_tokens"),
        ],
        b"",
    ),
}


def app_with_a_key_and_a_token() -> Any:
    settings = Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@h/d", session_secret="bench")
    app = create_app(("geo",), settings, consumers=False)
    edge: Edge = app.state.runtime.edge
    edge.assume_caught_up()  # fed by hand below
    edge.plans.default = RateLimit(per_second=1_000_000, burst=1_000_000, per_minute=100_000_000)  # never says no
    account, now = uuid.uuid4(), datetime.now(UTC)
    digest = hash_secret(KEY)
    key = KeyState(time=now, account_id=account, key_id=uuid.uuid4(), hash=digest, status="enabled", roles=[Role.OWNER])
    edge.keys.apply(key)
    period = period_of(now, edge.settings.tz)
    for resource in (Resource.API_CALLS, Resource.AI_TOKENS):
        edge.quota.apply(
            QuotaState(time=now, account_id=account, resource=resource, period=period, total=10**12, used=0, blocked=False)
        )
    token = ServiceTokenState(
        time=now, token_id=uuid.uuid4(), name="bench", hash=hash_secret(TOKEN), scopes=[ServiceScope.KEYS_VERIFY]
    )
    edge.service_tokens.apply(token)
    return app


async def main(requests: int, runs: int) -> None:
    app = app_with_a_key_and_a_token()
    edge: Edge = app.state.runtime.edge
    lanes = edge.calls.lanes

    one = functools.partial(asgi_status, app)  # (method, path, headers, body)

    await print_cpu_per_request(REQUESTS, one, lanes, requests, runs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.runs))
