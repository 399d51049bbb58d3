"""The sink survives SIGKILL at any point: a real `tollgate serve --target metering` is killed
while it is writing, restarted, and the counts in ClickHouse are exact (nothing lost, nothing
counted twice), with duplicates and malformed messages in the stream."""

import asyncio
import json
import subprocess
import sys
import uuid

import httpx
import pytest
from faststream.kafka import KafkaBroker

from contracts.common import Role
from contracts.topics import CALLS, USAGE
from services.runtime.platform.kafka import ensure_topics
from tests.support.apps import REPO, ServeProcess
from tests.support.backfill import RANGE, call, produce, stamp, usage
from tests.support.metering import publish_account, session_token, wait_until

pytestmark = pytest.mark.integration


def read_back(dsn: str, database: str) -> dict:
    """Read the server back from a fresh interpreter, as another client would."""
    script = f"""
import json
from services.runtime.platform import clickhouse
c = clickhouse.connect({dsn!r})
db = {database!r}
q = lambda s: c.query(s).result_rows
print(json.dumps({{
  "usage_rows": q(f"SELECT count() FROM {{db}}.usage_events")[0][0],
  "usage_ids": q(f"SELECT uniqExact(id) FROM {{db}}.usage_events")[0][0],
  "rollup": [int(x) for x in q(f"SELECT sum(events), sum(total_tokens) FROM {{db}}.usage_hourly")[0]],
  "call_rows": q(f"SELECT count() FROM {{db}}.call_events")[0][0],
  "calls_rollup": int(q(f"SELECT sum(calls) FROM {{db}}.calls_hourly")[0][0]),
}}))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


async def test_sigkill_mid_batch_then_restart_counts_exactly(fault_settings, tmp_path):
    sub = fault_settings  # the serve processes write to the test's database on the ClickHouse server
    await ensure_topics(sub)
    account = uuid.uuid4()
    broker = KafkaBroker(sub.kafka_bootstrap_servers)
    async with broker:
        await publish_account(broker, sub, account, [Role.OWNER])
    token = session_token(sub, account)
    headers = {"Authorization": f"Bearer {token}"}

    usage_events = [usage(account, n) for n in range(60_000)]
    call_events = [call(account, n) for n in range(6_000)]
    ut, ct = sub.topic(USAGE.name), sub.topic(CALLS.name)
    key = str(account).encode()
    records = [(ut, key, e.model_dump_json().encode(), stamp(e)) for e in usage_events]
    records += [(ct, key, e.model_dump_json().encode(), stamp(e)) for e in call_events]
    records += [(ut, key, e.model_dump_json().encode(), stamp(e)) for e in usage_events[:5_000]]  # duplicates
    records += [(ut, key, b"not json", None), (ct, key, b'{"id": 1}', None)]  # malformed
    records.sort(key=lambda r: hash(r[2]) % 7)  # interleave topics and duplicates

    def visible_calls(proc: ServeProcess) -> int:
        try:
            r = httpx.get(f"{proc.base_url}/api/ai/usage/overview", params=RANGE, headers=headers, timeout=5)
        except httpx.HTTPError:
            return -1
        return int(r.json()["calls"]) if r.status_code == 200 else -1

    first = ServeProcess(sub, targets="metering")
    try:
        await asyncio.to_thread(first.wait_ready)
        producing = asyncio.create_task(produce(sub, records))

        async def some_written() -> bool:
            return 0 < await asyncio.to_thread(visible_calls, first) < len(usage_events)

        await wait_until(some_written, timeout=120, interval=0.05)
        first.kill()  # SIGKILL while the stream is being written
        killed_at = visible_calls(first)
        await producing
    finally:
        first.kill()
    assert killed_at == -1

    second = ServeProcess(sub, targets="metering")
    try:
        await asyncio.to_thread(second.wait_ready)
        # A sentinel after everything else on the same partition: once visible, all before it is.
        sentinel = usage(account, 100_000)  # a new id, inside RANGE
        await produce(sub, [(ut, key, sentinel.model_dump_json().encode(), stamp(sentinel))])

        async def caught_up() -> bool:
            return await asyncio.to_thread(visible_calls, second) >= len(usage_events) + 1

        await wait_until(caught_up, timeout=120, interval=0.2)
        assert visible_calls(second) == len(usage_events) + 1
    finally:
        second.stop()

    # calls.v1 has its own consumer (group and fetches): caught up on usage says nothing of it.
    async def calls_caught_up() -> bool:
        counted = await asyncio.to_thread(read_back, sub.clickhouse_dsn, sub.clickhouse_database)
        return counted["call_rows"] >= len(call_events)

    await wait_until(calls_caught_up, timeout=60, interval=0.2)
    counts = await asyncio.to_thread(read_back, sub.clickhouse_dsn, sub.clickhouse_database)
    expected_tokens = sum(e.input_tokens + e.output_tokens for e in [*usage_events, sentinel])
    assert counts == {
        "usage_rows": len(usage_events) + 1,
        "usage_ids": len(usage_events) + 1,
        "rollup": [len(usage_events) + 1, expected_tokens],
        "call_rows": len(call_events),
        "calls_rollup": len(call_events),
    }
