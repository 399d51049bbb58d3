"""A warning repeated on every call is logged once per period, not once per call."""

import logging

import pytest

from services.runtime.platform.logs import Throttled


def test_a_repeated_warning_is_logged_once_per_period(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tests.throttled")
    once_a_minute, always = Throttled(logger, every_s=60), Throttled(logger, every_s=0)
    with caplog.at_level(logging.WARNING, logger="tests.throttled"):
        for _ in range(5):
            once_a_minute.warning("redis away")
            always.warning("each time")
    assert [r.getMessage() for r in caplog.records].count("redis away") == 1
    assert [r.getMessage() for r in caplog.records].count("each time") == 5
