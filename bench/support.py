"""The setup the benchmarks on the test stack share (a helper, not a benchmark: `make bench` runs
only the scripts with a `__main__`).

`endpoints()` finds the stack as the tests do (TEST_* variables, else Docker, else `tollgate stack
up`); `bench_settings` gives one run Settings of its own, as the tests' `settings` fixture does:
a Postgres database cloned from a fresh template, topics `bench<tag>.`, ClickHouse database
`b_<tag>`, all dropped afterwards.
"""

import uuid
from collections.abc import AsyncIterator
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
