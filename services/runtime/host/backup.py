"""`tollgate backup DIR` and `tollgate restore DIR` for the local stack (docs/backup.md).

A backup is a folder: `postgres.dump` (pg_dump's custom format of the whole database, every
service's schema), `clickhouse/` (the files of ClickHouse's own `BACKUP DATABASE`), `secrets/`
(the state directory's generated files the data goes with) and `manifest.json`, written last,
with the versions, the time, the row counts and a sha256 of every file. It is made in a
sibling folder and renamed into place at the end, so a failed backup leaves no folder behind.

Kafka is not in it: the services rebuild their topics from Postgres. Its data is kept, but a
restore to an older point leaves it *ahead* of Postgres (credentials made after the backup,
states newer than the restored rows), so restore ends by reconciling it with the restored
Postgres: `tollgate republish`, which ends what Postgres no longer holds and republishes the rest
above Kafka's versions (services/keys/reconcile.py), with Kafka and redis (the limiter store's
revocations) started for that time. Until that succeeds, the stack is marked not reconciled and
`tollgate up` (and `tollgate serve` against the stack) refuses to start
(services/runtime/host/restore_marker.py).

Restore never half-restores: it checks every file against the manifest before it writes
anything, restores Postgres into a new database and ClickHouse beside the database it replaces
(renamed aside, not dropped), and only once both are complete swaps the names and drops what
was replaced; a failure on the way drops what it made and puts back what it moved.
"""

import asyncio
import glob
import hashlib
import hmac
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

from services.runtime.host import chserver, restore_marker, stack
from services.runtime.host.private_files import write_private

FORMAT = 1
MANIFEST = "manifest.json"
POSTGRES_DUMP = "postgres.dump"
CLICKHOUSE_FILES = "clickhouse"
SECRETS = "secrets"
# The state directory's generated files the data depends on: the ClickHouse users' passwords (the
# analysts' DSNs) and the demo service token (its hash is in Postgres; only this file has the token).
SECRET_FILES = ("clickhouse-passwords.json", "demo-service-token.json")


class BackupError(Exception):
    """A backup or restore refused or failed; the message says why and what to do."""


class NotReconciled(BackupError):
    """The databases are restored, but Kafka could not be reconciled with them (the message says
    what to run before `tollgate up`)."""


# ---- backup --------------------------------------------------------------------------------------
def backup(cfg: stack.StackConfig, target: Path) -> dict[str, Any]:
    """Write a backup of the stack's Postgres database and ClickHouse database to `target` (a new
    or empty folder). Works on a running stack (pg_dump and BACKUP read consistent snapshots);
    starts Postgres and ClickHouse for the time of the backup if they are not running."""
    target = target.resolve()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise BackupError(f"{target} exists and is not an empty folder: back up into a new one")
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        with _databases_running(cfg):
            pg = _postgres_backup(cfg, work / POSTGRES_DUMP)
            ch = _clickhouse_backup(cfg, work / CLICKHOUSE_FILES)
        secrets_dir = work / SECRETS
        secrets_dir.mkdir(mode=0o700)
        for name in SECRET_FILES:
            if (cfg.state_dir / name).exists():
                _copy_private(cfg.state_dir / name, secrets_dir / name)
        manifest = {
            "format": FORMAT,
            "created_at": datetime.now(UTC).isoformat(),
            "tollgate_version": metadata.version("tollgate"),
            "postgres": pg,
            "clickhouse": ch,
            "secrets": sorted(p.name for p in secrets_dir.iterdir()),
            "kafka": "not included: rebuilt from Postgres (tollgate republish, the outbox relays at start)",
            "files": {str(p.relative_to(work)): _sha256(p) for p in sorted(work.rglob("*")) if p.is_file()},
        }
        write_private(work / MANIFEST, json.dumps(manifest, indent=2))
        if target.exists():
            target.rmdir()
        work.rename(target)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return {"backup": str(target), **{k: manifest[k] for k in ("created_at", "postgres", "clickhouse", "secrets")}}


def _postgres_backup(cfg: stack.StackConfig, dump: Path) -> dict[str, Any]:
    _run([stack._postgres_bin("pg_dump"), "--format=custom", f"--file={dump}", cfg.database_url], "pg_dump")
    import psycopg

    with psycopg.connect(cfg.database_url) as conn:
        version = conn.execute("SHOW server_version").fetchone()
        schemas = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema' ORDER BY 1"
        ).fetchall()
    return {
        "server_version": version[0] if version else "?",
        "database": cfg.database,
        "schemas": [row[0] for row in schemas],
        "pg_dump": _run([stack._postgres_bin("pg_dump"), "--version"], "pg_dump").strip(),
    }


def _clickhouse_backup(cfg: stack.StackConfig, out: Path) -> dict[str, Any]:
    name = f"tollgate-{uuid.uuid4().hex}"
    inside = _clickhouse_backups_dir(cfg) / name
    try:
        _ch(cfg, f"BACKUP DATABASE {cfg.database} TO File('{name}')")
        shutil.copytree(inside, out)
    finally:
        shutil.rmtree(inside, ignore_errors=True)
    rows = _ch(cfg, f"SELECT name, total_rows FROM system.tables WHERE database = '{cfg.database}' ORDER BY name FORMAT JSON")
    return {
        "server_version": _ch(cfg, "SELECT version()").strip(),
        "database": cfg.database,
        "tables": {row["name"]: row["total_rows"] for row in json.loads(rows)["data"]},
    }


# ---- restore -------------------------------------------------------------------------------------
def restore(cfg: stack.StackConfig, source: Path, *, force: bool) -> dict[str, Any]:
    """Restore the backup in `source` into the stack's Postgres and ClickHouse databases and its
    generated secrets. The stack must be stopped; an existing, non-empty stack is replaced only
    with `force`. Then Kafka is reconciled with the restored Postgres (`_reconcile_kafka`)."""
    source = source.resolve()
    manifest = _checked_manifest(source)
    running = [part for part, state in _running_parts(cfg).items() if state]
    if running:
        raise BackupError(f"the stack in {cfg.state_dir} is running ({', '.join(running)}): `tollgate down` first, then restore")
    _install_missing_secrets(cfg, source)  # before ClickHouse starts: it takes its users' passwords from them
    with _databases_running(cfg):
        contents = _what_is_there(cfg)
        if contents and not force:
            raise BackupError(
                f"the stack in {cfg.state_dir} is not empty ({'; '.join(contents)}): restore would replace all "
                "of it. Run `tollgate restore --force` to replace it, or restore into another TOLLGATE_STATE_DIR"
            )
        suffix = uuid.uuid4().hex[:12]
        staged_pg = _postgres_stage(cfg, source / POSTGRES_DUMP, f"{cfg.database}_restoring_{suffix}")
        try:
            replaced_ch = _clickhouse_restore(cfg, source / CLICKHOUSE_FILES, f"{cfg.database}_replaced_{suffix}")
        except BaseException:
            _pg_admin(cfg, f'DROP DATABASE IF EXISTS "{staged_pg}"')
            raise
        # From the swap on, Kafka is ahead of Postgres until the reconcile: marked before it, so
        # that no way out of restore (a failed reconcile, a kill) lets `tollgate up` start edges.
        was_pending = restore_marker.pending(cfg)
        restore_marker.mark(cfg, source)
        try:
            _postgres_swap(cfg, staged_pg, f"{cfg.database}_replaced_{suffix}")
        except BaseException:
            if not was_pending:  # Postgres is as it was: so is Kafka's match with it
                restore_marker.clear(cfg)
            _clickhouse_undo(cfg, replaced_ch)
            _pg_admin(cfg, f'DROP DATABASE IF EXISTS "{staged_pg}"')
            raise
        if replaced_ch:
            _ch(cfg, f"DROP DATABASE IF EXISTS {replaced_ch} SYNC")
        for name in manifest["secrets"]:
            _copy_private(source / SECRETS / name, cfg.state_dir / name)
        reconciled = _reconcile_kafka(cfg)
        restore_marker.clear(cfg)
    return {
        "restored": str(source),
        "created_at": manifest["created_at"],
        "replaced": contents,
        "postgres": manifest["postgres"]["schemas"],
        "clickhouse": manifest["clickhouse"]["tables"],
        "secrets": manifest["secrets"],
        "kafka": {"reconciled": reconciled},
    }


def _reconcile_kafka(cfg: stack.StackConfig) -> dict[str, int]:
    """`tollgate republish` against the restored Postgres, Kafka and redis started for it and
    stopped after: what was made after the backup is ended in the topics, and the restored states
    outrank the newer ones Kafka holds, before any edge rebuilds from them. Redis, because the
    limiter store's key revocations are the reconcile's second witness of ends (a deletion whose
    tombstone Kafka compacted away) and are read only when it is given the store's URL. How many
    states each topic got."""
    from services.runtime.host.republish import republish
    from services.runtime.platform.settings import Settings

    settings = Settings(
        kafka_bootstrap_servers=cfg.kafka_bootstrap,
        kafka_replication_factor=cfg.kafka_replication_factor,
        database_url=cfg.database_url,
        redis_url=cfg.redis_url,
    )
    try:
        stack.kafka_up(cfg)
        stack.redis_up(cfg)
        return asyncio.run(republish(settings))
    except (Exception, SystemExit) as exc:  # the stack's parts refuse to start with SystemExit
        raise NotReconciled(
            f"Postgres and ClickHouse are restored, but Kafka could not be reconciled with them ({exc}). "
            f"`tollgate up` and `tollgate serve` refuse to start until it is: {restore_marker.way_out(cfg)} "
            "(until then, Kafka may still hold credentials made after the backup)"
        ) from exc
    finally:
        stack.redis_down(cfg)
        stack.kafka_down(cfg)


def _checked_manifest(source: Path) -> dict[str, Any]:
    """The manifest, once every file it lists is there with its sha256 and the dump is readable."""
    try:
        manifest: dict[str, Any] = json.loads((source / MANIFEST).read_text())
    except FileNotFoundError:
        raise BackupError(f"{source} is not a Tollgate backup (no {MANIFEST}; an interrupted backup leaves none)") from None
    except ValueError as exc:
        raise BackupError(f"{source / MANIFEST} is not valid JSON: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise BackupError(f"{source} is a backup of format {manifest.get('format')!r}; this Tollgate reads format {FORMAT}")
    for relative, digest in manifest["files"].items():
        path = source / relative
        if not path.is_file():
            raise BackupError(f"{source} is incomplete: {relative} is missing")
        if not hmac.compare_digest(_sha256(path), digest):  # (the project's one rule for digests)
            raise BackupError(f"{source} is damaged: {relative} does not match its sha256 in {MANIFEST}")
    _run([stack._postgres_bin("pg_restore"), "--list", str(source / POSTGRES_DUMP)], "pg_restore --list")
    return manifest


def _running_parts(cfg: stack.StackConfig) -> dict[str, bool]:
    state = cfg.state_dir.resolve()
    tollgate = [state / "tollgate.pid", *map(Path, glob.glob(str(state / "split" / "*.pid")))]
    parts = {part: desc.startswith("running") for part, desc in stack.status(cfg).items()}
    return {"tollgate": any(stack._read_pid(p) for p in tollgate), **parts}


def _install_missing_secrets(cfg: stack.StackConfig, source: Path) -> None:
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    for name in ("clickhouse-passwords.json",):
        if (source / SECRETS / name).exists() and not (cfg.state_dir / name).exists():
            _copy_private(source / SECRETS / name, cfg.state_dir / name)


def _what_is_there(cfg: stack.StackConfig) -> list[str]:
    """What the stack holds that a restore would replace: Postgres schemas, ClickHouse tables."""
    import psycopg

    found: list[str] = []
    exists = _pg_admin(cfg, "SELECT 1 FROM pg_database WHERE datname = %s", cfg.database)
    if exists:
        with psycopg.connect(cfg.database_url) as conn:
            rows = conn.execute(
                "SELECT DISTINCT table_schema FROM information_schema.tables "
                "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1"
            ).fetchall()
        if rows:
            found.append("Postgres schemas " + ", ".join(r[0] for r in rows))
    tables = _ch(cfg, f"SELECT name FROM system.tables WHERE database = '{cfg.database}' ORDER BY name").split()
    if tables:
        found.append(f"ClickHouse tables {', '.join(tables)}")
    return found


def _postgres_stage(cfg: stack.StackConfig, dump: Path, staged: str) -> str:
    """The dump restored, in one transaction, into a new database `staged`; dropped on failure."""
    _pg_admin(cfg, f'CREATE DATABASE "{staged}"')
    try:
        url = cfg.database_url.rsplit("/", 1)[0] + f"/{staged}"
        restore_cmd = [stack._postgres_bin("pg_restore"), "--exit-on-error", "--single-transaction", "--no-owner"]
        _run([*restore_cmd, f"--dbname={url}", str(dump)], "pg_restore")
    except BaseException:
        _pg_admin(cfg, f'DROP DATABASE IF EXISTS "{staged}"')
        raise
    return staged


def _postgres_swap(cfg: stack.StackConfig, staged: str, replaced: str) -> None:
    """`staged` becomes the stack's database; the one it replaces (if any) is dropped after."""
    had_one = bool(_pg_admin(cfg, "SELECT 1 FROM pg_database WHERE datname = %s", cfg.database))
    if had_one:
        _pg_admin(cfg, f'ALTER DATABASE "{cfg.database}" RENAME TO "{replaced}"')
    try:
        _pg_admin(cfg, f'ALTER DATABASE "{staged}" RENAME TO "{cfg.database}"')
    except BaseException:
        if had_one:
            _pg_admin(cfg, f'ALTER DATABASE "{replaced}" RENAME TO "{cfg.database}"')
        raise
    if had_one:
        _pg_admin(cfg, f'DROP DATABASE "{replaced}"')


def _clickhouse_restore(cfg: stack.StackConfig, files: Path, replaced: str) -> str | None:
    """RESTORE the database; one already there is first renamed to `replaced` (returned: the
    caller drops it once Postgres is swapped too). On failure the original is put back."""
    name = f"tollgate-{uuid.uuid4().hex}"
    inside = _clickhouse_backups_dir(cfg) / name
    shutil.copytree(files, inside)
    try:
        if os.geteuid() == 0:  # the server runs as `nobody` (chserver.py) and must read them
            for path in [inside, *inside.rglob("*")]:
                shutil.chown(path, chserver.RUN_AS)
        had_one = _ch(cfg, f"SELECT count() FROM system.databases WHERE name = '{cfg.database}'").strip() == "1"
        if had_one:
            _ch(cfg, f"RENAME DATABASE {cfg.database} TO {replaced}")
        try:
            _ch(cfg, f"RESTORE DATABASE {cfg.database} FROM File('{name}')")
        except BaseException:
            _clickhouse_undo(cfg, replaced if had_one else None)
            raise
    finally:
        shutil.rmtree(inside, ignore_errors=True)
    return replaced if had_one else None


def _clickhouse_undo(cfg: stack.StackConfig, replaced: str | None) -> None:
    """Drop what a restore wrote and put the replaced database (if any) back under its name."""
    _ch(cfg, f"DROP DATABASE IF EXISTS {cfg.database} SYNC")
    if replaced:
        _ch(cfg, f"RENAME DATABASE {replaced} TO {cfg.database}")


# ---- the stack's parts -----------------------------------------------------------------------------
@contextmanager
def _databases_running(cfg: stack.StackConfig) -> Iterator[None]:
    """Postgres and ClickHouse answer inside; the ones this started are stopped after."""
    parts = stack.status(cfg)
    started_pg = not parts["postgres"].startswith("running")
    started_ch = not parts["clickhouse"].startswith("running")
    try:
        if started_pg:
            stack.postgres_up(cfg)
        if started_ch:
            stack.clickhouse_up(cfg)
        yield
    finally:
        if started_ch:
            stack.clickhouse_down(cfg)
        if started_pg:
            stack.postgres_down(cfg)


def _clickhouse_backups_dir(cfg: stack.StackConfig) -> Path:
    """Where BACKUP ... TO File(name) writes inside the server's data path (chserver.BACKUPS_DIR)."""
    return (cfg.state_dir / "clickhouse" / "data" / chserver.BACKUPS_DIR).resolve()


def _ch_response(cfg: stack.StackConfig, sql: str) -> httpx.Response:
    """A statement as the server's `ctl` user (its password: the state directory's control file)."""
    ctl = json.loads((cfg.state_dir / "clickhouse.ctl.json").read_text())
    return httpx.post(
        f"http://127.0.0.1:{cfg.clickhouse_http_port}/",
        content=sql,
        headers={"X-ClickHouse-User": "ctl", "X-ClickHouse-Key": ctl["ctl_password"]},
        timeout=3600,
    )


def _ch(cfg: stack.StackConfig, sql: str) -> str:
    response = _ch_response(cfg, sql)
    if response.status_code != 200:
        raise BackupError(f"ClickHouse refused `{sql}`: {response.text.strip()}")
    return response.text


def _pg_admin(cfg: stack.StackConfig, sql: str, *params: object) -> list[tuple[Any, ...]]:
    """A statement in the server's `postgres` database (creating, renaming, dropping databases)."""
    import psycopg

    with psycopg.connect(cfg.database_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        cursor = conn.execute(sql, params or None)
        return cursor.fetchall() if cursor.description else []


def _run(cmd: list[str], what: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603 (the stack's own binaries)
    if done.returncode != 0:
        raise BackupError(f"{what} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _copy_private(src: Path, dst: Path) -> None:
    write_private(dst, src.read_text())
