"""The handover's decision (services/runtime/platform/group_handover.py): the new group takes the
old one's offsets only when it has none of its own; the old offsets are deleted whenever they exist."""

from aiokafka import TopicPartition

from services.runtime.platform.group_handover import Handover, plan

P0, P1 = TopicPartition("calls.v1", 0), TopicPartition("calls.v1", 1)


def test_a_new_group_without_offsets_starts_where_the_old_one_left_off():
    assert plan(new={}, old={P0: 4, P1: 7}) == Handover(start={P0: 4, P1: 7}, delete_old=True)


def test_a_new_group_with_offsets_keeps_them_and_the_old_ones_still_go():
    assert plan(new={P0: 9}, old={P0: 4, P1: 7}) == Handover(start={}, delete_old=True)


def test_nothing_to_hand_over_on_a_first_deployment_or_once_done():
    assert plan(new={}, old={}) == Handover(start={}, delete_old=False)
    assert plan(new={P0: 9, P1: 3}, old={}) == Handover(start={}, delete_old=False)
