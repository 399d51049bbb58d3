"""Kafka lost its data (issue #39, item 1): the broker's data directory deleted under a running
stack, and one broker's data lost in the three-node cluster. Every key, plan, quota block,
logout and service token holds again without a manual step (the owners' state guard,
services/runtime/platform/state_guard.py), and a disabled key is refused throughout.
"""

import asyncio
import shutil
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from services.runtime.host import split, stack
from services.runtime.platform.settings import Settings
from tests.faults.test_scale_cluster import FIRST_REPLICA_PORT, INGRESS_PORT, SCALE_STACK
from tests.integration.test_republish import GEO, judged, make_state
from tests.support import databases
from tests.support.apps import ServeProcess, serve_process, settings_env
from tests.support.infra import drop_clickhouse_database

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
WITHIN_S = 120.0  # the guard checks every 30 s; the broker takes a while to come back


def _wipe(cfg: stack.StackConfig, node: int = 1) -> None:
    """Stop one Kafka node and delete its data (a lost disk); its cluster id stays, so it starts
    again as an empty member of the same cluster."""
    run = stack.kafka_pid_file(cfg, node).parent
    stack.stop_pid_file(run / "kafka.pid", f"kafka node {node}")
    shutil.rmtree(run / "data")


async def _holds_again(client: httpx.AsyncClient, state: dict[str, Any]) -> None:
    """Until everything is judged as before the loss: the disabled key is never admitted meanwhile."""
    deadline = time.monotonic() + WITHIN_S
    while True:
        try:
            disabled = await client.get(GEO, headers=state["disabled"])
            assert disabled.status_code != 200, disabled.text
            if await judged(client, state) == state["seen"]:
                return
        except (httpx.TransportError, KeyError, TypeError):
            pass  # a dependency still coming back: a 503 body has no quota to read
        assert time.monotonic() < deadline, "the states did not come back"
        await asyncio.sleep(1.0)


async def test_kafka_data_deleted_under_a_running_stack(fault_stack: stack.StackConfig, fault_settings: Settings):
    with serve_process(fault_settings) as running:
        async with httpx.AsyncClient(base_url=running.base_url, timeout=15) as client:
            state = await make_state(client, fault_settings)
            await asyncio.to_thread(_wipe, fault_stack)
            await asyncio.to_thread(stack.kafka_up, fault_stack)
            await _holds_again(client, state)

    # and a platform started on the emptied-then-republished Kafka judges as before at once
    again = ServeProcess(fault_settings)
    try:
        again.wait_ready(120)
        async with httpx.AsyncClient(base_url=again.base_url, timeout=15) as client:
            assert await judged(client, state) == state["seen"]
    finally:
        again.stop()


@pytest.fixture
def cluster_settings() -> Iterator[Settings]:
    stack.up(SCALE_STACK)
    tag = uuid.uuid4().hex[:10]
    url = databases.create_empty(SCALE_STACK.database_url, f"s_{tag}")
    try:
        yield Settings(
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
    finally:
        databases.drop(SCALE_STACK.database_url, url)
        drop_clickhouse_database(SCALE_STACK.clickhouse_dsn, f"s_{tag}")
        stack.down(SCALE_STACK)


async def test_one_brokers_data_lost_in_the_three_node_cluster(cluster_settings: Settings):
    """RF 3, min ISR 2: the wiped broker comes back empty and copies every partition from the
    other two; nothing is lost, and the split shape judges as before throughout."""
    shape = split.shape(SCALE_STACK.state_dir / f"split-{uuid.uuid4().hex[:6]}", INGRESS_PORT, FIRST_REPLICA_PORT)
    split.start(shape, settings_env(cluster_settings))
    try:
        async with httpx.AsyncClient(base_url=shape.ingress_url, timeout=15) as client:
            state = await make_state(client, cluster_settings)
            await asyncio.to_thread(_wipe, SCALE_STACK, 2)
            await asyncio.to_thread(stack.kafka_up, SCALE_STACK, 2)
            await _holds_again(client, state)
            for _ in range(20):  # and stays so
                assert (await client.get(GEO, headers=state["disabled"])).status_code != 200
                assert (await client.get(GEO, headers=state["enabled"])).status_code == 200
                await asyncio.sleep(0.5)
    finally:
        split.stop(shape.run_dir)
