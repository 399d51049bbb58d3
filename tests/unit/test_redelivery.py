"""A consumer's backoff between attempts at a failing batch (services/runtime/platform/redelivery.py):
doubling from 0.5 s, capped at 30 s, with up to 0.5 s of jitter; counted on /metrics, reset by a success."""

import logging

import pytest
from prometheus_client import REGISTRY

from services.runtime.platform.redelivery import FIRST_DELAY_S, JITTER_S, MAX_DELAY_S, Redelivery, delay_after


@pytest.mark.parametrize(("failures", "base"), [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (6, 16.0), (7, 30.0), (50, 30.0)])
def test_the_delay_doubles_from_the_first_up_to_the_cap_plus_jitter(failures, base):
    delays = [delay_after(failures) for _ in range(200)]
    assert all(base <= delay <= base + JITTER_S for delay in delays)
    assert len(set(delays)) > 1  # jittered: a group's replicas do not retry in step


def test_even_the_shortest_delay_holds_retries_to_two_a_second():
    assert min(delay_after(1) for _ in range(200)) >= FIRST_DELAY_S == 0.5
    assert max(delay_after(10**6) for _ in range(200)) <= MAX_DELAY_S + JITTER_S  # no overflow far out


def _value(name: str, group: str, topic: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"group": group, "topic": topic})


def test_failures_are_counted_and_a_success_resets_the_backoff(caplog):
    group, topic = "unit.redelivery.a", "t.v1"
    redelivery = Redelivery(group, [topic])
    assert _value("tollgate_consumer_failures_total", group, topic) == 0  # on /metrics before the first failure
    assert _value("tollgate_consumer_consecutive_failures", group, topic) == 0

    caplog.set_level(logging.INFO, logger="services.runtime.platform.redelivery")
    delays = [redelivery.failed(RuntimeError(f"boom {i}")) for i in range(3)]
    assert [round(d - d % FIRST_DELAY_S, 1) for d in delays] == [0.5, 1.0, 2.0]
    assert _value("tollgate_consumer_failures_total", group, topic) == 3
    assert _value("tollgate_consumer_consecutive_failures", group, topic) == 3
    # one line per attempt: the first with its traceback, the next ones on one line each
    lines = [r for r in caplog.records if r.name == "services.runtime.platform.redelivery"]
    assert len(lines) == 3
    assert lines[0].exc_info is not None and lines[1].exc_info is None
    assert "3 times in a row (RuntimeError: boom 2)" in lines[2].getMessage()

    redelivery.succeeded()
    assert _value("tollgate_consumer_consecutive_failures", group, topic) == 0
    assert _value("tollgate_consumer_failures_total", group, topic) == 3  # a counter: the history stays
    assert FIRST_DELAY_S <= redelivery.failed(RuntimeError("again")) <= FIRST_DELAY_S + JITTER_S  # from the start


def test_a_batch_failure_counts_against_the_batch_s_topics():
    group = "unit.redelivery.b"
    redelivery = Redelivery(group, ["a.v1", "b.v1"])
    redelivery.failed(RuntimeError("x"), ["b.v1"])
    assert _value("tollgate_consumer_failures_total", group, "a.v1") == 0
    assert _value("tollgate_consumer_failures_total", group, "b.v1") == 1
    assert _value("tollgate_consumer_consecutive_failures", group, "a.v1") == 1  # the consumer is stuck on both
