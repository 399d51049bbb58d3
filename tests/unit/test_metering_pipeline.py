"""The sink's insert pipeline: a batch's offsets are committed only after its insert, with the
explicit next offset of each partition; one insert at a time, in order; a failed insert
rewinds the consumer so the batch (and the one parsed meanwhile) is consumed again; at a
rebalance the in-flight insert finishes first and a batch fetched before it is not written."""

import asyncio
from dataclasses import dataclass

import pytest
from aiokafka import TopicPartition

from services.metering.pipeline import InsertFailedError, InsertPipeline, batch_offsets

T = "usage"


@dataclass
class Rec:
    topic: str
    partition: int
    offset: int


class FakeConsumer:
    def __init__(self) -> None:
        self.log: list[tuple[str, object]] = []

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.log.append(("commit", dict(offsets)))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.log.append(("seek", (tp, offset)))


def recs(*spec: tuple[int, int]) -> list[Rec]:
    return [Rec(T, p, o) for p, o in spec]


def test_batch_offsets_are_first_and_next_per_partition():
    first, after = batch_offsets(recs((0, 5), (1, 9), (0, 6), (0, 7), (1, 10)))
    assert first == {TopicPartition(T, 0): 5, TopicPartition(T, 1): 9}
    assert after == {TopicPartition(T, 0): 8, TopicPartition(T, 1): 11}


async def test_commit_follows_the_insert_and_inserts_run_one_at_a_time_in_order():
    consumer, pipe, events = FakeConsumer(), InsertPipeline("t"), []
    gate = asyncio.Event()

    def writer(name: str, wait: bool = False):
        async def write() -> None:
            events.append(f"start {name}")
            if wait:
                await gate.wait()
            consumer.log.append(("wrote", name))
            events.append(f"end {name}")

        return write

    await pipe.submit(consumer, recs((0, 0), (0, 1)), writer("a", wait=True), 0)  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert consumer.log == []  # a is being written: nothing committed yet
    second = asyncio.create_task(pipe.submit(consumer, recs((0, 2)), writer("b"), 0))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    assert events == ["start a"]  # b waits for a
    gate.set()
    await second
    await pipe.drain()
    assert events == ["start a", "end a", "start b", "end b"]
    assert consumer.log == [
        ("wrote", "a"),
        ("commit", {TopicPartition(T, 0): 2}),
        ("wrote", "b"),
        ("commit", {TopicPartition(T, 0): 3}),
    ]


async def test_a_failed_insert_commits_nothing_and_rewinds_both_batches():
    consumer, pipe = FakeConsumer(), InsertPipeline("t")

    async def boom() -> None:
        raise RuntimeError("clickhouse down")

    async def ok() -> None:
        consumer.log.append(("wrote", "next"))

    await pipe.submit(consumer, recs((0, 10), (0, 11), (1, 4)), boom, 0)  # type: ignore[arg-type]
    with pytest.raises(InsertFailedError):
        await pipe.submit(consumer, recs((1, 5), (2, 7)), ok, 0)  # type: ignore[arg-type]
    assert not [e for e in consumer.log if e[0] in ("commit", "wrote")]
    seeks = [e[1] for e in consumer.log if e[0] == "seek"]
    final = dict(seeks)  # the last seek of a partition wins
    assert final == {TopicPartition(T, 0): 10, TopicPartition(T, 1): 4, TopicPartition(T, 2): 7}
    # after the failure the pipeline is usable again
    await pipe.submit(consumer, recs((0, 10)), ok, 0)  # type: ignore[arg-type]
    await pipe.drain()
    assert consumer.log[-2:] == [("wrote", "next"), ("commit", {TopicPartition(T, 0): 11})]


async def test_a_rebalance_waits_for_the_inflight_insert_and_drops_a_batch_fetched_before_it():
    consumer, pipe = FakeConsumer(), InsertPipeline("t")
    gate = asyncio.Event()

    async def slow() -> None:
        await gate.wait()
        consumer.log.append(("wrote", "a"))

    async def never() -> None:
        raise AssertionError("a batch fetched before the rebalance must not be written")

    generation = pipe.generation
    await pipe.submit(consumer, recs((0, 0)), slow, generation)  # type: ignore[arg-type]
    fetched_before = pipe.generation  # the handler of the next batch noted it, then parses...
    revoke = asyncio.create_task(pipe.on_partitions_revoked({TopicPartition(T, 0)}))
    await asyncio.sleep(0.01)
    assert not revoke.done()  # the rebalance waits for the insert in flight
    gate.set()
    await revoke
    assert consumer.log == [("wrote", "a"), ("commit", {TopicPartition(T, 0): 1})]
    assert await pipe.submit(consumer, recs((0, 1)), never, fetched_before) is False  # type: ignore[arg-type]
    await pipe.drain()
    assert consumer.log == [("wrote", "a"), ("commit", {TopicPartition(T, 0): 1})]  # nothing more
