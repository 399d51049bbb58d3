"""`tollgate restore` leaves the local stack marked "not reconciled" from the moment Postgres is
the backup's until Kafka is reconciled with it (services/runtime/host/restore_marker.py), and
`tollgate up` refuses to start Tollgate while the mark is there: before, a restore whose reconcile
failed left only a message, and a later `up` started edges that rebuilt the credentials made after
the backup from the unreconciled topics. The mark goes with restore's own reconcile, or with a
`tollgate republish` of every topic against the same stack's Postgres, Kafka and redis.
`tollgate serve` run by hand against the stack (its Kafka or Postgres) refuses the same way.

The databases, Kafka and redis are faked (no I/O beyond a temporary state folder)."""

from collections.abc import Collection, Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from services.runtime.host import backup, cli, restore_marker, stack
from services.runtime.host import republish as owners
from services.runtime.platform.settings import Settings

STATES = {"keys.v1": 2}


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> stack.StackConfig:
    monkeypatch.setattr(cli, "STATE_DIR", tmp_path)
    for name in ("TOLLGATE_KAFKA_PORT", "TOLLGATE_POSTGRES_PORT", "TOLLGATE_REDIS_PORT", "TOLLGATE_KAFKA_NODES"):
        monkeypatch.delenv(name, raising=False)
    return cli._config()


@pytest.fixture
def restoring(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """backup.restore with every database step faked; what the steps saw goes into the dict."""
    seen: dict[str, Any] = {}
    manifest = {"created_at": "then", "postgres": {"schemas": []}, "clickhouse": {"tables": {}}, "secrets": []}
    fakes: dict[str, Any] = {
        "_checked_manifest": lambda source: manifest,
        "_running_parts": lambda cfg: {},
        "_install_missing_secrets": lambda cfg, source: None,
        "_databases_running": lambda cfg: nullcontext(),
        "_what_is_there": lambda cfg: [],
        "_postgres_stage": lambda cfg, dump, name: name,
        "_clickhouse_restore": lambda cfg, files, replaced: None,
        "_clickhouse_undo": lambda cfg, replaced: None,
        "_pg_admin": lambda cfg, sql, *params: [],
        "_ch": lambda cfg, sql: "",
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(backup, name, fake)

    def swap(cfg: stack.StackConfig, staged: str, replaced: str) -> None:
        seen["marked_at_swap"] = restore_marker.pending(cfg)
        if seen.get("swap_fails"):
            raise backup.BackupError("rename refused")

    def reconcile(cfg: stack.StackConfig) -> dict[str, int]:
        seen["marked_at_reconcile"] = restore_marker.pending(cfg)
        if seen.get("reconcile_fails"):
            raise backup.NotReconciled("kafka did not answer")
        return STATES

    monkeypatch.setattr(backup, "_postgres_swap", swap)
    monkeypatch.setattr(backup, "_reconcile_kafka", reconcile)
    yield seen


def test_restore_marks_the_stack_from_the_swap_and_clears_it_once_reconciled(
    cfg: stack.StackConfig, restoring: dict[str, Any], tmp_path: Path
) -> None:
    done = backup.restore(cfg, tmp_path / "backup", force=False)
    assert done["kafka"] == {"reconciled": STATES}
    assert restoring["marked_at_swap"] and restoring["marked_at_reconcile"]
    assert not restore_marker.pending(cfg)


def test_a_failed_reconcile_leaves_the_mark_and_up_refuses_until_a_republish_of_the_stack(
    cfg: stack.StackConfig, restoring: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    restoring["reconcile_fails"] = True
    with pytest.raises(backup.NotReconciled):
        backup.restore(cfg, tmp_path / "backup", force=False)
    assert restore_marker.pending(cfg)
    assert (cfg.state_dir / restore_marker.MARKER).stat().st_mode & 0o777 == 0o600

    monkeypatch.setattr(stack, "up", lambda cfg: pytest.fail("up started the stack of an unreconciled restore"))
    refused = CliRunner().invoke(cli.app, ["up"])
    assert refused.exit_code == 1
    assert "tollgate stack up" in refused.stderr and "tollgate republish" in refused.stderr, refused.stderr
    assert f"REDIS_URL={cfg.redis_url}" in refused.stderr and f"DATABASE_URL={cfg.database_url}" in refused.stderr

    republished: list[Settings] = []

    async def republish(settings: Settings, topics: Collection[str] = ()) -> dict[str, int]:
        republished.append(settings)
        return STATES

    monkeypatch.setattr(owners, "republish", republish)

    def run_republish(*args: str, **settings: Any) -> str:
        monkeypatch.setattr("services.runtime.platform.settings.get_settings", lambda: Settings(**settings))
        result = CliRunner().invoke(cli.app, ["republish", *args])
        assert result.exit_code == 0, result.output
        return result.stderr

    stack_settings = {
        "database_url": cfg.database_url,
        "kafka_bootstrap_servers": cfg.kafka_bootstrap,
        "redis_url": cfg.redis_url,
    }
    # without the stack's redis (no revocations read), another stack's Kafka, or not every topic:
    # still marked, and told what to run
    for args, settings in [
        ((), {**stack_settings, "redis_url": None}),
        ((), {**stack_settings, "kafka_bootstrap_servers": "127.0.0.1:29092"}),
        (("--topic", "keys.v1"), stack_settings),
    ]:
        assert "still not reconciled" in run_republish(*args, **settings)
        assert restore_marker.pending(cfg)
    assert "is reconciled" in run_republish(**stack_settings)
    assert not restore_marker.pending(cfg)
    assert len(republished) == 4


def test_a_failed_swap_leaves_no_mark_unless_one_was_there(
    cfg: stack.StackConfig, restoring: dict[str, Any], tmp_path: Path
) -> None:
    restoring["swap_fails"] = True
    with pytest.raises(backup.BackupError, match="rename refused"):
        backup.restore(cfg, tmp_path / "backup", force=False)
    assert not restore_marker.pending(cfg)  # Postgres is as it was: so is Kafka's match with it
    restore_marker.mark(cfg, tmp_path / "an earlier backup")  # an earlier restore's failed reconcile
    with pytest.raises(backup.BackupError, match="rename refused"):
        backup.restore(cfg, tmp_path / "backup", force=False)
    assert restore_marker.pending(cfg)


def test_up_starts_when_no_restore_waits(cfg: stack.StackConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    class Started(Exception):
        pass

    def up(cfg: stack.StackConfig) -> None:
        raise Started

    monkeypatch.setattr(stack, "up", up)
    result = CliRunner().invoke(cli.app, ["up"])
    assert isinstance(result.exception, Started)


class Started(Exception):
    """Tollgate's processes were about to start."""


@pytest.fixture
def serving(monkeypatch: pytest.MonkeyPatch) -> None:
    def started(target: str, *, consumers: bool = True) -> None:
        raise Started

    monkeypatch.setattr(cli, "worker_app", started)


def serve_with(monkeypatch: pytest.MonkeyPatch, **settings: Any) -> Any:
    for name in ("KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL"):  # the defaults, where not given
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("services.runtime.platform.settings.get_settings", lambda: Settings(**settings))
    return CliRunner().invoke(cli.app, ["serve", "--workers", "1"])


def test_serve_by_hand_against_the_unreconciled_stack_is_refused_as_up_is(
    cfg: stack.StackConfig, serving: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only `tollgate up` refused: `tollgate serve` started by hand against the restored stack
    rebuilt, from the unreconciled topics, the credentials the restore ended."""
    restore_marker.mark(cfg, tmp_path / "backup")
    up = CliRunner().invoke(cli.app, ["up"])
    for settings in (
        {"database_url": cfg.database_url, "kafka_bootstrap_servers": cfg.kafka_bootstrap},
        {"kafka_bootstrap_servers": cfg.kafka_bootstrap.replace("127.0.0.1", "localhost")},  # its Kafka alone
        {"database_url": cfg.database_url, "kafka_bootstrap_servers": "127.0.0.1:29092"},  # its Postgres alone
        {},  # the defaults are the local stack's
    ):
        refused = serve_with(monkeypatch, **settings)
        assert refused.exit_code == 1 and not isinstance(refused.exception, Started), settings
        assert refused.stderr.removeprefix("serve: ") == up.stderr.removeprefix("up: ")
        exact = " ".join(f"{name}={value}" for name, value in restore_marker.republish_env(cfg).items())
        assert f"`{exact} tollgate republish`" in refused.stderr, refused.stderr


def test_serve_starts_against_another_stack_or_once_reconciled(
    cfg: stack.StackConfig, serving: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = {"database_url": "postgresql://tollgate@127.0.0.1:25432/tollgate", "kafka_bootstrap_servers": "127.0.0.1:29092"}
    restore_marker.mark(cfg, tmp_path / "backup")
    assert isinstance(serve_with(monkeypatch, **elsewhere).exception, Started)  # not this stack's
    restore_marker.clear(cfg)
    assert isinstance(serve_with(monkeypatch).exception, Started)
