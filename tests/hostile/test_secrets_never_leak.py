"""API keys, service tokens (and passwords) never appear in logs, events or tables: a real `tollgate serve` is put
through every key operation, then its log file, every message of the test's topics, every row of
the test's Postgres database and of its ClickHouse database are searched for the secrets, for any
`sk-` or `st-` + 40 URL-safe characters, and (as a control that the search reads the data) for the hashes."""

import asyncio
import hashlib
import json
import re
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime

import httpx
import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from services.runtime.platform.settings import Settings
from tests.hostile.conftest import Served
from tests.support.apps import REPO

pytestmark = pytest.mark.integration

ANY_KEY = re.compile(rb"s[kt]-[A-Za-z0-9_-]{40,}")
PASSWORD = "leak-hunting-password-7"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _exercise(base: str, admin_token: str) -> tuple[list[str], list[str]]:
    """Every key and service-token operation, successes and failures; returns (secrets, their hashes)."""
    with httpx.Client(base_url=base, timeout=30) as http:
        body = {"email": "leaks@example.com", "password": PASSWORD, "name": "Leak", "user_type": "individual"}
        assert http.post("/api/auth/register", json=body).status_code == 201
        assert http.post("/api/auth/login", json={"email": body["email"], "password": "wrong " + PASSWORD}).status_code == 401
        login = http.post("/api/auth/login", json={"email": body["email"], "password": PASSWORD})
        session = _bearer(login.json()["access_token"])
        first, second = (http.post("/api/api-keys", json={"name": n}, headers=session).json() for n in ("one", "two"))
        one, two = first["key"], second["key"]
        for path in ("/api/geo/projects", "/api/billing/check-quota", "/api/ai/usage/overview?range=today"):
            assert http.get(path, headers=_bearer(one)).status_code == 200
        assert http.post("/api/geo/projects", json={"name": "p"}, headers=_bearer(one)).status_code == 201
        assert http.get("/api/api-keys", headers=_bearer(one)).status_code == 403  # console only
        near_miss = one[:-1] + ("A" if one[-1] != "A" else "B")
        assert http.get("/api/geo/projects", headers=_bearer(near_miss)).status_code == 401
        assert http.get("/api/geo/projects", headers={"Authorization": one}).status_code == 401  # no scheme
        assert http.post(f"/api/api-keys/{second['id']}/toggle", headers=session).status_code == 200
        assert http.get("/api/geo/projects", headers=_bearer(two)).status_code == 401
        rotated = http.post(f"/api/api-keys/{first['id']}/rotate", json={"grace_seconds": 60}, headers=session).json()
        three = rotated["key"]
        assert http.get("/api/geo/projects", headers=_bearer(three)).status_code == 200
        assert http.delete(f"/api/api-keys/{second['id']}", headers=session).status_code == 204
        assert http.get("/api/geo/projects", headers=_bearer(two)).status_code == 401

        deadline = time.monotonic() + 30  # the calls reach calls.v1, ClickHouse and last_used_at
        while len(http.get("/api/activity-log", headers=session).json()["items"]) < 6:  # authenticated key calls
            assert time.monotonic() < deadline, "calls not in the activity log"
            time.sleep(0.2)
        # a platform service's token: created, used, refused on a customer route, revoked
        admin = _bearer(admin_token)
        made = http.post("/api/admin/service-tokens", json={"name": "gateway", "scopes": ["usage:write"]}, headers=admin)
        service = made.json()["token"]
        now = datetime.now(UTC).isoformat()
        usage = {
            "id": str(uuid.uuid4()),
            "time": now,
            "account_id": str(uuid.uuid4()),
            "resource": "api_calls",
            "quantity": 1,
            "source": "x",
        }
        assert http.post("/api/usage/events", json={"events": [usage]}, headers=_bearer(service)).status_code == 202
        assert http.get("/api/geo/projects", headers=_bearer(service)).status_code == 403
        st_miss = service[:-1] + ("A" if service[-1] != "A" else "B")
        assert http.post("/api/usage/events", json={"events": [usage]}, headers=_bearer(st_miss)).status_code == 401
        assert http.get("/api/admin/service-tokens", headers=admin).status_code == 200
        assert http.delete(f"/api/admin/service-tokens/{made.json()['id']}", headers=admin).status_code == 204
        assert http.post("/api/usage/events", json={"events": [usage]}, headers=_bearer(service)).status_code == 401
    secrets = [one, two, three, near_miss, service, st_miss]
    return secrets, [hashlib.sha256(s.encode()).hexdigest() for s in (one, two, three, service)]


async def _all_messages(settings: Settings) -> bytes:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    await admin.start()
    try:
        topics = [t for t in await admin.list_topics() if t.startswith(settings.topic_prefix)]
    finally:
        await admin.close()
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers, enable_auto_commit=False)
    await consumer.start()
    seen = bytearray()
    try:
        partitions = [TopicPartition(t, p) for t in topics for p in await _partitions(consumer, t)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        pending = {tp for tp, end in ends.items() if end > 0}
        while pending:
            for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
                for r in records:
                    seen += (r.key or b"") + b"\n" + (r.value or b"") + b"\n"
                    seen += b"".join(k.encode() + b"=" + (v or b"") + b"\n" for k, v in r.headers)
                if records and records[-1].offset + 1 >= ends[tp]:
                    pending.discard(tp)
    finally:
        await consumer.stop()
    assert topics and seen
    return bytes(seen)


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    known = consumer.partitions_for_topic(topic)
    if not known:
        await consumer._client.force_metadata_update()
        known = consumer.partitions_for_topic(topic)
    return known or set()


def _all_rows(database_url: str) -> bytes:
    with psycopg.connect(database_url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') AND table_type = 'BASE TABLE'"
        ).fetchall()
        dump = [f"{s}.{t}: " + " ".join(r[0] for r in conn.execute(f'SELECT x::text FROM "{s}"."{t}" x')) for s, t in tables]
    assert len(tables) > 10
    return "\n".join(dump).encode()


def _all_clickhouse_rows(dsn: str, database: str) -> bytes:
    """Read from a fresh interpreter, as any other client of the server would."""
    script = f"""
from services.runtime.platform import clickhouse
c = clickhouse.connect({dsn!r})
tables = c.query("SELECT name FROM system.tables WHERE database = {{db:String}}", parameters={{"db": {database!r}}})
for (t,) in tables.result_rows:
    print(t, c.query(f"SELECT * FROM `{database}`.`{{t}}`").result_rows)
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


async def test_api_keys_never_appear_in_logs_events_or_tables(served: Served):
    assert served.settings.admin_token is not None
    secrets, hashes = await asyncio.to_thread(_exercise, served.base_url, served.settings.admin_token.get_secret_value())
    events = await _all_messages(served.settings)
    rows = await asyncio.to_thread(_all_rows, served.settings.database_url)
    served.proc.stop()  # flushes the log
    log = served.proc.log_path.read_bytes()
    settings = served.settings
    clickhouse = await asyncio.to_thread(_all_clickhouse_rows, settings.clickhouse_dsn, settings.clickhouse_database)

    places = {"log": log, "events": events, "postgres": rows, "clickhouse": clickhouse}
    for where, text in places.items():
        for secret in secrets:
            body = secret[3:].encode()  # without the sk- or st- prefix
            assert body not in text, f"an API key in the {where}"
            assert body[:24] not in text and body[-24:] not in text, f"half an API key in the {where}"
        assert not ANY_KEY.search(text), f"something like an API key in the {where}: {ANY_KEY.search(text)}"
        assert PASSWORD.encode() not in text, f"the password in the {where}"
    # Controls: the search did read what it searched (the hashes are where they belong).
    assert all(h.encode() in events for h in hashes) and all(h.encode() in rows for h in hashes)
    assert b"call_events" in clickhouse and b"/api/geo/projects" in clickhouse and b"Application startup complete" in log
    json.loads(log.splitlines()[0])  # the log is the structured one
