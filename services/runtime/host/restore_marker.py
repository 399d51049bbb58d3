"""The local stack's "restored, Kafka not reconciled" marker (docs/backup.md, step 6).

From the moment `tollgate restore` puts the backup's Postgres in place until `tollgate republish`
has reconciled Kafka with it, Kafka is ahead of Postgres: its topics hold credentials made or
re-enabled after the backup, and every edge that starts rebuilds from them. A marker file in the
stack's state directory says so for that whole time (a reconcile that failed, or a restore killed
on the way, leaves it), and every command that starts Tollgate's processes against this stack
(`tollgate up`, and `tollgate serve` whose Kafka or Postgres is the stack's) refuses to start
while it is there. It goes when the reconcile succeeds: restore's own, or a later `tollgate
republish` of every topic against this stack's Postgres, Kafka and redis (the limiter store's
revocations are one of its witnesses).
"""

import json
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from services.runtime.host import stack
from services.runtime.host.private_files import write_private
from services.runtime.platform.settings import Settings

MARKER = "restore-not-reconciled.json"


def _path(cfg: stack.StackConfig) -> Path:
    return cfg.state_dir / MARKER


def mark(cfg: stack.StackConfig, source: Path) -> None:
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    write_private(_path(cfg), json.dumps({"restored": str(source), "at": datetime.now(UTC).isoformat()}))


def clear(cfg: stack.StackConfig) -> None:
    _path(cfg).unlink(missing_ok=True)


def pending(cfg: stack.StackConfig) -> bool:
    return _path(cfg).exists()


def republish_env(cfg: stack.StackConfig) -> dict[str, str]:
    """The settings that point `tollgate republish` at this stack (redis too: the reconcile reads
    the limiter store's revocations only when REDIS_URL is set)."""
    env = cfg.env()
    return {name: env[name] for name in ("KAFKA_BOOTSTRAP_SERVERS", "KAFKA_REPLICATION_FACTOR", "DATABASE_URL", "REDIS_URL")}


def way_out(cfg: stack.StackConfig) -> str:
    settings = " ".join(f"{name}={value}" for name, value in republish_env(cfg).items())
    return f"`tollgate stack up`, then `{settings} tollgate republish`"


def reconciles(cfg: stack.StackConfig, settings: Settings) -> bool:
    """Whether a republish with `settings` reconciles this stack: its Postgres, Kafka and redis."""
    return (
        settings.database_url == cfg.database_url
        and settings.kafka_bootstrap_servers == cfg.kafka_bootstrap
        and settings.redis_url == cfg.redis_url
    )


def _address(host: str | None, port: int | None) -> tuple[str, int | None]:
    return ("127.0.0.1" if host in (None, "", "localhost") else str(host), port)


def _kafka_addresses(bootstrap: str) -> set[tuple[str, int | None]]:
    return {_address(*_host_port(part.strip())) for part in bootstrap.split(",") if part.strip()}


def _host_port(address: str) -> tuple[str, int | None]:
    parts = urlsplit(f"//{address}")
    return parts.hostname or "", parts.port


def _postgres_address(url: str) -> tuple[str, int | None]:
    parts = urlsplit(url)
    return _address(parts.hostname, parts.port or 5432)


def runs_against(cfg: stack.StackConfig, settings: Settings) -> bool:
    """Whether processes with `settings` would run against this stack: its Kafka (their edges
    rebuild from its topics) or its Postgres (the restored one)."""
    return bool(_kafka_addresses(settings.kafka_bootstrap_servers) & _kafka_addresses(cfg.kafka_bootstrap)) or (
        _postgres_address(settings.database_url) == _postgres_address(cfg.database_url)
    )


def refusal(cfg: stack.StackConfig) -> str:
    """Why Tollgate's processes do not start against this stack (`tollgate up`, `tollgate serve`),
    and what to run."""
    return (
        f"the stack in {cfg.state_dir} was restored, but Kafka was never reconciled with the restored Postgres "
        f"({_path(cfg)}): it may still hold credentials made after the backup, and every edge would rebuild them. "
        f"Run {way_out(cfg)}; Tollgate starts (`tollgate up`, `tollgate serve`) once it succeeded"
    )
