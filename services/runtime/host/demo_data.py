"""Seven days of realistic usage for the demo account, so that a first run's console shows
something on every page. It goes through the public HTTP API only, as a user and a platform
service would: a paid plan upgrade (with its invoice), an alert rule that fires, API-key calls
through the edge (some refused), and usage events reported with the demo service token across
3 providers and 6 models.

Re-running it changes nothing already there: each usage event's id is derived from the account and
the hour it belongs to (the same hour always plans the same events, so a re-run's events are
duplicates), and the order, the alert rule and the keys (with the calls they made) are made only
when missing. A re-run a day later adds the hours since then, so the last seven days stay full.
"""

import asyncio
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

DAYS = 7
SOURCE = "demo-ai-gateway"
APP_KEY_NAME = "demo app"
RETIRED_KEY_NAME = "retired script"
ALERT_RULE = {"metric": "total_tokens", "threshold_pct": 5, "channels": ["in_site"], "recipients": []}
BATCH = 1000  # POST /api/usage/events takes at most this many events
# Fixed, so that the ids (and the Idempotency-Keys) of one account are the same at every run.
NAMESPACE = uuid.UUID("6f1d5a52-3c1e-4b8e-9a51-1d2f0c7e4a10")


@dataclass(frozen=True)
class Model:
    provider: str
    name: str
    weight: int  # how often it is picked, relative to the others
    input_tokens: tuple[int, int]
    output_tokens: tuple[int, int]


# The priced models of services/metering/data/prices.toml, so the costs are estimated too.
MODELS = (
    Model("openai", "gpt-4o", 3, (300, 2000), (100, 600)),
    Model("openai", "gpt-4o-mini", 5, (100, 800), (30, 300)),
    Model("anthropic", "claude-sonnet-4", 3, (400, 2500), (150, 800)),
    Model("anthropic", "claude-haiku-3.5", 4, (100, 900), (30, 300)),
    Model("google", "gemini-2.5-pro", 1, (500, 3000), (200, 900)),
    Model("google", "gemini-2.5-flash", 3, (100, 1000), (30, 300)),
)


class DemoDataError(Exception):
    """A call of the seeding was answered with something it cannot go on from."""


def _hours(now: datetime, days: int) -> Iterator[datetime]:
    """The starts of the last `days` * 24 hours, the current one included, oldest first."""
    current = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    for back in range(days * 24 - 1, -1, -1):
        yield current - timedelta(hours=back)


def planned_usage(
    account_id: uuid.UUID, now: datetime, api_key_id: uuid.UUID | None = None, days: int = DAYS
) -> list[dict[str, Any]]:
    """The usage events of the last `days` days up to `now` (every hour has some: busier in the
    working hours, quieter at the weekend). An hour's events depend on the account and the hour
    alone, so any run plans the same ids and times for it. Those of the current hour still ahead
    of `now` are moved back to `now`, within the same hour, as the API takes no future event."""
    events: list[dict[str, Any]] = []
    for hour in _hours(now, days):
        rng = random.Random(f"{account_id}/{hour.isoformat()}")
        count = rng.randint(3, 6) if 8 <= hour.hour < 20 else rng.randint(1, 2)
        if hour.weekday() >= 5:
            count = max(1, count // 2)
        for index in range(count):
            model = rng.choices(MODELS, weights=[m.weight for m in MODELS])[0]
            tokens_in, tokens_out = rng.randint(*model.input_tokens), rng.randint(*model.output_tokens)
            at = min(hour + timedelta(seconds=rng.randrange(3600)), now)
            # Two calls in three came through the demo app's key; the rest from the platform itself.
            key = api_key_id if rng.randrange(3) else None
            events.append(
                {
                    "id": str(uuid.uuid5(NAMESPACE, f"{account_id}/usage/{hour.isoformat()}/{index}")),
                    "time": at.isoformat(),
                    "account_id": str(account_id),
                    "resource": "ai_tokens",
                    "quantity": tokens_in + tokens_out,
                    "input_tokens": tokens_in,
                    "output_tokens": tokens_out,
                    "provider": model.provider,
                    "model": model.name,
                    "source": SOURCE,
                    **({"api_key_id": str(key)} if key else {}),
                }
            )
    return events


@dataclass
class Report:
    """What a run did; all zero on a re-run, but for the events of hours new since the last."""

    usage_events: int = 0
    new_usage_events: int = 0
    calls: int = 0
    refused_calls: int = 0
    paid_order: bool = False
    alert_rule: bool = False

    def as_dict(self) -> dict[str, int | bool]:
        return dict(self.__dict__)


# Answers worth a retry while the platform catches up: a just-made service token not yet known to
# the edge (401), a process whose projections are still catching up (503).
RETRY_WINDOW_S = 20.0


async def _call(
    http: httpx.AsyncClient, method: str, path: str, expect: tuple[int, ...], retry: tuple[int, ...] = (503,), **kwargs: Any
) -> httpx.Response:
    deadline = time.monotonic() + RETRY_WINDOW_S
    while True:
        response = await http.request(method, path, **kwargs)
        if response.status_code in expect:
            return response
        if response.status_code not in retry or time.monotonic() > deadline:
            raise DemoDataError(f"{method} {path}: {response.status_code} {response.text[:300]}")
        await asyncio.sleep(0.25)


def _key(account_id: uuid.UUID, what: str) -> str:
    return str(uuid.uuid5(NAMESPACE, f"{account_id}/{what}"))


async def _ensure_paid_order(http: httpx.AsyncClient, console: dict[str, str], account_id: uuid.UUID) -> bool:
    """An upgrade to basic, paid (a quota package instead if the account left free already): its
    invoice is on the Plan & account page. Nothing if the account has paid an order before."""
    orders = (await _call(http, "GET", "/api/billing/orders", (200,), params={"limit": 100}, headers=console)).json()
    if any(order["status"] == "paid" for order in orders["items"]):
        return False
    plan = (await _call(http, "GET", "/api/billing/subscription", (200,), headers=console)).json()["plan"]
    body: dict[str, Any] = (
        {"kind": "plan_upgrade", "plan": "basic"}
        if plan == "free"
        else {"kind": "quota_package", "package": {"resource": "ai_tokens", "amount": 100_000}}
    )
    # Idempotency-Keys of this account: a run cut short between ordering and paying resumes its order.
    order = (
        await _call(
            http,
            "POST",
            "/api/billing/orders",
            (201, 200),
            json=body,
            headers={**console, "Idempotency-Key": _key(account_id, "order")},
        )
    ).json()
    pay = {**console, "Idempotency-Key": _key(account_id, "pay")}
    await _call(http, "POST", f"/api/billing/orders/{order['id']}/pay", (200,), headers=pay)
    return True


async def _ensure_alert_rule(http: httpx.AsyncClient, console: dict[str, str]) -> bool:
    """An in-site alert at 5% of the monthly tokens, made before the usage is reported, so that the
    usage crosses it (whichever month most of the seven days fall in) and it fires."""
    rules = (await _call(http, "GET", "/api/ai/usage/alert", (200,), headers=console)).json()["rules"]
    if any(r["metric"] == ALERT_RULE["metric"] and r["threshold_pct"] == ALERT_RULE["threshold_pct"] for r in rules):
        return False
    await _call(http, "POST", "/api/ai/usage/alert", (201,), json=ALERT_RULE, headers=console)
    return True


async def _ensure_keys(http: httpx.AsyncClient, console: dict[str, str], report: Report) -> uuid.UUID:
    """The demo app's key, which made some calls (and one refused), and a retired script's key,
    disabled, whose calls are refused. Calls are made with a key only when it is made: its secret
    is shown that once. Returns the demo app key's id."""
    keys = {k["name"]: k for k in (await _call(http, "GET", "/api/api-keys", (200,), headers=console)).json()["items"]}
    if APP_KEY_NAME in keys:
        app_key_id = uuid.UUID(keys[APP_KEY_NAME]["id"])
    else:
        made = (await _call(http, "POST", "/api/api-keys", (201,), json={"name": APP_KEY_NAME}, headers=console)).json()
        app_key_id = uuid.UUID(made["id"])
        app = {"Authorization": f"Bearer {made['key']}", "User-Agent": "demo-app/1.4 (python-httpx)"}
        await _call(http, "POST", "/api/geo/projects", (201,), json={"name": "demo project"}, headers=app)
        report.calls += 1
        for path in ["/api/account", *["/api/geo/projects"] * 8, "/api/ai/usage/overview", "/api/account"]:
            await _call(http, "GET", path, (200,), headers=app)
            report.calls += 1
        # a console-only route: 403 console_session_required, logged as a refused call
        await _call(http, "GET", "/api/api-keys", (403,), headers=app)
        report.refused_calls += 1
    if RETIRED_KEY_NAME not in keys:
        made = (await _call(http, "POST", "/api/api-keys", (201,), json={"name": RETIRED_KEY_NAME}, headers=console)).json()
        await _call(http, "POST", f"/api/api-keys/{made['id']}/toggle", (200,), headers=console)
        old = {"Authorization": f"Bearer {made['key']}", "User-Agent": "nightly-export.sh curl/8.5.0"}
        for _ in range(2):  # a forgotten cron job still calling: 401 api_key_disabled
            await _call(http, "GET", "/api/geo/projects", (401,), headers=old)
            report.refused_calls += 1
    return app_key_id


async def seed(http: httpx.AsyncClient, *, email: str, password: str, service_token: str, now: datetime | None = None) -> Report:
    """Seed the account of `email` (which must exist) through `http` (its base URL: Tollgate's).
    `now`: the end of the seven days (the current time by default)."""
    report = Report()
    login = await _call(http, "POST", "/api/auth/login", (200,), json={"email": email, "password": password})
    console = {"Authorization": f"Bearer {login.json()['access_token']}"}
    account_id = uuid.UUID((await _call(http, "GET", "/api/account", (200,), headers=console)).json()["id"])
    # First the plan (its rate limits admit the calls below) and the rule (the usage then crosses it).
    report.paid_order = await _ensure_paid_order(http, console, account_id)
    report.alert_rule = await _ensure_alert_rule(http, console)
    app_key_id = await _ensure_keys(http, console, report)
    events = planned_usage(account_id, now or datetime.now(UTC), app_key_id)
    service = {"Authorization": f"Bearer {service_token}"}
    for start in range(0, len(events), BATCH):
        batch = events[start : start + BATCH]
        answer = await _call(http, "POST", "/api/usage/events", (202,), retry=(401, 503), json={"events": batch}, headers=service)
        report.usage_events += len(batch)
        report.new_usage_events += int(answer.json()["accepted"])
    return report
