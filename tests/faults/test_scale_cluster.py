"""The scaled-out shape under faults (issue #20): a three-node Kafka cluster (replication factor 3,
min.insync.replicas 2) and `up --split` (one process per service, two replicas of geo and
metering, behind nginx with deploy/ingress.conf), on a stack of its own ports.

- a broker SIGKILLed and restarted under end-to-end load: the API keeps answering (503 with the
  contract's body at worst, never 500 or a hang), and the books reconcile: every accepted usage
  event counted once in ClickHouse and in the quota counters, every admitted call once;
- a metering replica SIGKILLed mid-batch and left dead: its partitions move to the other replica
  (its consumer group then has one member owning every partition), same reconciliation;
- a key toggled off on the keys process is refused by every geo replica within 1 s;
- after a broker restart, a consumer's first offset of a partition is asked of its new leader
  (services/runtime/platform/moved_leaders.py), not of the old one for 5 minutes.

`make test-scale` runs it (not `make test-faults`: it starts three brokers of its own).
"""

import asyncio
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import CloseReason
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from contracts.topics import USAGE
from services.runtime.host import split, stack
from services.runtime.platform.kafka import adapt_started
from services.runtime.platform.settings import Settings
from tests.support import databases
from tests.support.apps import settings_env
from tests.support.infra import REPO, drop_clickhouse_database
from tests.support.platform import (
    Ingress,
    Tenant,
    Traffic,
    client,
    eventually,
    expect,
    metered_tokens,
    new_service_token,
    new_tenant,
    quota_used,
    run_traffic,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
CLIENT_TIMEOUT_S = 15.0  # a request slower than this counts as hung

# Ports below the ephemeral range (see tests/faults/conftest.py), clear of the test and fault stacks.
SCALE_STACK = stack.StackConfig(
    state_dir=REPO / ".tollgate" / "scale-stack",
    kafka_nodes=3,  # brokers on 27600, 27602, 27604; controllers on 27601, 27603, 27605
    kafka_port=27600,
    controller_port=27601,
    postgres_port=27632,
    clickhouse_http_port=27623,
    clickhouse_tcp_port=27690,
    redis_port=27679,
    clickhouse_extra_databases=("s_*",),
)
INGRESS_PORT = 27650
FIRST_REPLICA_PORT = 27651  # 27651..27658


@dataclass
class Cluster:
    shape: split.SplitShape
    settings: Settings
    env: dict[str, str]

    @property
    def ingress(self) -> Ingress:
        return Ingress.single(self.shape.ingress_url)

    @property
    def admin_token(self) -> str:
        assert self.settings.admin_token is not None
        return self.settings.admin_token.get_secret_value()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """The stack, then one split shape for the module's tests (each test has tenants of its own)."""
    stack.up(SCALE_STACK)
    tag = uuid.uuid4().hex[:10]
    server = SCALE_STACK.database_url
    url = databases.create_empty(server, f"s_{tag}")
    settings = Settings(
        kafka_bootstrap_servers=SCALE_STACK.kafka_bootstrap,
        kafka_replication_factor=SCALE_STACK.kafka_replication_factor,
        database_url=url,
        clickhouse_dsn=SCALE_STACK.clickhouse_dsn,
        clickhouse_database=f"s_{tag}",
        redis_url=SCALE_STACK.redis_url,
        topic_prefix=f"s{tag}.",
        session_secret=f"scale-secret-{tag}",
        admin_token=f"admin-{tag}",
        trusted_proxies=["127.0.0.1/32"],
    )
    shape = split.shape(SCALE_STACK.state_dir / f"split-{tag}", INGRESS_PORT, FIRST_REPLICA_PORT)
    env = settings_env(settings)
    try:
        split.start(shape, env)
        yield Cluster(shape, settings, env)
    finally:
        split.stop(shape.run_dir)
        databases.drop(server, url)
        drop_clickhouse_database(SCALE_STACK.clickhouse_dsn, f"s_{tag}")
        stack.down(SCALE_STACK)


def _dropped_call_events(cluster: Cluster) -> int:
    total = 0.0
    for replica in cluster.shape.replicas:
        try:
            text = httpx.get(f"{replica.base_url}/metrics", timeout=5).text
        except httpx.HTTPError:
            continue  # a replica killed on purpose: it reported nothing dropped before dying
        total += sum(float(v) for v in re.findall(r"^tollgate_edge_call_events_dropped_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))
    return int(total)


def _assert_answered_well(seen: Traffic) -> None:
    assert seen.calls and seen.posts
    assert 0 not in seen.statuses("calls") | seen.statuses("posts"), "a request hung or the connection broke"
    assert seen.slowest() < CLIENT_TIMEOUT_S
    assert seen.statuses("calls") <= {200, 429, 503}, seen.statuses("calls")
    assert seen.statuses("posts") <= {202, 429, 503}, seen.statuses("posts")
    for body in seen.bodies_5xx:
        assert '"code":"service_unavailable"' in body.replace(" ", ""), body


async def _reconcile(http: httpx.AsyncClient, cluster: Cluster, tenant: Tenant, seen: Traffic) -> None:
    """ClickHouse (metering) and the quota counters against what was accepted, exactly."""
    assert seen.accepted_events > 0
    ingress = cluster.ingress
    assert await wait_for(lambda: metered_tokens(http, ingress, tenant), seen.accepted_tokens) == seen.accepted_tokens
    counted_calls = sum(1 for status, _ in seen.calls if status not in {401, 403, 429})

    async def used() -> tuple[int, int]:
        q = await quota_used(http, ingress, tenant)
        return q["ai_tokens"], q["api_calls"]

    expected = (seen.accepted_tokens, counted_calls - _dropped_call_events(cluster))
    assert await wait_for(used, expected) == expected


async def _leaders(admin: AIOKafkaAdminClient, topic: str) -> dict[int, int]:
    """Partition -> the node leading it (-1 while none does)."""
    (described,) = await admin.describe_topics([topic])
    return {int(p["partition"]): int(p["leader"]) for p in described["partitions"]}


async def _busiest_usage_leader(settings: Settings) -> int:
    """The broker leading the usage partition that grows (one tenant: one key, one partition)."""
    topic = settings.topic(USAGE.name)
    tps = [TopicPartition(topic, p) for p in range(USAGE.partitions)]
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    await consumer.start()
    await admin.start()
    try:
        first = await consumer.end_offsets(tps)
        await asyncio.sleep(1)
        second = await consumer.end_offsets(tps)
        busiest = max(tps, key=lambda tp: second[tp] - first[tp]).partition
        return (await _leaders(admin, topic))[busiest]
    finally:
        await consumer.stop()
        await admin.close()


def _kill(pid_file: os.PathLike[str]) -> None:
    pid = stack._read_pid(pid_file)  # type: ignore[arg-type]
    assert pid is not None, f"nothing running for {pid_file}"
    os.killpg(pid, signal.SIGKILL)
    assert stack._wait_gone(pid, 10)


async def test_a_key_toggled_off_is_refused_by_every_geo_replica_within_a_second(cluster: Cluster):
    keys = cluster.shape.of("keys")[0]
    geos = cluster.shape.of("geo")
    async with client(CLIENT_TIMEOUT_S) as http:
        tenant = await new_tenant(http, cluster.ingress)  # professional: rate limits out of the way
        auth = tenant.api_key()

        async def refused_on(base_url: str, refused: bool) -> float:
            """Poll back to back until the replica refuses the key (401 api_key_disabled) or not."""
            started = time.perf_counter()
            while True:
                response = await http.get(f"{base_url}/api/geo/projects", headers=auth)
                if (response.status_code == 401) == refused:
                    if refused:
                        assert response.json()["error"]["code"] == "api_key_disabled", response.text
                    return time.perf_counter() - started
                assert time.perf_counter() - started < 5, f"{base_url}: still {response.status_code}"

        for geo in geos:
            await eventually(lambda g=geo: http.get(f"{g.base_url}/api/geo/projects", headers=auth), 200)
        lags: list[float] = []
        for _ in range(10):
            off = await expect(
                await http.post(f"{keys.base_url}/api/api-keys/{tenant.key_id}/toggle", headers=tenant.console()), 200
            )
            assert off["status"] == "disabled"
            lags += await asyncio.gather(*(refused_on(g.base_url, True) for g in geos))
            on = await expect(
                await http.post(f"{keys.base_url}/api/api-keys/{tenant.key_id}/toggle", headers=tenant.console()), 200
            )
            assert on["status"] == "enabled"
            await asyncio.gather(*(refused_on(g.base_url, False) for g in geos))
        assert max(lags) < 1.0, f"toggle -> refused lags (s): {sorted(lags)}"


async def test_a_broker_killed_and_restarted_under_load(cluster: Cluster):
    async with client(CLIENT_TIMEOUT_S) as http:
        tenant = await new_tenant(http, cluster.ingress)
        service = await new_service_token(http, cluster.ingress, cluster.admin_token)

        async def outage() -> None:
            await asyncio.sleep(3)
            victim = await _busiest_usage_leader(cluster.settings)
            await asyncio.to_thread(_kill, stack.kafka_pid_file(SCALE_STACK, victim))
            await asyncio.sleep(8)
            await asyncio.to_thread(stack.kafka_up, SCALE_STACK, victim)

        seen, _ = await asyncio.gather(run_traffic(http, cluster.ingress, tenant, service=service, seconds=20), outage())
        _assert_answered_well(seen)
        assert 202 in seen.statuses("posts")
        await _reconcile(http, cluster, tenant, seen)


async def test_a_metering_replica_killed_mid_batch(cluster: Cluster):
    victim, survivor = cluster.shape.of("metering")
    async with client(CLIENT_TIMEOUT_S) as http:
        tenant = await new_tenant(http, cluster.ingress)
        service = await new_service_token(http, cluster.ingress, cluster.admin_token)

        async def kill() -> None:
            await asyncio.sleep(5)
            await asyncio.to_thread(_kill, cluster.shape.pid_file(victim))

        try:
            seen, _ = await asyncio.gather(
                run_traffic(
                    http, cluster.ingress, tenant, service=service, seconds=16, tokens_per_event=5000, post_interval=0.02
                ),
                kill(),
            )
            _assert_answered_well(seen)
            assert seen.statuses("calls") <= {200, 429}, "the geo replicas were never touched"
            # the survivor alone consumes usage now: the ClickHouse rows and the counters reconcile
            await _reconcile(http, cluster, tenant, seen)
            ok = await http.get(f"{survivor.base_url}/readyz")
            assert ok.status_code == 200
        finally:
            split.start_replica(cluster.shape, victim, cluster.env)
            await asyncio.to_thread(split.wait_ready, cluster.shape)


async def _settled_leaders(admin: AIOKafkaAdminClient, topic: str, away_from: int | None = None) -> dict[int, int]:
    deadline = time.monotonic() + 60
    while True:
        try:
            leaders = await _leaders(admin, topic)
        except KafkaError:  # asked the broker that is away
            leaders = {}
        if leaders and all(node not in (-1, away_from) for node in leaders.values()):
            return leaders
        assert time.monotonic() < deadline, f"{topic}: leaders {leaders}"
        await asyncio.sleep(0.2)


async def test_a_partitions_first_offset_is_asked_of_its_new_leader_after_a_broker_restart(cluster: Cluster):
    """What stalled the sink after a metering replica died (moved_leaders.py): the survivor took a
    partition it had never read, whose leader its metadata still named from before a broker
    restart. Its first offset was asked of the old leader, refused, and asked again, with every
    fetch from that node held, until a metadata refresh due every 5 min."""
    settings = cluster.settings
    topic = settings.topic(f"moved-leader-{uuid.uuid4().hex[:8]}")
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers, enable_auto_commit=False)
    await admin.start()
    await producer.start()
    await consumer.start()
    adapt_started(consumer)
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=3)])
        leaders = await _settled_leaders(admin, topic)
        for partition in leaders:
            await producer.send_and_wait(topic, b"x", partition=partition)
        # The consumer learns every partition's leader and reads one of them.
        first = TopicPartition(topic, min(leaders))
        consumer.assign([first])
        await consumer.seek_to_beginning(first)
        assert (await asyncio.wait_for(consumer.getone(), 30)).partition == first.partition
        moving = next(p for p, node in leaders.items() if node != leaders[first.partition])
        restarted = leaders[moving]
        # Its idle connection to the broker that restarts was dropped before (as aiokafka drops one
        # idle for 9 min): nothing tells the consumer that the leadership moved.
        for (node, _), conn in list(consumer._client._conns.items()):
            if node == restarted:
                conn.close(reason=CloseReason.IDLE_DROP)
        await asyncio.to_thread(_kill, stack.kafka_pid_file(SCALE_STACK, restarted))
        await _settled_leaders(admin, topic, away_from=restarted)
        await asyncio.to_thread(stack.kafka_up, SCALE_STACK, restarted)
        assert consumer._client.cluster.leader_for_partition(TopicPartition(topic, moving)) == restarted, "not stale"

        consumer.assign([TopicPartition(topic, moving)])
        await consumer.seek_to_beginning(TopicPartition(topic, moving))
        record = await asyncio.wait_for(consumer.getone(), 30)  # without the refresh: 5 min
        assert (record.partition, record.offset) == (moving, 0)
    finally:
        await consumer.stop()
        await producer.stop()
        await admin.close()
