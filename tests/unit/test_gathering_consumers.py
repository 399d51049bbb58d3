"""The groups no latency bound waits on gather (issue 38, decision 2): each fetch is held for up to
a second or a megabyte while records flow, so a trickle of calls wakes them once a second, not at
every record (docs/architecture.md, "Consumers batch"). The block path (quota.usage) does not."""

from collections.abc import Callable
from typing import Any
from unittest.mock import Mock

import pytest
from faststream.kafka import KafkaBroker, KafkaRouter

from services.alerts.consumers import build_router as alerts_router
from services.keys.consumers import build_router as keys_router
from services.quota.consumers import build_router as quota_router
from services.runtime.platform.kafka import FETCH_WAIT_MS
from services.runtime.platform.settings import Settings
from services.runtime.platform.subscribe import GATHER_MIN_BYTES

Build = Callable[[Any, KafkaBroker, Settings], KafkaRouter]


def fetch_settings(build: Build, group: str) -> tuple[int, int]:
    """(fetch_max_wait_ms, fetch_min_bytes) of the router's subscriber in `group`."""
    settings = Settings()
    router = build(Mock(), KafkaBroker(), settings)
    (subscriber,) = [s for s in router.subscribers if s.group_id == settings.group(group)]
    args = subscriber._connection_args  # FastStream keeps the aiokafka consumer's settings here
    return args["fetch_max_wait_ms"], args["fetch_min_bytes"]


@pytest.mark.parametrize(
    ("build", "group"),
    [(keys_router, "keys.last-used"), (quota_router, "quota.calls"), (alerts_router, "alerts.quota")],
)
def test_a_group_no_bound_waits_on_gathers_for_a_second(build: Build, group: str) -> None:
    assert fetch_settings(build, group) == (1000, GATHER_MIN_BYTES)


def test_the_block_path_takes_each_record_as_it_comes() -> None:
    assert fetch_settings(quota_router, "quota.usage") == (FETCH_WAIT_MS, 1)
