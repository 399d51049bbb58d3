"""Each test's own environment, made ahead and cleaned up behind, off the test's clock.

A test of its own gets a Postgres database (a clone of the migrated template), a ClickHouse
database and a Kafka topic prefix. Making them (the clone, the ClickHouse migrations, creating
every topic) and dropping them (deleting the topics, dropping both databases) is mostly waiting on
the servers, a few seconds per test. Two background threads make the next environments while a
test runs (one alone fell behind a module of quick tests, which then waited for it), another
drops the finished ones; the platform a test starts then finds its migrations applied and its
topics present, as a restarted service does.
"""

import asyncio
import queue
import threading
import uuid
from dataclasses import dataclass

from services.metering.store import MeteringStore
from services.runtime.platform.kafka import ensure_topics
from services.runtime.platform.settings import Settings
from tests.support import databases
from tests.support.infra import Endpoints, delete_topics_with_prefix, drop_clickhouse_database


@dataclass(frozen=True)
class Environment:
    tag: str
    database_url: str

    def settings(self, infra: Endpoints) -> Settings:
        return Settings(
            kafka_bootstrap_servers=infra.kafka_bootstrap,
            database_url=self.database_url,
            clickhouse_dsn=infra.clickhouse_dsn,
            clickhouse_database=f"t_{self.tag}",
            redis_url=infra.redis_url,
            topic_prefix=f"t{self.tag}.",
            session_secret=f"test-secret-{self.tag}",
            admin_token=f"admin-{self.tag}",
        )


def drop(infra: Endpoints, database_url: str, tag: str) -> None:
    """Delete the topics, the ClickHouse database and the Postgres database of one environment."""
    asyncio.run(delete_topics_with_prefix(infra.kafka_bootstrap, f"t{tag}."))
    drop_clickhouse_database(infra.clickhouse_dsn, f"t_{tag}")
    databases.drop(infra.database_url, database_url)


class Environments:
    """`take()` a ready environment, `give_back()` a finished one; `close()` drops them all."""

    def __init__(self, infra: Endpoints, template: str, ahead: int = 2, makers: int = 2) -> None:
        self._infra = infra
        self._template = template
        self._ready: queue.Queue[Environment | BaseException] = queue.Queue(maxsize=ahead)
        self._finished: queue.Queue[Environment | None] = queue.Queue()
        self._closing = threading.Event()
        self._makers = [
            threading.Thread(target=self._make_ahead, name=f"environments-maker-{n}", daemon=True) for n in range(makers)
        ]
        self._dropper = threading.Thread(target=self._drop_behind, name="environments-dropper", daemon=True)
        for maker in self._makers:
            maker.start()
        self._dropper.start()

    def take(self) -> Environment:
        made = self._ready.get(timeout=300)
        if isinstance(made, BaseException):
            raise RuntimeError("making a test environment failed") from made
        return made

    def give_back(self, environment: Environment) -> None:
        self._finished.put(environment)

    def close(self) -> None:
        self._closing.set()
        while any(maker.is_alive() for maker in self._makers):  # unblock makers waiting for room in the queue
            self._drain_ready()
            for maker in self._makers:
                maker.join(0.05)
        self._drain_ready()
        self._finished.put(None)
        self._dropper.join()

    def _drain_ready(self) -> None:
        while True:
            try:
                made = self._ready.get_nowait()
            except queue.Empty:
                return
            if isinstance(made, Environment):
                self._finished.put(made)

    def _make_ahead(self) -> None:
        while not self._closing.is_set():
            try:
                made: Environment | BaseException = self._make()
            except BaseException as error:  # handed to the test that takes it
                made = error
            self._ready.put(made)

    def _make(self) -> Environment:
        tag = uuid.uuid4().hex[:10]
        environment = Environment(tag, databases.clone(self._infra.database_url, self._template))
        settings = environment.settings(self._infra)
        store = MeteringStore(settings.clickhouse_dsn, settings.clickhouse_database)
        store.open()  # creates the database and applies the migrations
        store.close()
        asyncio.run(ensure_topics(settings))
        return environment

    def _drop_behind(self) -> None:
        while (environment := self._finished.get()) is not None:
            try:
                drop(self._infra, environment.database_url, environment.tag)
            except Exception as error:  # a leftover database must not fail a test
                print(f"dropping test environment {environment.tag} failed: {error!r}")
