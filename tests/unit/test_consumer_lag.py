"""The lag arithmetic (pure): records past a group's commit, per partition it committed on."""

from aiokafka import TopicPartition

from services.runtime.platform.consumer_lag import lag

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def test_lag_is_the_log_end_minus_the_commit_per_partition_committed_on():
    assert lag({A0: 10, A1: 7, B0: 3}, {A0: 4, A1: 7}) == {A0: 6, A1: 0}  # B0: never committed on


def test_a_commit_made_after_the_log_end_was_read_counts_as_no_lag_and_an_unread_end_as_unknown():
    assert lag({A0: 10}, {A0: 12, A1: 3}) == {A0: 0}
