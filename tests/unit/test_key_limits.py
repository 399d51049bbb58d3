"""(v4) The rules that narrow a key: what is accepted, and the windows its limits count in."""

from datetime import UTC, datetime
from uuid import uuid4
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from contracts.events import KeyState
from contracts.key_limits import KeyRules, LimitPeriod, model_allowed, window_of

UTC_ZONE = ZoneInfo("UTC")
BERLIN = ZoneInfo("Europe/Berlin")


def test_a_state_published_before_rules_allows_everything() -> None:
    state = KeyState.model_validate(
        {
            "time": "2026-11-26T10:00:00Z",
            "account_id": str(uuid4()),
            "key_id": str(uuid4()),
            "hash": "a" * 64,
            "status": "enabled",
            "roles": ["owner"],
        }
    )
    assert state.limits == [] and state.allowed_ips == [] and state.rate_limit is None


def test_rules_are_written_back_in_canonical_form() -> None:
    rules = KeyRules(
        allowed_ips=["203.0.113.7", "10.1.2.3/8", "2001:db8::1/32"],
        allowed_routes=["POST /v1/chat/completions", "GET /v1/*"],
        allowed_models=["openai/gpt-4o-mini", "anthropic/*"],
    )
    assert rules.allowed_ips == ["203.0.113.7/32", "10.0.0.0/8", "2001:db8::/32"]


@pytest.mark.parametrize(
    "body",
    [
        {"limits": [{"resource": "ai_tokens", "amount": 0, "period": "month"}]},
        {"limits": [{"resource": "ai_tokens", "amount": -5, "period": "month"}]},
        {"limits": [{"resource": "gpu_hours", "amount": 5, "period": "month"}]},
        {"limits": [{"resource": "ai_tokens", "amount": 5, "period": "year"}]},
        {
            "limits": [
                {"resource": "ai_tokens", "amount": 5, "period": "day"},
                {"resource": "ai_tokens", "amount": 9, "period": "day"},
            ]
        },
        {"allowed_ips": ["10.0.0.300/8"]},
        {"allowed_ips": ["office"]},
        {"allowed_routes": ["GET /v1/*/chat"]},
        {"allowed_routes": ["/v1/chat"]},
        {"allowed_routes": ["get /v1/chat"]},
        {"allowed_models": ["gpt-4o"]},
        {"allowed_models": ["*/gpt-4o"]},
        {"allowed_models": ["openai/gpt-*"]},
        {"rate_limit": {"per_second": 0, "burst": 1, "per_minute": 1}},
    ],
)
def test_bad_rules_are_refused(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        KeyRules.model_validate(body)


def test_one_resource_may_have_a_limit_per_period() -> None:
    rules = KeyRules.model_validate(
        {
            "limits": [
                {"resource": "ai_tokens", "amount": 5, "period": "day"},
                {"resource": "ai_tokens", "amount": 50, "period": "month"},
            ]
        }
    )
    assert [limit.period for limit in rules.limits] == [LimitPeriod.DAY, LimitPeriod.MONTH]


def test_windows_start_at_local_midnight() -> None:
    moment = datetime(2026, 11, 26, 23, 30, tzinfo=UTC)  # Friday 00:30 in Berlin
    assert window_of(LimitPeriod.DAY, moment, UTC_ZONE) == ("2026-11-26", datetime(2026, 11, 27, tzinfo=UTC_ZONE))
    assert window_of(LimitPeriod.DAY, moment, BERLIN) == ("2026-11-27", datetime(2026, 11, 28, tzinfo=BERLIN))
    assert window_of(LimitPeriod.WEEK, moment, UTC_ZONE) == ("2026-W48", datetime(2026, 11, 30, tzinfo=UTC_ZONE))
    assert window_of(LimitPeriod.MONTH, moment, UTC_ZONE) == ("2026-11", datetime(2026, 12, 1, tzinfo=UTC_ZONE))
    assert window_of(LimitPeriod.ONCE, moment, UTC_ZONE) == ("once", None)


def test_an_iso_week_may_belong_to_the_previous_year() -> None:
    assert window_of(LimitPeriod.WEEK, datetime(2027, 1, 1, 12, tzinfo=UTC), UTC_ZONE) == (
        "2026-W53",
        datetime(2027, 1, 4, tzinfo=UTC_ZONE),
    )


def test_a_day_across_a_dst_change_ends_at_the_next_local_midnight() -> None:
    # 2026-10-25 is 25 hours long in Berlin
    name, end = window_of(LimitPeriod.DAY, datetime(2026, 10, 25, 1, tzinfo=UTC), BERLIN)
    assert (name, end) == ("2026-10-25", datetime(2026, 10, 26, tzinfo=BERLIN))
    assert end is not None and end.utcoffset() == BERLIN.utcoffset(datetime(2026, 10, 26))


@pytest.mark.parametrize(
    ("patterns", "model", "allowed"),
    [
        ([], "openai/gpt-4o", True),  # no list: every model
        (["openai/gpt-4o"], "openai/gpt-4o", True),
        (["openai/gpt-4o"], "openai/gpt-4o-mini", False),  # exact, not a prefix
        (["openai/*"], "openai/gpt-4o-mini", True),
        (["openai/*"], "anthropic/claude-3", False),
        (["openai/*"], "openai-compat/gpt-4o", False),  # the provider whole, not its prefix
        (["openai/*"], "openai/", False),  # no model named
        (["openai/*"], "openai", False),
        (["openai/gpt-4o"], "OpenAI/gpt-4o", False),  # case-sensitive: never wider than written
        (["anthropic/claude-3", "openai/*"], "openai/o1", True),
        (["openai/gpt-4o"], "openai/*", False),  # a literal `*` model is not the wildcard
    ],
)
def test_model_allowed(patterns: list[str], model: str, allowed: bool) -> None:
    assert model_allowed(patterns, model) is allowed
