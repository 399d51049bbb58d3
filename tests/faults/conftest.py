"""The fault suite runs on a stack of its own: it stops Kafka and restarts Postgres."""

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.runtime import stack
from services.runtime.settings import Settings
from tests.support import databases
from tests.support.infra import REPO

# Ports below the ephemeral range (32768+): while the broker is down, clients retrying a port
# inside it can connect to themselves and hold the port the restarted broker needs.
FAULT_STACK = stack.StackConfig(
    state_dir=REPO / ".tollgate" / "fault-stack", kafka_port=27092, controller_port=27093, postgres_port=27432
)


@pytest.fixture(scope="session")
def fault_stack() -> Iterator[stack.StackConfig]:
    stack.up(FAULT_STACK)
    try:
        yield FAULT_STACK
    finally:
        stack.down(FAULT_STACK)


@pytest.fixture
def fault_settings(fault_stack: stack.StackConfig, tmp_path: Path) -> Iterator[Settings]:
    """Settings for `serve` processes on the fault stack: a fresh database (migrated by the
    services at start), fresh topics, and a chdb path that only the metering process opens."""
    tag = uuid.uuid4().hex[:10]
    server = fault_stack.database_url
    url = databases.create_empty(server, f"f_{tag}")
    yield Settings(
        kafka_bootstrap_servers=fault_stack.kafka_bootstrap,
        database_url=url,
        clickhouse_dsn=f"chdb://{tmp_path / 'ch'}",
        clickhouse_database="tollgate",
        topic_prefix=f"f{tag}.",
        session_secret=f"fault-secret-{tag}",
        admin_token=f"admin-{tag}",
    )
    databases.drop(server, url)
