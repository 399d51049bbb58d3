"""The edge's calls.v1 producer alone (issue 38): produce requests and CPU per call at a fixed rate.

One `CallRecorder` (services/edge/calls.py) in this process records `--rate` admitted calls a
second for `--seconds` against the test stack's Kafka (topics `bench<tag>.`, deleted afterwards)
and waits until Kafka has acknowledged them all. Printed: the produce requests this process sent
per call (aiokafka's connection counted), this process's CPU per call (the loop that makes the
calls included: compare runs, not absolute figures) and, with `--broker-pid`, the broker's
(a shared test broker also serves other clients: alternate the runs). 450 a second is one
request worker's share of a saturated metered GEO call on a quiet 2-core machine (http_load
round 22: ~900 a second over 2 workers).

    .venv/bin/python bench/calls_produce.py [--rate 450] [--seconds 10] [--broker-pid PID]
"""

import argparse
import asyncio
import collections
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka.conn import AIOKafkaConnection

from bench.support import endpoints
from contracts.topics import CALLS
from services.edge.calls import Call, CallRecorder
from services.runtime.platform.kafka import ensure_topics
from services.runtime.platform.settings import Settings
from tests.support.infra import delete_topics_with_prefix

SENT: collections.Counter[str] = collections.Counter()


def count_requests() -> None:
    """Count every request this process sends to Kafka, by kind."""
    send = AIOKafkaConnection.send

    def counted(self: AIOKafkaConnection, request: Any, expect_response: bool = True) -> Any:
        SENT[type(request).__name__.split("_v")[0]] += 1
        return send(self, request, expect_response)

    AIOKafkaConnection.send = counted  # type: ignore[method-assign]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:13]) / os.sysconf("SC_CLK_TCK")


async def main(rate: int, seconds: float, broker_pid: int | None) -> None:
    with endpoints() as infra:
        await run(infra.kafka_bootstrap, rate, seconds, broker_pid)


async def run(bootstrap: str, rate: int, seconds: float, broker_pid: int | None) -> None:
    settings = Settings(kafka_bootstrap_servers=bootstrap, topic_prefix=f"bench{uuid.uuid4().hex[:8]}.")
    await ensure_topics(settings, (CALLS,))
    count_requests()
    recorder = CallRecorder(settings)
    await recorder.start()
    accounts = [(uuid.uuid4(), uuid.uuid4()) for _ in range(5)]  # http_load's 5 accounts, a key each
    try:
        await asyncio.sleep(1)  # the producer's metadata and id are in place
        SENT.clear()
        broker_before = cpu_seconds(broker_pid) if broker_pid else 0.0
        cpu_before, started = time.process_time(), time.monotonic()
        made = 0
        while time.monotonic() - started < seconds:
            due = int((time.monotonic() - started) * rate)
            while made < due:
                account, key = accounts[made % len(accounts)]
                assert recorder.reserve()
                recorder.record(Call(datetime.now(UTC), account, key, "GET", "/api/geo/projects", 200, "192.0.2.1", "wrk", 3.0))
                made += 1
            await asyncio.sleep(0.002)
        while recorder.lanes.open:  # every event acknowledged  # noqa: ASYNC110 (a bench's poll)
            await asyncio.sleep(0.005)
        cpu = time.process_time() - cpu_before
        broker = cpu_seconds(broker_pid) - broker_before if broker_pid else None
    finally:
        await recorder.stop()
        await delete_topics_with_prefix(settings.kafka_bootstrap_servers, settings.topic_prefix)
    produce = SENT["ProduceRequest"]
    line = (
        f"{made} calls at {rate}/s: {produce} produce requests ({produce / made:.3f} per call, "
        f"{made / max(produce, 1):.0f} calls each); this process {cpu / made * 1e6:,.0f} us per call"
    )
    if broker is not None:
        line += f"; broker {broker / made * 1e6:,.0f} us per call"
    print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=450)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--broker-pid", type=int, default=None, help="the Kafka broker's pid, to read its CPU from /proc")
    args = parser.parse_args()
    asyncio.run(main(args.rate, args.seconds, args.broker_pid))
