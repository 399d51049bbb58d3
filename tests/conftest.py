"""Session-wide real infrastructure; per-test isolation by topic prefix, database and CH database
(tests/support/environments.py makes them ahead and drops them behind)."""

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import settings as hypothesis_settings
from psycopg_pool import AsyncConnectionPool

from services.runtime.platform.postgres import open_pool
from services.runtime.platform.settings import Settings
from tests.support import databases
from tests.support.apps import running_app
from tests.support.cheap_hashes import use_cheapest_argon2
from tests.support.environments import Environment, Environments
from tests.support.infra import Endpoints, endpoints, exported_endpoints
from tests.support.redis_server import running_redis

# Property tests write no example database (the unit suite does no I/O; a failure prints its
# example) and time no example (a loaded machine is not a bug). `make test` runs each property
# with its full example count; `make unit`, the edit-test loop, with a quarter of it
# (--hypothesis-profile=quick): the same tests, less deep, in a few seconds.
hypothesis_settings.register_profile("tollgate", deadline=None, database=None)
hypothesis_settings.register_profile("quick", deadline=None, database=None, max_examples=25)
hypothesis_settings.load_profile("tollgate")

# Cheap password hashes in every platform a test runs in this process (and in its `serve`
# processes: tests/support/serve.py).
use_cheapest_argon2()


_CONTROLLER_STACK = ExitStack()


def pytest_configure(config: pytest.Config) -> None:
    """With pytest-xdist (`-n N`, as `make test` runs), the controller finds or starts the shared
    stack once and hands it to its workers: N workers racing to start one stack, and the first to
    finish stopping it under the others, would not work."""
    if config.getoption("numprocesses", default=None) and "PYTEST_XDIST_WORKER" not in os.environ:
        _CONTROLLER_STACK.enter_context(exported_endpoints())


def pytest_unconfigure(config: pytest.Config) -> None:
    _CONTROLLER_STACK.close()


@pytest.fixture(scope="session")
def infra() -> Iterator[Endpoints]:
    with endpoints() as found:
        yield found


@pytest.fixture(scope="session")
def template_db(infra: Endpoints) -> Iterator[str]:
    name = databases.create_template(infra.database_url)
    yield name
    databases.drop_template(infra.database_url, name)


@pytest.fixture(scope="session")
def environments(infra: Endpoints, template_db: str) -> Iterator[Environments]:
    made = Environments(infra, template_db)
    yield made
    made.close()


@pytest.fixture
def environment(environments: Environments) -> Iterator[Environment]:
    """The test's own database, ClickHouse database and topic prefix, made before it asked."""
    taken = environments.take()
    yield taken
    environments.give_back(taken)


@pytest.fixture
def database_url(environment: Environment) -> str:
    return environment.database_url


@pytest.fixture
def fresh_settings(infra: Endpoints, environment: Environment) -> Settings:
    """Settings of a test of its own (its environment: topics, consumer groups, CH database), also
    in a module whose `settings` are its shared platform's (see module_settings)."""
    return environment.settings(infra)


@pytest.fixture
def settings(fresh_settings: Settings) -> Settings:
    return fresh_settings


@pytest.fixture
async def app_client(settings: Settings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The whole platform (`--target all`) in this process, started and ready."""
    async with running_app(settings) as pair:
        yield pair


@pytest.fixture
async def client(app_client: tuple[FastAPI, httpx.AsyncClient]) -> httpx.AsyncClient:
    return app_client[1]


@pytest.fixture(scope="module")
def module_settings(infra: Endpoints, environments: Environments) -> Iterator[Settings]:
    """Settings of a module of its own (one environment) for a platform its tests share."""
    taken = environments.take()
    yield taken.settings(infra)
    environments.give_back(taken)


@pytest.fixture(scope="module")
async def module_app_client(module_settings: Settings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The whole platform started once for a module whose tests make their own accounts and need no
    platform of their own (no changed settings, no restart, no stopped parts): one start, not one per
    test. A module opts in by overriding `app_client` and `settings` with module_app_client and
    module_settings (`client` follows); a test of it that needs its own environment (its own
    platform or `serve` processes) takes `fresh_settings`."""
    async with running_app(module_settings) as pair:
        yield pair


@pytest.fixture(scope="module")
async def module_client(module_app_client: tuple[FastAPI, httpx.AsyncClient]) -> httpx.AsyncClient:
    """module_app_client's client, for a module whose tests need only the HTTP API."""
    return module_app_client[1]


@asynccontextmanager
async def opened_pool(database_url: str) -> AsyncIterator[AsyncConnectionPool]:
    """The services' own kind of Postgres pool on `database_url`, opened and ready."""
    opened = open_pool(database_url)
    await opened.open(wait=True)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[AsyncConnectionPool]:
    """opened_pool on the test's database."""
    async with opened_pool(settings.database_url) as opened:
        yield opened


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A redis-server of this test module's own (the shared rate-limit and admissions store)."""
    with running_redis() as url:
        yield url
