"""`tollgate restore`'s reconcile of Kafka (services/runtime/host/backup.py `_reconcile_kafka`)
reads the local stack's redis too: the limiter store's key revocations are its second witness of
ends (a key deleted after the backup whose tombstone Kafka compacted away stays deleted; a
restored key moves past a stale entry that would keep refusing it). Before, restore never gave
the republish a REDIS_URL, so the entries were never read.

Kafka, redis and the republish are faked (no I/O)."""

from collections.abc import Collection
from pathlib import Path

import pytest

from services.runtime.host import backup, stack
from services.runtime.host import republish as owners
from services.runtime.platform.settings import Settings

STATES = {"keys.v1": 2}


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The stack's parts started and stopped by the reconcile, in order."""
    calls: list[str] = []
    for name in ("kafka_up", "redis_up", "redis_down", "kafka_down"):
        monkeypatch.setattr(stack, name, lambda cfg, name=name: calls.append(name))
    return calls


def test_the_reconcile_reads_the_stacks_redis(tmp_path: Path, parts: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    cfg = stack.StackConfig(state_dir=tmp_path, redis_port=16400)
    republished: list[Settings] = []

    async def republish(settings: Settings, topics: Collection[str] = ()) -> dict[str, int]:
        assert {"kafka_up", "redis_up"} <= set(parts)  # both answer while it runs
        republished.append(settings)
        return STATES

    monkeypatch.setattr(owners, "republish", republish)
    assert backup._reconcile_kafka(cfg) == STATES
    (settings,) = republished
    assert settings.redis_url == cfg.redis_url  # the limiter store's revocations are read
    assert (settings.database_url, settings.kafka_bootstrap_servers) == (cfg.database_url, cfg.kafka_bootstrap)
    assert parts[-2:] == ["redis_down", "kafka_down"]


def test_a_redis_that_does_not_start_fails_the_reconcile_with_the_way_out(
    tmp_path: Path, parts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = stack.StackConfig(state_dir=tmp_path)

    def taken(cfg: stack.StackConfig) -> None:
        raise SystemExit("redis: port 16379 on 127.0.0.1 is already in use")

    monkeypatch.setattr(stack, "redis_up", taken)
    with pytest.raises(backup.NotReconciled, match="already in use") as failed:
        backup._reconcile_kafka(cfg)
    assert "tollgate stack up" in str(failed.value) and f"REDIS_URL={cfg.redis_url} tollgate republish" in str(failed.value)
    assert parts[-2:] == ["redis_down", "kafka_down"]
