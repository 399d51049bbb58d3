"""ClickHouse through clickhouse-connect: `http(s)://` for a server, `chdb:///path` embedded."""

import re
import uuid
from pathlib import Path

import clickhouse_connect
from clickhouse_connect.driver.client import Client

_MIGRATION_NAME = re.compile(r"^(\d{4})_[\w-]+\.sql$")


def connect(dsn: str, *, session: bool = False) -> Client:
    """A client for `dsn`. With chdb only one process may own a path: open it in one process.

    `session`: temporary tables outlive a statement. A chdb client is one session already; a
    server's HTTP client then sends its own session id (and must not run two queries at once).
    """
    if session and not dsn.startswith("chdb:"):
        return clickhouse_connect.get_client(dsn=dsn, session_id=f"tollgate-{uuid.uuid4()}")
    return clickhouse_connect.get_client(dsn=dsn)


def apply_migrations(client: Client, database: str, migrations_dir: Path) -> list[str]:
    """Apply numbered `NNNN_name.sql` files (statements split on `;`) not yet recorded.

    No well-kept migration tool speaks to chdb, so the bookkeeping is one small table.
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
