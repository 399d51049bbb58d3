"""Kafka is transport, never the store of record (issue #39, item 1), with real `serve` processes.

Kafka losing its data is simulated without touching the shared broker: the platform runs on
topic prefix A, makes its state (keys, one disabled, one deleted; a paid plan; a quota block; a
logout; service tokens, one revoked), and stops. Then it starts again on the same Postgres with a
new prefix B: every topic empty, as after a wiped disk. The owners' check at start republishes
from Postgres; meanwhile the edge is not ready (/readyz 503, every credential 503, never a 401 for
a valid key), and once ready, everything holds as it did on A. The real broker wipe and the
three-node cluster are in tests/faults/test_kafka_data_lost.py.
"""

import asyncio
import time
import uuid
from typing import Any

import httpx
import pytest

from services.runtime.platform.settings import Settings
from tests.integration.test_edge_verify import VERIFY
from tests.integration.test_keys_api import PASSWORD, bearer, code, new_key, signup
from tests.support.apps import ServeProcess, serve_process
from tests.support.infra import delete_topics_with_prefix
from tests.support.metering import wait_until
from tests.support.platform import usage_event
from tests.support.service_tokens import ADMIN_PATH, admin_headers

pytestmark = pytest.mark.integration
GEO = "/api/geo/projects"
BASIC_TOKENS = 1_000_000  # the basic plan's ai_tokens (contracts/plans.toml)


def verify_body(key: str) -> dict[str, Any]:
    return {"key": key, "method": "POST", "path": "/v1/chat", "ip": "203.0.113.7", "resource": "ai_tokens", "cost": 1}


async def token(client: httpx.AsyncClient, settings: Settings, scopes: list[str], name: str) -> dict[str, Any]:
    made = await client.post(ADMIN_PATH, json={"name": name, "scopes": scopes}, headers=admin_headers(settings))
    assert made.status_code == 201, made.text
    return dict(made.json())


async def make_state(client: httpx.AsyncClient, settings: Settings) -> dict[str, Any]:
    """Everything Kafka will lose, made through the public API on prefix A; and how A judges it."""
    account, owner = await signup(client)
    enabled, disabled, deleted = [await new_key(client, owner, name=n) for n in ("on", "off", "gone")]
    assert (await client.post(f"/api/api-keys/{disabled['id']}/toggle", headers=owner)).status_code == 200
    assert (await client.delete(f"/api/api-keys/{deleted['id']}", headers=owner)).status_code == 204
    switched = await client.post("/api/billing/subscription/switch", json={"plan": "basic"}, headers=owner)
    assert switched.status_code == 402, switched.text  # an upgrade is paid first
    order = switched.json()["error"]["details"]["order"]["id"]
    assert (await client.post(f"/api/billing/orders/{order}/pay", headers=owner)).status_code == 200
    service = await token(client, settings, ["keys:verify", "usage:write"], "gateway")
    revoked = await token(client, settings, ["keys:verify"], "retired")
    gone = await client.delete(f"{ADMIN_PATH}/{revoked['id']}", headers=admin_headers(settings))
    assert gone.status_code == 204, gone.text
    as_service = bearer(service["token"])
    used = await client.post("/api/usage/events", json={"events": [usage_event(account["id"], BASIC_TOKENS)]}, headers=as_service)
    assert used.status_code == 202, used.text
    login = await client.post("/api/auth/login", json={"email": account["email"], "password": PASSWORD})
    logged_out = bearer(login.json()["access_token"])
    assert (await client.post("/api/auth/logout", headers=logged_out)).status_code == 204

    async def blocked() -> bool:
        answer = (await client.post(VERIFY, json=verify_body(enabled["key"]), headers=as_service)).json()
        return bool(answer["quota"] and answer["quota"]["status"] == "exhausted")

    await wait_until(blocked, timeout=30)
    state = {
        "owner": owner,
        "logged_out": logged_out,
        "enabled": bearer(enabled["key"]),
        "disabled": bearer(disabled["key"]),
        "deleted": bearer(deleted["key"]),
        "service": as_service,
        "revoked": bearer(revoked["token"]),
        "enabled_key": enabled["key"],
    }
    state["seen"] = await judged(client, state)
    return state


async def judged(client: httpx.AsyncClient, state: dict[str, Any]) -> dict[str, Any]:
    """How a process judges each credential, the plan and the quota block."""

    async def outcome(response: httpx.Response) -> tuple[int, str]:
        return response.status_code, "ok" if response.status_code < 300 else code(response)

    seen: dict[str, Any] = {}
    for name in ("owner", "logged_out", "enabled", "disabled", "deleted"):
        seen[name] = await outcome(await client.get(GEO, headers=state[name]))
    seen["revoked"] = await outcome(await client.post(VERIFY, json=verify_body(state["enabled_key"]), headers=state["revoked"]))
    answer = await client.post(VERIFY, json=verify_body(state["enabled_key"]), headers=state["service"])
    assert answer.status_code == 200, answer.text
    body = answer.json()
    seen["verify"] = (body["code"], body["plan"], body["rate_limit"]["limit"], body["quota"]["total"], body["quota"]["status"])
    return seen


async def test_every_state_holds_again_on_empty_topics_and_a_valid_key_is_never_refused_meanwhile(infra, settings):
    with serve_process(settings) as a:
        async with httpx.AsyncClient(base_url=a.base_url, timeout=10) as on_a:
            state = await make_state(on_a, settings)
    assert state["seen"] == {
        "owner": (200, "ok"),
        "logged_out": (401, "invalid_session"),
        "enabled": (200, "ok"),
        "disabled": state["seen"]["disabled"],
        "deleted": (401, "invalid_api_key"),
        "revoked": (401, "invalid_service_token"),
        "verify": ("insufficient_quota", "basic", state["seen"]["verify"][2], BASIC_TOKENS, "exhausted"),
    }
    assert state["seen"]["disabled"][0] == 401

    # the same Postgres, every topic empty: Kafka lost its data
    lost = settings.model_copy(update={"topic_prefix": f"t{uuid.uuid4().hex[:10]}."})
    b = ServeProcess(lost)
    try:
        async with httpx.AsyncClient(base_url=b.base_url, timeout=10) as on_b:
            readiness, valid, disabled = [], [], []
            deadline = time.monotonic() + 60
            while True:
                assert time.monotonic() < deadline, f"never ready; log: {b.log_path}"
                assert b.proc.poll() is None, f"serve exited; log: {b.log_path}"
                try:
                    ready = (await on_b.get("/readyz")).status_code
                    valid.append((await on_b.get(GEO, headers=state["enabled"])).status_code)
                    disabled.append((await on_b.get(GEO, headers=state["disabled"])).status_code)
                except httpx.TransportError:
                    await asyncio.sleep(0.02)  # not listening yet
                    continue
                readiness.append(ready)
                if ready == 200:
                    break
            print(f"readyz while starting on empty topics: {readiness}")
            assert set(readiness) <= {200, 503}
            assert set(valid) <= {200, 503}, valid  # never refused for want of a projection
            assert 200 not in disabled, disabled  # refused throughout

            # ready means rebuilt: at once, everything as on A
            assert await judged(on_b, state) == state["seen"]
        b.stop()
        assert republished(b) == ["billing", "keys", "quota"]  # each owner once, for the topics it lost

        # the topics full again: a restart republishes nothing and judges as before
        c = ServeProcess(lost)
        try:
            c.wait_ready()
            async with httpx.AsyncClient(base_url=c.base_url, timeout=10) as on_c:
                assert await judged(on_c, state) == state["seen"]
        finally:
            c.stop()
        assert republished(c) == []
    finally:
        b.stop()
        await delete_topics_with_prefix(infra.kafka_bootstrap, lost.topic_prefix)


async def test_a_process_running_no_owner_is_not_ready_on_empty_topics_until_the_owners_checks_ran(infra, settings):
    """`serve --target geo` alone on topics Kafka lost (a geo replica of the split shape started
    first): nothing says the topics are whole, so /readyz is 503 and a valid key 503, never a 401
    (services/edge/state_complete.py), however long the owners take. Once a process running the
    owners has republished and written their state-complete.v1 records, it is ready and judges as before."""
    with serve_process(settings) as a:
        async with httpx.AsyncClient(base_url=a.base_url, timeout=10) as on_a:
            _account, owner = await signup(on_a)
            enabled, disabled = [await new_key(on_a, owner, name=n) for n in ("on", "off")]
            assert (await on_a.post(f"/api/api-keys/{disabled['id']}/toggle", headers=owner)).status_code == 200
    valid, refused = bearer(enabled["key"]), bearer(disabled["key"])

    lost = settings.model_copy(update={"topic_prefix": f"t{uuid.uuid4().hex[:10]}."})
    geo = ServeProcess(lost, "geo", others_done=False)
    owners: ServeProcess | None = None
    try:
        async with httpx.AsyncClient(base_url=geo.base_url, timeout=10) as on_geo:

            async def probe() -> tuple[int, int, int] | None:
                """/readyz, the valid key's and the disabled key's answers; None: not listening yet."""
                try:
                    return (
                        (await on_geo.get("/readyz")).status_code,
                        (await on_geo.get(GEO, headers=valid)).status_code,
                        (await on_geo.get(GEO, headers=refused)).status_code,
                    )
                except httpx.TransportError:
                    return None

            seen: list[tuple[int, int, int]] = []
            listening_since: float | None = None
            deadline = time.monotonic() + 60
            # 2 s with no owner anywhere: a process that did not wait for them is ready at its first answer
            while listening_since is None or time.monotonic() < listening_since + 2:
                assert time.monotonic() < deadline and geo.proc.poll() is None, f"log: {geo.log_path}"
                answer = await probe()
                if answer is not None:
                    listening_since = listening_since or time.monotonic()
                    seen.append(answer)
                await asyncio.sleep(0.1)
            assert set(seen) == {(503, 503, 503)}, seen  # not ready, and no key judged

            owners = ServeProcess(lost, "keys,billing,quota", others_done=False)
            while True:
                assert time.monotonic() < deadline + 60, f"never ready; logs: {geo.log_path}, {owners.log_path}"
                answer = await probe()
                assert answer is not None
                seen.append(answer)
                if answer[0] == 200:
                    break
                await asyncio.sleep(0.05)
            assert {s[1] for s in seen} <= {503, 200}, seen  # a valid key never refused 401
            assert 200 not in {s[2] for s in seen}, seen  # the disabled one never admitted
            assert (await on_geo.get(GEO, headers=valid)).status_code == 200
            assert code(await on_geo.get(GEO, headers=refused)) == "api_key_disabled"
    finally:
        geo.stop()
        if owners is not None:
            owners.stop()
        await delete_topics_with_prefix(infra.kafka_bootstrap, lost.topic_prefix)
    assert republished(owners) == ["keys", "quota"]  # the owners rebuilt them (billing holds nothing: a free plan)


def republished(process: ServeProcess) -> list[str]:
    """The owners whose check found their topics short, from the process's JSON log lines."""
    import json

    owners = []
    for line in process.log_path.read_text(errors="replace").splitlines():
        try:
            message = str(json.loads(line).get("message", ""))
        except ValueError:
            continue
        if ": Kafka lost states of " in message:
            owners.append(message.split(":", 1)[0])
    return sorted(owners)


async def _records(settings: Settings, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """Every record of `topic` (all partitions), in each partition's order."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from contracts.topics import ALL_TOPICS

    partitions = next(t.partitions for t in ALL_TOPICS if t.name == topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(settings.topic(topic), p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        records: list[tuple[bytes | None, bytes | None]] = []
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records += [(r.key, r.value) for r in batch]
        return records
    finally:
        await consumer.stop()


async def test_tollgate_republish_racing_toggles_leaves_the_newest_state_last(app_client, settings, pool):
    """`tollgate republish` while the services run: republishes interleaved with toggles of a key
    never leave an older state after a newer one in keys.v1 (what compaction keeps is the last)."""
    import json

    from services.runtime.host.republish import republish

    _app, client = app_client
    _account, owner = await signup(client)
    key = await new_key(client, owner)

    async def toggles() -> None:
        for _ in range(8):
            assert (await client.post(f"/api/api-keys/{key['id']}/toggle", headers=owner)).status_code == 200

    async def republishes() -> list[dict[str, int]]:
        return [await republish(settings, ["keys.v1", "accounts.v1"]) for _ in range(4)]

    _, done = await asyncio.gather(toggles(), republishes())
    assert all(d["keys.v1"] >= 1 and d["accounts.v1"] >= 1 for d in done)

    states = [json.loads(v) for k, v in await _records(settings, "keys.v1") if k == key["id"].encode() and v]
    async with pool.connection() as conn:
        row = await (await conn.execute("SELECT version, status FROM keys.api_keys WHERE id = %s", (key["id"],))).fetchone()
    versions = [s["version"] for s in states]
    assert versions == sorted(versions), versions  # never an older state after a newer one
    assert (states[-1]["version"], states[-1]["status"]) == (row["version"], row["status"])
    assert len(states) > 9  # the creation, 8 toggles, and republished copies among them


async def test_tollgate_republish_fills_empty_topics_from_postgres(settings):
    """The CLI's path on topics Kafka lost (a new prefix on the same database): every owner's.
    (The platform is stopped first: the outbox is one table, and a relay running on the old
    prefix would send the rows there.)"""
    import json

    from services.runtime.host.republish import OWNERS, republish

    with serve_process(settings) as a:
        async with httpx.AsyncClient(base_url=a.base_url, timeout=10) as client:
            account, owner = await signup(client)
            key = await new_key(client, owner)
    lost = settings.model_copy(update={"topic_prefix": f"t{uuid.uuid4().hex[:10]}."})
    try:
        done = await republish(lost)
        assert set(done) == set(OWNERS) and done["keys.v1"] == 1 and done["accounts.v1"] == 1 and done["users.v1"] == 1
        (state,) = [json.loads(v) for k, v in await _records(lost, "keys.v1") if v]
        assert (state["key_id"], state["account_id"], state["status"]) == (key["id"], account["id"], "enabled")
    finally:
        await delete_topics_with_prefix(settings.kafka_bootstrap_servers, lost.topic_prefix)


async def test_a_write_waits_for_a_republish_that_read_its_row(app_client, settings, pool):
    """Why a republish never puts an older state after a newer one: it reads the rows under a
    share lock, so a toggle of a row it read commits (and queues its outbox row) after it."""
    from services.keys.store import KeysStore
    from services.runtime.platform.outbox_relay import OutboxRelay

    _app, client = app_client
    _account, owner = await signup(client)
    key = await new_key(client, owner)
    async with KeysStore(pool, OutboxRelay(pool, settings, "keys")).transaction() as tx:
        assert key["id"] in {str(row["id"]) for row in await tx.all_live_keys()}
        toggle = asyncio.create_task(client.post(f"/api/api-keys/{key['id']}/toggle", headers=owner))

        async def a_lock_waited_for() -> bool:
            async with pool.connection() as conn:
                waiting = "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = %s"
                return bool((await (await conn.execute(waiting, ("Lock",))).fetchone())["n"])

        await wait_until(a_lock_waited_for, timeout=10, interval=0.02)
        assert not toggle.done()  # waits for the republish's transaction
    assert (await toggle).status_code == 200
