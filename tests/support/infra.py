"""Real endpoints for integration tests: env vars, else testcontainers (Docker), else the local stack.

Kafka and Postgres: TEST_KAFKA_BOOTSTRAP_SERVERS and TEST_DATABASE_URL. ClickHouse and redis:
TEST_CLICKHOUSE_URL (http://tollgate:PASSWORD@host:port), TEST_CLICKHOUSE_ANALYST_URL and
TEST_REDIS_URL, else the test stack's own ClickHouse server and redis.
"""

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from services.runtime.host import stack

REPO = Path(__file__).resolve().parents[2]
TEST_STACK = stack.StackConfig(
    state_dir=REPO / ".tollgate" / "test-stack",
    kafka_port=29092,
    controller_port=29093,
    postgres_port=25432,
    clickhouse_http_port=28123,
    clickhouse_tcp_port=28900,
    redis_port=26379,
    # Each test makes its own `t_<tag>` database (benchmarks `b_<tag>`); the analyst examples use `tollgate`.
    clickhouse_extra_databases=("t_*", "b_*"),
)


@dataclass(frozen=True)
class Endpoints:
    kafka_bootstrap: str
    database_url: str  # the server's maintenance database; tests clone their own from a template
    clickhouse_dsn: str  # the ClickHouse server as `tollgate` (http://); tests use databases `t_<tag>`
    clickhouse_analyst_dsn: str  # the same server as the read-only `analyst` (database `tollgate` only)
    redis_url: str


async def delete_topics_with_prefix(bootstrap: str, prefix: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        doomed = [t for t in await admin.list_topics() if t.startswith(prefix)]
        if doomed:
            await admin.delete_topics(doomed)
    finally:
        await admin.close()


def drop_clickhouse_database(dsn: str, database: str) -> None:
    from services.runtime.platform import clickhouse

    client = clickhouse.connect(dsn)
    try:
        client.command(f"DROP DATABASE IF EXISTS {database}")
    finally:
        client.close()


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0


def _stack_running(cfg: stack.StackConfig, parts: tuple[str, ...]) -> bool:
    states = stack.status(cfg)
    return all(states[part].startswith("running") for part in parts)


@contextmanager
def _clickhouse_and_redis() -> Iterator[tuple[str, str, str]]:
    """TEST_CLICKHOUSE_URL (as `tollgate`), TEST_CLICKHOUSE_ANALYST_URL and TEST_REDIS_URL, else
    the test stack's own ClickHouse server and redis (started here if they are not running)."""
    if os.environ.get("TEST_CLICKHOUSE_URL") and os.environ.get("TEST_REDIS_URL"):
        yield (
            os.environ["TEST_CLICKHOUSE_URL"],
            os.environ.get("TEST_CLICKHOUSE_ANALYST_URL", ""),
            os.environ["TEST_REDIS_URL"],
        )
        return
    already_running = _stack_running(TEST_STACK, ("clickhouse", "redis"))
    stack.clickhouse_up(TEST_STACK)
    stack.redis_up(TEST_STACK)
    try:
        yield TEST_STACK.clickhouse_dsn, TEST_STACK.analyst_dsns()["http"], TEST_STACK.redis_url
    finally:
        if not already_running and os.environ.get("TOLLGATE_KEEP_TEST_STACK") != "1":
            stack.stop_pid_file(TEST_STACK.state_dir.resolve() / "redis.pid", "redis")
            stack.clickhouse_down(TEST_STACK)


@contextmanager
def endpoints() -> Iterator[Endpoints]:
    if os.environ.get("TEST_KAFKA_BOOTSTRAP_SERVERS") and os.environ.get("TEST_DATABASE_URL"):
        with _clickhouse_and_redis() as (ch, analyst, redis_url):
            yield Endpoints(os.environ["TEST_KAFKA_BOOTSTRAP_SERVERS"], os.environ["TEST_DATABASE_URL"], ch, analyst, redis_url)
    elif _docker_answers():
        from testcontainers.kafka import KafkaContainer
        from testcontainers.postgres import PostgresContainer

        with (
            KafkaContainer("apache/kafka:4.1.0").with_kraft() as kafka,
            PostgresContainer("postgres:16", driver=None) as pg,
            _clickhouse_and_redis() as (ch, analyst, redis_url),
        ):
            yield Endpoints(kafka.get_bootstrap_server(), pg.get_connection_url(), ch, analyst, redis_url)
    else:
        # Stop it afterwards only if this run started it: another run may be using it.
        already_running = _stack_running(TEST_STACK, ("kafka", "postgres", "clickhouse", "redis"))
        stack.up(TEST_STACK)
        try:
            yield Endpoints(
                TEST_STACK.kafka_bootstrap,
                TEST_STACK.database_url,
                TEST_STACK.clickhouse_dsn,
                TEST_STACK.analyst_dsns()["http"],
                TEST_STACK.redis_url,
            )
        finally:
            if not already_running and os.environ.get("TOLLGATE_KEEP_TEST_STACK") != "1":
                stack.down(TEST_STACK)


@contextmanager
def exported_endpoints() -> Iterator[Endpoints]:
    """The endpoints, found or started once here and exported to child processes through the
    TEST_* variables (pytest-xdist's workers take the environment path of endpoints())."""
    with endpoints() as found:
        exported = {
            "TEST_KAFKA_BOOTSTRAP_SERVERS": found.kafka_bootstrap,
            "TEST_DATABASE_URL": found.database_url,
            "TEST_CLICKHOUSE_URL": found.clickhouse_dsn,
            "TEST_CLICKHOUSE_ANALYST_URL": found.clickhouse_analyst_dsn,
            "TEST_REDIS_URL": found.redis_url,
        }
        saved = {name: os.environ.get(name) for name in exported}
        os.environ.update(exported)
        try:
            yield found
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
