"""The setup the benchmarks on the test stack share (a helper, not a benchmark: `make bench` runs
only the scripts with a `__main__`).

`endpoints()` finds the stack as the tests do (TEST_* variables, else Docker, else `tollgate stack
up`); `bench_settings` gives one run Settings of its own, as the tests' `settings` fixture does:
a Postgres database cloned from a fresh template, topics `bench<tag>.`, ClickHouse database
`b_<tag>`, all dropped afterwards.
"""

import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from services.runtime.platform.settings import Settings
from tests.support import databases
from tests.support.infra import Endpoints, delete_topics_with_prefix, drop_clickhouse_database, endpoints

__all__ = ["bench_settings", "endpoints"]


@asynccontextmanager
async def bench_settings(infra: Endpoints, **overrides: Any) -> AsyncIterator[Settings]:
    """Settings of one run on `infra`; `overrides` are further Settings fields (e.g. redis_url)."""
    tag = uuid.uuid4().hex[:8]
    template = databases.create_template(infra.database_url)
    url = databases.clone(infra.database_url, template)
    settings = Settings(
        kafka_bootstrap_servers=infra.kafka_bootstrap,
        database_url=url,
        topic_prefix=f"bench{tag}.",
        clickhouse_dsn=infra.clickhouse_dsn,
        clickhouse_database=f"b_{tag}",
        session_secret=f"bench-{tag}",
        **overrides,
    )
    try:
        yield settings
    finally:
        databases.drop(infra.database_url, url)
        databases.drop_template(infra.database_url, template)
        await delete_topics_with_prefix(infra.kafka_bootstrap, settings.topic_prefix)
        drop_clickhouse_database(infra.clickhouse_dsn, settings.clickhouse_database)


async def print_cpu_per_request(
    requests: Mapping[str, tuple[Any, ...]], one: Callable[..., Awaitable[int]], lanes: Any, count: int, runs: int
) -> None:
    """For each named request, `one(*request)` (an ASGI call in process answering its status)
    warmed up and checked, then CPU time per request over `runs` runs of `count`: the edge's
    admitted lane emptied as Kafka would acknowledge it, so it never fills."""
    for name, request in requests.items():
        for _ in range(500):  # warm up, and check
            if await one(*request) != 200:
                raise RuntimeError(f"{name} did not answer 200")
        lanes.sent(lanes.take(10_000))
        per_request = []
        for _ in range(runs):
            started = time.process_time()
            for i in range(count):
                await one(*request)
                if i % 2000 == 1999:
                    lanes.sent(lanes.take(10_000))
            per_request.append((time.process_time() - started) / count * 1e6)
            lanes.sent(lanes.take(10_000))
        runs_text = " ".join(f"{us:.1f}" for us in per_request)
        print(f"{name:10} CPU per request in process: {runs_text} us (median {statistics.median(per_request):.1f})")


async def asgi_status(app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]], body: bytes | None = None) -> int:
    """One request through `app` in process, as uvicorn hands it over from a wrk connection; its
    status. A body (even empty) comes with its Content-Length; None sends no body headers."""
    length = [] if body is None else [(b"content-length", str(len(body)).encode())]
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"tollgate"), (b"user-agent", b"wrk"), *length, *headers],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080), "state": {},
    }  # fmt: skip
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body or b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status
