"""fetch_pace: a consumer's own fetch settings while it joins or records flow, a long wait once idle."""

import inspect
from dataclasses import dataclass, field

from aiokafka.consumer.fetcher import Fetcher

from services.runtime.platform.fetch_pace import IDLE_FETCH_WAIT_MS, QUIET_S, SETTLE_S, FetchPace


@dataclass
class PartitionState:
    has_valid_position: bool = True


@dataclass
class Assignment:
    states: dict[str, PartitionState] = field(default_factory=lambda: {"t-0": PartitionState(), "t-1": PartitionState()})

    @property
    def tps(self) -> list[str]:
        return list(self.states)

    def state_value(self, tp: str) -> PartitionState:
        return self.states[tp]


@dataclass
class FakeFetcher:
    _fetch_max_wait_ms: int = 250
    _fetch_min_bytes: int = 1024 * 1024
    _fetcher_timeout: float = 2.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def paced() -> tuple[FetchPace, FakeFetcher, Clock]:
    fetcher, clock = FakeFetcher(), Clock()
    return FetchPace(fetcher, clock), fetcher, clock


def test_a_new_assignment_fetches_with_the_consumers_own_settings_until_it_has_settled() -> None:
    pace, fetcher, clock = paced()
    assignment = Assignment()
    pace.plan(assignment)
    assert (fetcher._fetch_max_wait_ms, fetcher._fetch_min_bytes) == (250, 1024 * 1024)
    clock.now += SETTLE_S - 0.1
    pace.plan(assignment)
    assert fetcher._fetch_max_wait_ms == 250
    clock.now += 0.1
    pace.plan(assignment)
    assert (fetcher._fetch_max_wait_ms, fetcher._fetch_min_bytes) == (IDLE_FETCH_WAIT_MS, 1)
    assert fetcher._fetcher_timeout == IDLE_FETCH_WAIT_MS / 1000


def test_a_rebalance_starts_the_settling_again() -> None:
    pace, fetcher, clock = paced()
    pace.plan(Assignment())
    clock.now += SETTLE_S
    pace.plan(Assignment())
    assert fetcher._fetch_max_wait_ms == 250


def test_a_partition_without_a_position_keeps_the_short_wait() -> None:
    pace, fetcher, clock = paced()
    assignment = Assignment()
    pace.plan(assignment)
    clock.now += SETTLE_S * 3
    assignment.states["t-1"].has_valid_position = False  # a seek_to_beginning, a reset
    pace.plan(assignment)
    assert fetcher._fetch_max_wait_ms == 250


def test_records_bring_back_the_consumers_batching_until_quiet_again() -> None:
    pace, fetcher, clock = paced()
    assignment = Assignment()
    pace.plan(assignment)
    clock.now += SETTLE_S
    pace.fetched(has_records=True)
    pace.plan(assignment)
    assert (fetcher._fetch_max_wait_ms, fetcher._fetch_min_bytes, fetcher._fetcher_timeout) == (250, 1024 * 1024, 2.0)
    clock.now += QUIET_S
    pace.fetched(has_records=False)
    pace.plan(assignment)
    assert (fetcher._fetch_max_wait_ms, fetcher._fetch_min_bytes) == (IDLE_FETCH_WAIT_MS, 1)


def test_aiokafkas_fetcher_still_builds_each_request_where_the_pace_hooks_in() -> None:
    routine = inspect.getsource(Fetcher._fetch_requests_routine)
    assert "self._get_actions_per_node(assignment)" in routine
    assert "self._proc_fetch_request(assignment, node_id, request)" in routine
    planning = inspect.getsource(Fetcher._get_actions_per_node)
    assert "self._fetch_max_wait_ms" in planning and "self._fetch_min_bytes" in planning
    assert "self._fetcher_timeout" in planning
    assert "return needs_wakeup" in inspect.getsource(Fetcher._proc_fetch_request)
