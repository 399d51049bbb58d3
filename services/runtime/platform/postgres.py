"""Postgres: one async connection pool per process; per-service schema migrations with yoyo."""

import select
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from yoyo import get_backend, read_migrations

Conn = TypeVar("Conn", bound=psycopg.AsyncConnection[Any])


def open_pool(database_url: str, *, max_size: int = 10) -> AsyncConnectionPool:
    """A pool that is not opened yet: `await pool.open(wait=True)` in the lifespan."""
    return AsyncConnectionPool(
        database_url,
        min_size=1,
        max_size=max_size,
        kwargs={"row_factory": dict_row, "autocommit": False, "connect_timeout": 3},
        # A request waits at most this long for a connection, then answers 503 (never hangs).
        timeout=3.0,
        # Hand out only live connections: after a Postgres restart, stale ones are replaced
        # instead of failing the first request that draws them.
        check=check_if_readable,
        open=False,
    )


async def check_if_readable(conn: psycopg.AsyncConnection[Any]) -> None:
    """The pool's check, with a round trip only when it can find something. An idle connection
    has nothing to read unless the server ended it (its error and EOF are then waiting) or sent
    a notice: a zero-timeout poll of the socket tells, where a round trip per checkout cost a
    twentieth of a metered call's time in the serving process (BENCHMARKS.md, "http_load")."""
    if conn.closed:
        raise psycopg.OperationalError("the connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        await AsyncConnectionPool.check_connection(conn)


@asynccontextmanager
async def autocommit(pool: "AsyncConnectionPool[Conn]") -> AsyncIterator[Conn]:
    """A pooled connection whose statements each commit on their own: one round trip for a
    one-statement read, where a transaction adds a BEGIN and a COMMIT."""
    async with pool.connection() as conn:
        await conn.set_autocommit(True)
        try:
            yield conn
        finally:
            if not conn.closed:
                await conn.set_autocommit(False)


def yoyo_url(database_url: str) -> str:
    scheme, rest = database_url.split("://", 1)
    return f"postgresql+psycopg://{rest}" if scheme in {"postgres", "postgresql"} else database_url


def apply_migrations(database_url: str, service: str, migrations_dir: Path) -> None:
    """Apply a service's versioned SQL migrations (idempotent; one process at a time).

    The service owns the Postgres schema named after it; yoyo keeps its bookkeeping there too,
    so services migrate independently and their migration ids never collide.
    """
    with psycopg.connect(database_url, autocommit=True) as conn:
        # Processes of one stack start together and each migrates. CREATE SCHEMA IF NOT EXISTS
        # and yoyo's own bookkeeping tables fail with a unique violation when two sessions create
        # them at the same moment (yoyo's lock lives in one of those tables), so a session
        # advisory lock per service comes first; closing the connection releases it.
        _lock_migrations(conn, service)
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(service)))
        separator = "&" if "?" in database_url else "?"
        backend = get_backend(f"{yoyo_url(database_url)}{separator}schema={service}")
        migrations = read_migrations(str(migrations_dir))
        try:
            with backend.lock():
                backend.apply_migrations(backend.to_apply(migrations))
        finally:
            backend.connection.close()


def _lock_migrations(conn: psycopg.Connection[Any], service: str, within_s: float = 300.0) -> None:
    """Take the service's migration lock, trying again every 50 ms. Not pg_advisory_lock: a
    session blocked in it is a running statement, and the holder's CREATE INDEX CONCURRENTLY
    (the outbox migrations) waits for every running statement to end: the two would wait for
    each other forever, unseen by Postgres's deadlock detector."""
    deadline = time.monotonic() + within_s
    name = f"tollgate.migrations.{service}"
    while conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (name,)).fetchone() != (True,):
        if time.monotonic() > deadline:
            raise TimeoutError(f"another process has been migrating {service} for {within_s:.0f} s")
        time.sleep(0.05)


async def try_xact_lock(conn: psycopg.AsyncConnection[Any], name: str) -> bool:
    """A transaction-scoped advisory try-lock on `name`: False when another session holds it
    (background passes shared by replicas skip their turn instead of waiting)."""
    cur = await conn.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s)) AS mine", (name,))
    row = await cur.fetchone()
    return bool(row and row["mine"])
