"""Postgres: one async connection pool per process; per-service schema migrations with yoyo."""

from pathlib import Path

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from yoyo import get_backend, read_migrations


def open_pool(database_url: str, *, max_size: int = 10) -> AsyncConnectionPool:
    """A pool that is not opened yet: `await pool.open(wait=True)` in the lifespan."""
    return AsyncConnectionPool(
        database_url,
        min_size=1,
        max_size=max_size,
        kwargs={"row_factory": dict_row, "autocommit": False},
        open=False,
    )


def yoyo_url(database_url: str) -> str:
    scheme, rest = database_url.split("://", 1)
    return f"postgresql+psycopg://{rest}" if scheme in {"postgres", "postgresql"} else database_url


def apply_migrations(database_url: str, service: str, migrations_dir: Path) -> None:
    """Apply a service's versioned SQL migrations (idempotent; yoyo locks against racing replicas).

    Each service keeps its own yoyo bookkeeping table, so services migrate independently.
    """
    backend = get_backend(yoyo_url(database_url), migration_table=f"_yoyo_migration_{service}")
    migrations = read_migrations(str(migrations_dir))
    with backend.lock():
        backend.apply_migrations(backend.to_apply(migrations))
