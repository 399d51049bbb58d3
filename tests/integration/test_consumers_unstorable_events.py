"""A valid contract event that the database cannot store (a NUL character in a text, a number past
a bigint) is dead-lettered with the database's reason, and its consumer goes on with the events
after it. Before, the handler's DataError was retried at every redelivery, for good: that
consumer group stopped for every account (a valid-but-unstorable event was a poison pill)."""

import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from aiokafka import AIOKafkaProducer

from contracts.audit import AuditAction, AuditContext
from contracts.common import Resource
from contracts.events import QuotaState
from contracts.topics import AUDIT, QUOTA, dead_letter
from tests.support.apps import running_app
from tests.support.metering import wait_until
from tests.support.topics import topic_records

pytestmark = pytest.mark.integration


def _rows(database_url: str, sql: str, *params: object) -> list[tuple]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


async def _send(bootstrap: str, topic: str, key: bytes, *values: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for value in values:  # one key, one partition: in this order
            await producer.send_and_wait(topic, value.encode(), key=key)
    finally:
        await producer.stop()


async def test_an_audit_entry_with_a_nul_character_is_dead_lettered_and_the_log_goes_on(settings):
    account = uuid.uuid4()
    now = datetime.now(UTC)
    poison = AuditContext(user_id=account, user_agent="nul\x00agent").entry(
        account, now, AuditAction.API_KEY_CREATED, "api_key", uuid.uuid4()
    )
    after = AuditContext(user_id=account, user_agent="fine").entry(
        account, now, AuditAction.API_KEY_DELETED, "api_key", uuid.uuid4()
    )
    async with running_app(settings, ("keys",)):
        await _send(
            settings.kafka_bootstrap_servers,
            settings.topic(AUDIT.name),
            str(account).encode(),
            poison.model_dump_json(),
            after.model_dump_json(),
        )

        async def stored() -> list[tuple]:
            return _rows(settings.database_url, "SELECT id FROM keys.audit_log WHERE account_id = %s", account)

        assert await wait_until(stored, timeout=30) == [(after.id,)]
    letters = await topic_records(settings.kafka_bootstrap_servers, settings.topic(dead_letter(AUDIT).name))
    assert [r.value for r in letters] == [poison.model_dump_json().encode()]
    assert b"NUL" in dict(letters[0].headers)["x-error"]


async def test_a_quota_state_past_a_bigint_is_dead_lettered_and_alerts_keeps_the_others(settings):
    """alerts.quota reads in batches: the one state is found among the batch's and dead-lettered."""
    accounts = [uuid.uuid4() for _ in range(5)]
    now = datetime.now(UTC)

    def state(account: uuid.UUID, used: int) -> QuotaState:
        period = now.strftime("%Y-%m")
        return QuotaState(
            account_id=account, time=now, resource=Resource.AI_TOKENS, period=period, total=100, used=used, blocked=True
        )

    states = [state(account, 2**63 if i == 2 else i) for i, account in enumerate(accounts)]
    async with running_app(settings, ("alerts",)):
        key = str(accounts[0]).encode()  # one partition, one batch
        await _send(settings.kafka_bootstrap_servers, settings.topic(QUOTA.name), key, *(s.model_dump_json() for s in states))

        async def stored() -> list[tuple]:
            sql = "SELECT account_id, used FROM alerts.quota_states WHERE account_id = ANY(%s) ORDER BY used"
            rows = _rows(settings.database_url, sql, accounts)
            return rows if len(rows) == 4 else []

        assert await wait_until(stored, timeout=30) == [(accounts[i], i) for i in (0, 1, 3, 4)]
    letters = await topic_records(settings.kafka_bootstrap_servers, settings.topic(dead_letter(QUOTA).name))
    assert [r.value for r in letters] == [states[2].model_dump_json().encode()]
    assert b"bigint out of range" in dict(letters[0].headers)["x-error"]
