"""What the console's browser stories share: sizes, waits, screenshots, an account registered over
the API, the sign-in form, a fresh page that records its script errors, a pass of billing's renewal
job at a chosen instant. Their fixtures (`server`, `browser`, `webhook_receiver`) are in conftest.py."""

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
from playwright.sync_api import Browser, Locator, Page, ViewportSize, expect

from services.billing.delivery import EdgeDelivery
from services.billing.payments import TestProvider
from services.billing.service import BillingService
from services.billing.store import BillingStore
from services.edge import Edge
from services.runtime.platform.outbox_relay import OutboxRelay
from services.runtime.platform.settings import Settings
from tests.conftest import opened_pool
from tests.support.apps import REPO
from tests.support.service_tokens import ADMIN_PATH, admin_headers

T = TypeVar("T")

SCREENSHOTS = REPO / "artifacts" / "screenshots"
LAPTOP: ViewportSize = {"width": 1366, "height": 850}
PHONE: ViewportSize = {"width": 390, "height": 844}
WAIT_MS = 20_000
PASSWORD = "correct horse battery"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass(frozen=True)
class Registered:
    email: str
    account: dict[str, Any]  # the register answer: id, roles, ...
    console: dict[str, str]  # headers with a console session of the account (logged in over the API)

    @property
    def account_id(self) -> uuid.UUID:
        return uuid.UUID(self.account["id"])


def register(api: httpx.Client, prefix: str, name: str, *, password: str = PASSWORD, user_type: str = "individual") -> Registered:
    """A new account (its e-mail `prefix-<random>@example.com`), registered and logged in over the API."""
    email = f"{prefix}-{uuid.uuid4().hex[:8]}@example.com"
    made = api.post("/api/auth/register", json={"email": email, "password": password, "name": name, "user_type": user_type})
    assert made.status_code == 201, made.text
    login = api.post("/api/auth/login", json={"email": email, "password": password})
    assert login.status_code == 200, login.text
    return Registered(email, made.json(), bearer(login.json()["access_token"]))


def service_token(api: httpx.Client, settings: Settings, name: str, scopes: tuple[str, ...] = ("usage:write",)) -> str:
    """A platform service's token (what may report usage), made over the operator's API."""
    made = api.post(ADMIN_PATH, json={"name": name, "scopes": list(scopes)}, headers=admin_headers(settings))
    assert made.status_code == 201, made.text
    return str(made.json()["token"])


def create_key(api: httpx.Client, console: dict[str, str], name: str, **fields: Any) -> dict[str, Any]:
    """A key made over the API; the answer carries its secret (`key`) once."""
    made = api.post("/api/api-keys", json={"name": name, **fields}, headers=console)
    assert made.status_code == 201, made.text
    return dict(made.json())


def open_console(browser: Browser, base: str, viewport: ViewportSize = LAPTOP) -> tuple[Page, list[str]]:
    """A page in a context of its own (close it with `page.context.close()`), and the list its
    uncaught script errors go to."""
    page = browser.new_context(viewport=viewport, base_url=base).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return page, errors


def expect_page(page: Page, heading: str) -> None:
    expect(page.get_by_role("heading", level=1)).to_have_text(heading, timeout=WAIT_MS)


def open_page(page: Page, base: str, route: str, heading: str) -> None:
    page.goto(f"{base}/console/{route}")
    expect_page(page, heading)


def sign_in(page: Page, base: str, email: str, password: str = PASSWORD) -> None:
    """The sign-in form, as a user fills it; the console opens on the keys page."""
    page.goto(f"{base}/console/signin")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible(timeout=WAIT_MS)
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect_page(page, "API keys")


def shot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    width = page.viewport_size["width"] if page.viewport_size else 0
    page.screenshot(path=str(SCREENSHOTS / f"{name}-{'phone' if width < 600 else 'laptop'}.png"), full_page=True)


def no_sideways_scroll(page: Page, what: str) -> None:
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"{what} scrolls sideways by {overflow}px at phone width"


def poll(check: Callable[[], Any], what: str, timeout: float = 20) -> Any:
    """Wait for an eventually-consistent effect (events travel through Kafka) without fixed sleeps."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def poll_clicking(button: Locator, check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    """Click the page's own reload (Show, Filter, Refresh) until `check` holds: the page reads once a click."""

    def clicked() -> bool:
        button.click()
        button.page.wait_for_timeout(150)
        return check()

    poll(clicked, what, timeout)


def run_beside(work: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine (a publish, a seed) to its end: the test's own event loop is running, so beside it."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, work).result()


async def renew_plans(settings: Settings, at: datetime) -> int:
    """One pass of billing's renewal job (`BillingService.renew_all`, what every billing replica
    runs each minute) at the instant `at`, by a billing replica beside the server: its own pool,
    outbox relay and edge, on the server's database. The server's relay publishes the entries it
    queues (audit.v1). Returns how many renewals it charged."""
    async with opened_pool(settings.database_url) as pool:
        relay = OutboxRelay(pool, settings, "billing")
        await relay.open()
        try:
            edge = Edge(settings)
            service = BillingService(
                BillingStore(pool),
                relay,
                edge.accounts,
                TestProvider(),
                lambda: at,
                settings.tz,
                edge=EdgeDelivery(relay, edge),
            )
            return await service.renew_all()
        finally:
            await relay.stop()


def usage_event(account_id: str, tokens_in: int, tokens_out: int, provider: str, model: str) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "time": datetime.now(UTC).isoformat(),
        "account_id": account_id,
        "resource": "ai_tokens",
        "quantity": tokens_in + tokens_out,
        "provider": provider,
        "model": model,
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "source": "console-e2e",
    }
