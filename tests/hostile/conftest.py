"""One real `tollgate serve --target all` per test module (uvicorn, real sockets), on settings of
its own: topics, consumer groups, Postgres database and ClickHouse database."""

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from services.runtime.platform.settings import Settings
from tests.support import databases
from tests.support.apps import ServeProcess
from tests.support.infra import Endpoints, delete_topics_with_prefix, drop_clickhouse_database


@dataclass
class Served:
    proc: ServeProcess
    settings: Settings

    @property
    def base_url(self) -> str:
        return self.proc.base_url


@pytest.fixture(scope="module")
def served(infra: Endpoints, template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tag = uuid.uuid4().hex[:10]
    database_url = databases.clone(infra.database_url, template_db)
    settings = Settings(
        kafka_bootstrap_servers=infra.kafka_bootstrap,
        database_url=database_url,
        clickhouse_dsn=infra.clickhouse_dsn,
        clickhouse_database=f"t_{tag}",
        redis_url=infra.redis_url,
        topic_prefix=f"t{tag}.",
        session_secret=f"test-secret-{tag}",
        admin_token=f"admin-{tag}",
    )
    proc = ServeProcess(settings, log_path=tmp_path_factory.mktemp("logs") / "serve.log")
    try:
        proc.wait_ready(timeout=120)
        yield Served(proc, settings)
    finally:
        proc.stop()
        databases.drop(infra.database_url, database_url)
        asyncio.run(delete_topics_with_prefix(infra.kafka_bootstrap, f"t{tag}."))
        drop_clickhouse_database(infra.clickhouse_dsn, f"t_{tag}")
