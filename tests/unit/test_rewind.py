"""A failed message (or batch) is rewound after the consumer's backoff (services/runtime/platform/
subscribe.py). A rebalance during the backoff takes partitions away; FastStream's nack then sought
them anyway, aiokafka raised IllegalStateError ("No current assignment"), and FastStream logged it
CRITICAL. Nothing was lost (the next owner starts from the commit), so that is the expected case:
those partitions are left alone, logged at info, and FastStream is told to skip the message
(neither commit nor seek again). Kafka is faked here (tests/integration/test_consumers_redelivery.py
has the real consumer)."""

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.errors import IllegalStateError
from faststream.exceptions import SkipMessage

from services.runtime.platform import subscribe
from services.runtime.platform.redelivery import Redelivery


class FakeConsumer:
    """aiokafka's consumer after a rebalance: only `assigned` partitions may be sought."""

    def __init__(self, *assigned: TopicPartition, raises_anyway: bool = False) -> None:
        self.assigned = set(assigned)
        self.raises_anyway = raises_anyway  # the assignment changed between the check and the seek
        self.sought: dict[TopicPartition, int] = {}

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        if self.raises_anyway or partition not in self.assigned:
            raise IllegalStateError(f"No current assignment for partition {partition}")
        self.sought[partition] = offset


def record(partition: int, offset: int, topic: str = "t.v1") -> ConsumerRecord[Any, Any]:
    return ConsumerRecord(topic, partition, offset, 0, 0, None, b"{}", None, 0, 2, [])


A, B = TopicPartition("t.v1", 0), TopicPartition("t.v1", 1)


def test_each_assigned_partition_goes_back_to_its_earliest_record_and_a_reassigned_one_is_left(caplog):
    consumer = FakeConsumer(A)
    caplog.set_level(logging.DEBUG, logger=subscribe.__name__)
    left = subscribe.rewind(consumer, [record(0, 7), record(1, 3), record(0, 5), record(1, 2)])
    assert consumer.sought == {A: 5} and left == [B]
    (line,) = [r for r in caplog.records if r.name == subscribe.__name__]
    assert line.levelno == logging.INFO and "resume from their commit" in line.getMessage()


def test_a_seek_that_raises_anyway_is_the_same_expected_case():
    consumer = FakeConsumer(A, B, raises_anyway=True)
    assert subscribe.rewind(consumer, [record(0, 1), record(1, 1)]) == [A, B]


def test_a_rewind_of_assigned_partitions_logs_nothing(caplog):
    caplog.set_level(logging.DEBUG, logger=subscribe.__name__)
    consumer = FakeConsumer(A, B)
    assert subscribe.rewind(consumer, [record(1, 4)]) == [] and consumer.sought == {B: 4}
    assert not [r for r in caplog.records if r.name == subscribe.__name__]


async def test_a_failure_whose_partition_was_taken_during_the_backoff_is_skipped_not_raised(monkeypatch, caplog):
    """Before: NackMessage, whose seek raised IllegalStateError inside FastStream (CRITICAL)."""
    redelivery = Redelivery("unit.rewind", ["t.v1"])
    monkeypatch.setattr(redelivery, "failed", lambda exc, topics=(): 0.0)
    consumer = FakeConsumer()  # the rebalance gave partition 0 to another member
    msg = SimpleNamespace(raw_message=(record(0, 9), record(1, 4)), consumer=consumer)
    consumer.assigned = {B}
    caplog.set_level(logging.DEBUG)
    with pytest.raises(SkipMessage) as skipped:
        async with subscribe._retried_after_backoff(redelivery, msg):  # type: ignore[arg-type]
            raise RuntimeError("postgres is down")
    assert isinstance(skipped.value.__cause__, RuntimeError)
    assert consumer.sought == {B: 4}  # the partition still here is redelivered
    assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL]
