"""Real endpoints for integration tests: env vars, else testcontainers (Docker), else the local stack."""

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from services.runtime import stack

REPO = Path(__file__).resolve().parents[2]
TEST_STACK = stack.StackConfig(
    state_dir=REPO / ".tollgate" / "test-stack", kafka_port=29092, controller_port=29093, postgres_port=25432
)


@dataclass(frozen=True)
class Endpoints:
    kafka_bootstrap: str
    database_url: str  # the server's maintenance database; tests clone their own from a template
    chdb_root: Path  # in-process ClickHouse (one owner per path: subprocesses get their own)


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


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0


@contextmanager
def endpoints() -> Iterator[Endpoints]:
    chdb_root = REPO / ".tollgate" / "test-chdb" / str(os.getpid())
    shutil.rmtree(chdb_root, ignore_errors=True)
    chdb_root.mkdir(parents=True)
    try:
        if os.environ.get("TEST_KAFKA_BOOTSTRAP_SERVERS") and os.environ.get("TEST_DATABASE_URL"):
            yield Endpoints(os.environ["TEST_KAFKA_BOOTSTRAP_SERVERS"], os.environ["TEST_DATABASE_URL"], chdb_root)
        elif _docker_answers():
            from testcontainers.kafka import KafkaContainer
            from testcontainers.postgres import PostgresContainer

            with KafkaContainer("apache/kafka:4.1.0").with_kraft() as kafka, PostgresContainer("postgres:16", driver=None) as pg:
                yield Endpoints(kafka.get_bootstrap_server(), pg.get_connection_url(), chdb_root)
        else:
            # Stop it afterwards only if this run started it: another run may be using it.
            already_running = all(state.startswith("running") for state in list(stack.status(TEST_STACK).values())[:2])
            stack.up(TEST_STACK)
            try:
                yield Endpoints(TEST_STACK.kafka_bootstrap, TEST_STACK.database_url, chdb_root)
            finally:
                if not already_running and os.environ.get("TOLLGATE_KEEP_TEST_STACK") != "1":
                    stack.down(TEST_STACK)
    finally:
        shutil.rmtree(chdb_root, ignore_errors=True)
