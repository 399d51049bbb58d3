"""The sink's insert pipeline: a batch's offsets are committed only after its insert, with the
explicit next offset of each partition; one insert at a time, in order; a failed insert
rewinds the consumer so the batch (and the one parsed meanwhile) is consumed again."""

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

    await pipe.submit(consumer, recs((0, 0), (0, 1)), writer("a", wait=True))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert consumer.log == []  # a is being written: nothing committed yet
    second = asyncio.create_task(pipe.submit(consumer, recs((0, 2)), writer("b")))  # type: ignore[arg-type]
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

    await pipe.submit(consumer, recs((0, 10), (0, 11), (1, 4)), boom)  # type: ignore[arg-type]
    with pytest.raises(InsertFailedError):
        await pipe.submit(consumer, recs((1, 5), (2, 7)), ok)  # type: ignore[arg-type]
    assert not [e for e in consumer.log if e[0] in ("commit", "wrote")]
    seeks = [e[1] for e in consumer.log if e[0] == "seek"]
    final = dict(seeks)  # the last seek of a partition wins
    assert final == {TopicPartition(T, 0): 10, TopicPartition(T, 1): 4, TopicPartition(T, 2): 7}
    # after the failure the pipeline is usable again
    await pipe.submit(consumer, recs((0, 10)), ok)  # type: ignore[arg-type]
    await pipe.drain()
    assert consumer.log[-2:] == [("wrote", "next"), ("commit", {TopicPartition(T, 0): 11})]
