"""How long a consumer waits before its failed batch is handled again, and what the operator sees.

A handler's error other than an unstorable event (subscribe.py dead-letters those) is retried:
a code bug on one valid event, or Postgres or ClickHouse down. Nothing is dead-lettered and no
offset moves, so nothing is lost; but retried at once, the redelivery came back ~160 times a
second for as long as the error lasted, a hot loop that took a core and flooded the logs. So each
consumer waits between attempts, exponentially longer up to `MAX_DELAY_S` (with jitter, so that
the replicas of a group do not hammer a recovering database in step), and starts again from
`FIRST_DELAY_S` after a success.

Logged once per attempt (the first with its traceback, the others on one line), so at most one
line per `MAX_DELAY_S` once the wait is at its cap. The stall is on /metrics for an alert
(TollgateConsumerFailing): `tollgate_consumer_failures_total{group,topic}` counts every failed
attempt, `tollgate_consumer_consecutive_failures{group,topic}` is how many in a row, back to 0
on the first success.
"""

import logging
from collections.abc import Sequence

from prometheus_client import Counter, Gauge
from tenacity import RetryCallState, Retrying, wait_exponential, wait_random

log = logging.getLogger(__name__)

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 30.0  # well inside aiokafka's max_poll_interval (300 s): the wait never costs the group its member
JITTER_S = 0.5
_WAIT = wait_exponential(multiplier=FIRST_DELAY_S, max=MAX_DELAY_S) + wait_random(0, JITTER_S)

FAILURES = Counter(
    "tollgate_consumer_failures_total",
    "Failed attempts of a consumer to handle a batch (or one event), retried after a backoff, "
    "by consumer group and topic (unit: attempts)",
    ["group", "topic"],
)
CONSECUTIVE_FAILURES = Gauge(
    "tollgate_consumer_consecutive_failures",
    "Failed attempts in a row of a consumer to handle its next batch; 0 once one succeeds, "
    "by consumer group and topic (unit: attempts)",
    ["group", "topic"],
    multiprocess_mode="livemax",  # one process runs a group's consumer (serve's consumers' process)
)


def delay_after(failures: int) -> float:
    """Seconds to wait after the `failures`-th failure in a row (1, 2, ...): FIRST_DELAY_S doubled
    at each, at most MAX_DELAY_S, plus up to JITTER_S at random."""
    state = RetryCallState(Retrying(), None, (), {})
    state.attempt_number = failures
    return _WAIT(state)


class Redelivery:
    """One consumer's failures in a row: `failed` after an attempt failed (the caller waits the
    delay it returns before the next), `succeeded` after one worked."""

    def __init__(self, group: str, topics: Sequence[str]) -> None:
        self.group = group
        self.topics = tuple(topics)
        self.failures = 0
        for topic in self.topics:  # on /metrics at 0 from the start, so an alert can watch them
            FAILURES.labels(group, topic)
            CONSECUTIVE_FAILURES.labels(group, topic).set(0)

    def failed(self, error: BaseException, topics: Sequence[str] = ()) -> float:
        """Counts the failed attempt (against `topics`, those of the failed batch; all the
        consumer's by default) and logs it; returns the seconds to wait before the next."""
        self.failures += 1
        for topic in topics or self.topics:
            FAILURES.labels(self.group, topic).inc()
        for topic in self.topics:
            CONSECUTIVE_FAILURES.labels(self.group, topic).set(self.failures)
        delay = delay_after(self.failures)
        if self.failures == 1:
            log.error("consumer %s: handling failed; trying again in %.1f s", self.group, delay, exc_info=error)
        else:
            log.warning(
                "consumer %s: handling failed %d times in a row (%s: %s); trying again in %.1f s",
                self.group,
                self.failures,
                type(error).__name__,
                error,
                delay,
            )
        return delay

    def succeeded(self) -> None:
        if self.failures:
            log.info("consumer %s: handled again after %d failed attempts", self.group, self.failures)
            self.failures = 0
            for topic in self.topics:
                CONSECUTIVE_FAILURES.labels(self.group, topic).set(0)
