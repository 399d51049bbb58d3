"""The fault suite runs on a stack of its own: it stops Kafka, restarts Postgres and ClickHouse."""

import uuid
from collections.abc import Iterator

import pytest

from services.runtime.host import stack
from services.runtime.platform.settings import Settings
from tests.support import databases
from tests.support.infra import REPO, drop_clickhouse_database

# Ports below the ephemeral range (32768+): while the broker is down, clients retrying a port
# inside it can connect to themselves and hold the port the restarted broker needs.
FAULT_STACK = stack.StackConfig(
    state_dir=REPO / ".tollgate" / "fault-stack",
    kafka_port=27092,
    controller_port=27093,
    postgres_port=27432,
    clickhouse_http_port=27123,
    clickhouse_tcp_port=27900,
    redis_port=27379,
    clickhouse_extra_databases=("f_*",),
)


@pytest.fixture(scope="session")
def fault_stack() -> Iterator[stack.StackConfig]:
    stack.up(FAULT_STACK)
    try:
        yield FAULT_STACK
    finally:
        stack.down(FAULT_STACK)


@pytest.fixture
def fault_settings(fault_stack: stack.StackConfig) -> Iterator[Settings]:
    """Settings for `serve` processes on the fault stack: a fresh database (migrated by the
    services at start), fresh topics, and a ClickHouse database of its own."""
    tag = uuid.uuid4().hex[:10]
    server = fault_stack.database_url
    url = databases.create_empty(server, f"f_{tag}")
    yield Settings(
        kafka_bootstrap_servers=fault_stack.kafka_bootstrap,
        database_url=url,
        clickhouse_dsn=fault_stack.clickhouse_dsn,
        clickhouse_database=f"f_{tag}",
        redis_url=fault_stack.redis_url,
        topic_prefix=f"f{tag}.",
        session_secret=f"fault-secret-{tag}",
        admin_token=f"admin-{tag}",
    )
    databases.drop(server, url)
    drop_clickhouse_database(fault_stack.clickhouse_dsn, f"f_{tag}")
