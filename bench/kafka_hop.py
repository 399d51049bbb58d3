"""Kafka's part of a toggle's lag: the producer's ack vs another consumer's receipt of the record.

On the 3-broker bench stack of bench/scale.py (started and stopped here): a producer as the outbox
relay's (idempotent, acks=all, linger 0) sends one record at a time while a consumer with the
processes' idle settings waits for it. Printed: the ack's delay after the send, and the receipt's
delay after the ack (<= 0: the consumer had it first). RF 3 (min.insync.replicas 2) against RF 1
as the baseline, same run.

    .venv/bin/python bench/kafka_hop.py [--sends 100]
"""

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.scale import BENCH_STACK
from bench.stats import percentile
from services.runtime.host import stack
from services.runtime.platform.kafka import FETCH_WAIT_MS, IDLE_WAKE_MS, PRODUCER_CONFIG


def _ms(samples: list[float]) -> str:
    return f"p50={percentile(samples, 50):.2f}ms p99={percentile(samples, 99):.2f}ms max={max(samples):.2f}ms"


async def hop(replication: int, sends: int) -> None:
    bootstrap = BENCH_STACK.kafka_bootstrap
    topic = f"hop-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        insync = str(min(2, replication))
        await admin.create_topics([NewTopic(topic, 3, replication, topic_configs={"min.insync.replicas": insync})])
    finally:
        await admin.close()
    await asyncio.sleep(2)  # the new partitions' leaders are known everywhere
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=FETCH_WAIT_MS, consumer_timeout_ms=IDLE_WAKE_MS)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, **PRODUCER_CONFIG)
    await consumer.start()
    await producer.start()
    acks: list[float] = []
    receipts: list[float] = []
    try:
        partitions = [TopicPartition(topic, p) for p in range(3)]
        consumer.assign(partitions)
        await consumer.seek_to_end(*partitions)
        for n in range(sends):
            received = asyncio.create_task(consumer.getmany(timeout_ms=5000))
            await asyncio.sleep(0.05)  # the consumer's fetch is parked at the leaders
            sent = time.perf_counter()
            await producer.send_and_wait(topic, b"x", key=str(n).encode())
            acked = time.perf_counter()
            assert await received, "the record did not arrive within 5 s"
            acks.append((acked - sent) * 1000)
            receipts.append((time.perf_counter() - acked) * 1000)
    finally:
        await producer.stop()
        await consumer.stop()
    print(f"RF {replication}: ack after the send {_ms(acks)}; receipt after the ack {_ms(receipts)} (n={sends})", flush=True)


def main(sends: int) -> None:
    stack.up(BENCH_STACK)
    try:
        asyncio.run(hop(3, sends))
        asyncio.run(hop(1, sends))  # baseline
    finally:
        stack.down(BENCH_STACK)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sends", type=int, default=100)
    main(parser.parse_args().sends)
