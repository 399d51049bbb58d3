"""An idle consumer's pace: a long fetch wait once it has settled and nothing arrives.

Every aiokafka consumer has a fetch in flight at all times, held by the broker until a record
arrives or `fetch_max_wait_ms` is up; an idle process's CPU is mostly those fetches going round
(BENCHMARKS.md, "idle"). A long wait is no latency floor in steady state (the broker answers a
waiting fetch as soon as a record is appended), but it is one after a join: partitions whose
position is set while a fetch to their broker is in flight are fetched only once it ends. So each
consumer fetches with its own (short) wait for `SETTLE_S` after every new assignment, while any
partition has no position yet, and for `QUIET_S` after records came (a sink's `fetch_min_bytes`
batching is kept whenever records flow); only then with `IDLE_FETCH_WAIT_MS` and
`fetch_min_bytes=1`, so that the first record ends the wait at once, and with the fetcher task's
timer (`consumer_timeout_ms`, which only looks again while a fetch is in flight) at the same.

aiokafka has no setting for this: its fetcher builds each round's requests and timer from
`_fetch_max_wait_ms`, `_fetch_min_bytes` and `_fetcher_timeout`, and `pace_when_idle` sets them
before each round (wrapping the fetcher's planning on the instance). tests/unit/test_fetch_pace.py
fails if an aiokafka upgrade moves those.
"""

import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer

# Under the 5 s request timeout FastStream's consumers share with the producer (kafka.py): a fetch
# the broker holds this long still answers in time on a loaded machine.
IDLE_FETCH_WAIT_MS = 3000
SETTLE_S = 10.0  # after a new assignment (a join, a rebalance): the consumer's own wait
QUIET_S = 2.0  # after the last fetch that brought records: the consumer's own wait and min bytes


class FetchPace:
    """Chooses each fetch's wait and min bytes for one started consumer (see the module doc)."""

    def __init__(self, fetcher: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self._fetcher = fetcher
        self._clock = clock
        self._busy = (fetcher._fetch_max_wait_ms, fetcher._fetch_min_bytes, fetcher._fetcher_timeout)
        self._assignment: object = None
        self._assigned_at = 0.0
        self._records_at = clock()

    def is_idle(self, assignment: Any) -> bool:
        now = self._clock()
        if assignment is not self._assignment:
            self._assignment, self._assigned_at = assignment, now
        return (
            now - self._assigned_at >= SETTLE_S
            and now - self._records_at >= QUIET_S
            and all(assignment.state_value(tp).has_valid_position for tp in assignment.tps)
        )

    def plan(self, assignment: Any) -> None:
        """Before the fetcher builds its next requests."""
        idle = (IDLE_FETCH_WAIT_MS, 1, IDLE_FETCH_WAIT_MS / 1000)
        wait_ms, min_bytes, timer_s = idle if self.is_idle(assignment) else self._busy
        self._fetcher._fetch_max_wait_ms = wait_ms
        self._fetcher._fetch_min_bytes = min_bytes
        self._fetcher._fetcher_timeout = timer_s

    def fetched(self, has_records: bool) -> None:
        if has_records:
            self._records_at = self._clock()


def pace_when_idle(consumer: AIOKafkaConsumer) -> FetchPace:
    """Pace a started consumer's fetches: its own settings while joining or busy, long when idle."""
    fetcher = consumer._fetcher
    pace = FetchPace(fetcher)
    plan_requests = fetcher._get_actions_per_node
    fetch = fetcher._proc_fetch_request

    def planned(assignment: Any) -> Any:
        pace.plan(assignment)
        return plan_requests(assignment)

    async def fetched(assignment: Any, node_id: int, request: Any) -> bool:
        has_records: bool = await fetch(assignment, node_id, request)
        pace.fetched(has_records)
        return has_records

    fetcher._get_actions_per_node = planned
    fetcher._proc_fetch_request = fetched
    return pace
