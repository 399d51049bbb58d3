"""ClickHouse through clickhouse-connect, over HTTP(S) to a server (the local stack's or any other)."""

import re
from pathlib import Path

import clickhouse_connect
from clickhouse_connect.driver.client import Client

_MIGRATION_NAME = re.compile(r"^(\d{4})_[\w-]+\.sql$")


def connect(dsn: str) -> Client:
    """A client for `dsn` (`http(s)://user:password@host:port`)."""
    if not dsn.startswith(("http://", "https://")):
        raise ValueError(f"CLICKHOUSE_DSN must be an http(s):// URL of a ClickHouse server, not {dsn.split(':', 1)[0]}:")
    return clickhouse_connect.get_client(dsn=dsn)


def apply_migrations(client: Client, database: str, migrations_dir: Path) -> list[str]:
    """Apply numbered `NNNN_name.sql` files (statements split on `;`) not yet recorded.

    The bookkeeping is one small table (no well-kept migration tool speaks ClickHouse).
    `{db}` in a file is replaced by the target database. Returns the names applied.
    """
    client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    client.command(
        f"CREATE TABLE IF NOT EXISTS {database}.schema_migrations "
        "(name String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
        "ENGINE = MergeTree ORDER BY name"
    )
    done = {row[0] for row in client.query(f"SELECT name FROM {database}.schema_migrations").result_rows}
    applied: list[str] = []
    for path in sorted(migrations_dir.glob("*.sql")):
        if not _MIGRATION_NAME.match(path.name) or path.name in done:
            continue
        for statement in path.read_text().replace("{db}", database).split(";"):
            if statement.strip():
                client.command(statement)
        client.insert(f"{database}.schema_migrations", [[path.name]], column_names=["name"])
        applied.append(path.name)
    return applied
