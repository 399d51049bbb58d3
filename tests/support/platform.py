"""A thin client of the public API (shared/API.md) for fault tests and the load benchmark.

`Ingress` routes by path prefix like the split mode's ingress, so the same code drives one
`serve --target all` process or one process per service.
"""

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx


def client(timeout: float, connections: int = 100) -> httpx.AsyncClient:
    """A client whose idle connections expire before the server's keep-alive does."""
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=2.0)
    return httpx.AsyncClient(timeout=timeout, limits=limits)


ROUTES: tuple[tuple[str, str], ...] = (
    ("/api/auth/", "keys"),
    ("/api/account", "keys"),
    ("/api/admin/", "keys"),
    ("/api/api-keys", "keys"),
    ("/api/billing/check-quota", "quota"),
    ("/api/ai/usage/quota", "quota"),
    ("/api/billing/", "billing"),
    ("/api/ai/usage/alert", "alerts"),
    ("/api/notifications", "alerts"),
    ("/api/usage/events", "metering"),
    ("/api/ai/usage/", "metering"),
    ("/api/activity-log", "metering"),
    ("/api/geo/", "geo"),
)


@dataclass
class Ingress:
    """Base URL per service; one URL for all of them in the single-process mode."""

    bases: dict[str, str]

    @classmethod
    def single(cls, base_url: str) -> "Ingress":
        return cls({service: base_url for _, service in ROUTES})

    def url(self, path: str) -> str:
        for prefix, service in ROUTES:
            if path.startswith(prefix):
                return self.bases[service] + path
        raise ValueError(f"no route for {path}")


@dataclass
class Tenant:
    account_id: str
    token: str
    key_id: str
    key: str
    email: str = ""

    def console(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def api_key(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}


async def expect(response: httpx.Response, status: int) -> Any:
    if response.status_code != status:
        raise AssertionError(f"{response.request.method} {response.request.url} -> {response.status_code}: {response.text}")
    return response.json() if response.content else None


async def new_tenant(http: httpx.AsyncClient, ingress: Ingress, *, plan: str | None = "professional") -> Tenant:
    """Register, log in (retrying until every process knows the account), create a key, and
    pay for `plan` so rate limits do not dominate the traffic."""
    email = f"u{uuid.uuid4().hex[:12]}@example.test"
    body = {"email": email, "password": "correct horse battery", "name": "Load", "user_type": "individual"}
    account = await expect(await http.post(ingress.url("/api/auth/register"), json=body), 201)
    login = await expect(
        await http.post(ingress.url("/api/auth/login"), json={"email": email, "password": body["password"]}), 200
    )
    token = login["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    key = await eventually(lambda: http.post(ingress.url("/api/api-keys"), json={"name": "load"}, headers=headers), 201)
    tenant = Tenant(account["id"], token, key["id"], key["key"], email)
    if plan is not None:
        order = await eventually(
            lambda: http.post(ingress.url("/api/billing/orders"), json={"kind": "plan_upgrade", "plan": plan}, headers=headers),
            201,
        )
        await expect(await http.post(ingress.url(f"/api/billing/orders/{order['id']}/pay"), headers=headers), 200)
    return tenant


async def eventually(call: Any, status: int, within: float = 30, *, in_a_row: int = 1) -> Any:
    """Retry a call until it answers `status` (a new account reaches other processes via Kafka),
    `in_a_row` times running for an idempotent probe through the ingress: its round robin then
    has asked every replica of the route, not only the first one that knew."""
    deadline = time.monotonic() + within
    running = 0
    while True:
        response = await call()
        running = running + 1 if response.status_code == status else 0
        if running >= in_a_row:
            return response.json() if response.content else None
        if time.monotonic() > deadline:
            raise AssertionError(f"{response.request.url} -> {response.status_code}: {response.text}")
        if not running:
            await asyncio.sleep(0.2)


async def new_service_token(http: httpx.AsyncClient, ingress: Ingress, admin_token: str) -> dict[str, str]:
    """Headers of a new `usage:write` service token (the operator's API), once every process that
    ingests usage knows it (an empty batch is then a 422, not a 401; with two metering replicas
    behind the ingress, one 422 says only that one of them knows it)."""
    admin = {"Authorization": f"Bearer {admin_token}"}
    body = {"name": f"platform-{uuid.uuid4().hex[:6]}", "scopes": ["usage:write"]}
    created = await expect(await http.post(ingress.url("/api/admin/service-tokens"), json=body, headers=admin), 201)
    headers = {"Authorization": f"Bearer {created['token']}"}
    empty_batch = {"events": []}  # 422 once the process knows the token, 401 before: nothing is written
    await eventually(lambda: http.post(ingress.url("/api/usage/events"), json=empty_batch, headers=headers), 422, in_a_row=6)
    return headers


def usage_event(account_id: str, tokens: int, model: str = "gpt-4o") -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "time": datetime.now(UTC).isoformat(),
        "account_id": account_id,
        "resource": "ai_tokens",
        "quantity": tokens,
        "provider": "openai",
        "model": model,
        "input_tokens": tokens // 2,
        "output_tokens": tokens - tokens // 2,
        "source": "load",
    }


@dataclass
class Traffic:
    """What a traffic run saw: every response's status and duration, and the accepted usage."""

    calls: list[tuple[int, float]] = field(default_factory=list)
    posts: list[tuple[int, float]] = field(default_factory=list)
    accepted_tokens: int = 0
    accepted_events: int = 0
    bodies_5xx: list[str] = field(default_factory=list)

    def statuses(self, which: str) -> set[int]:
        return {s for s, _ in getattr(self, which)}

    def slowest(self) -> float:
        return max((d for _, d in self.calls + self.posts), default=0.0)


async def run_traffic(
    http: httpx.AsyncClient,
    ingress: Ingress,
    tenant: Tenant,
    *,
    service: dict[str, str],
    seconds: float,
    tokens_per_event: int = 2000,
    call_interval: float = 0.02,
    post_interval: float = 0.05,
) -> Traffic:
    """API-key calls and usage reports side by side for `seconds`; never raises on a status.
    The usage is reported for `tenant` as a platform service would: with `service`'s token."""
    seen = Traffic()
    stop_at = time.monotonic() + seconds

    async def calls() -> None:
        while time.monotonic() < stop_at:
            started = time.monotonic()
            try:
                response = await http.get(ingress.url("/api/geo/projects"), headers=tenant.api_key())
                seen.calls.append((response.status_code, time.monotonic() - started))
                if response.status_code >= 500:
                    seen.bodies_5xx.append(response.text)
            except httpx.HTTPError:
                seen.calls.append((0, time.monotonic() - started))
            await asyncio.sleep(call_interval)

    async def posts() -> None:
        # A 503 or a broken connection leaves the outcome unknown: resend the same event (same
        # id) until it is acknowledged, as a platform service would; ingestion is idempotent.
        event = usage_event(tenant.account_id, tokens_per_event)
        while time.monotonic() < stop_at:
            started = time.monotonic()
            try:
                response = await http.post(ingress.url("/api/usage/events"), json={"events": [event]}, headers=service)
                seen.posts.append((response.status_code, time.monotonic() - started))
                if response.status_code == 202:
                    seen.accepted_tokens += tokens_per_event
                    seen.accepted_events += 1
                    event = usage_event(tenant.account_id, tokens_per_event)
                elif response.status_code >= 500:
                    seen.bodies_5xx.append(response.text)
            except httpx.HTTPError:
                seen.posts.append((0, time.monotonic() - started))
            await asyncio.sleep(post_interval)
        settle_by = time.monotonic() + 60
        while seen.posts and seen.posts[-1][0] != 202 and time.monotonic() < settle_by:  # settle the last one
            try:
                response = await http.post(ingress.url("/api/usage/events"), json={"events": [event]}, headers=service)
            except httpx.HTTPError:
                await asyncio.sleep(0.5)
                continue
            seen.posts.append((response.status_code, 0.0))
            if response.status_code == 202:
                seen.accepted_tokens += tokens_per_event
                seen.accepted_events += 1
            await asyncio.sleep(0.5)

    await asyncio.gather(calls(), posts())
    return seen


async def quota_used(http: httpx.AsyncClient, ingress: Ingress, tenant: Tenant) -> dict[str, int]:
    body = await expect(await http.get(ingress.url("/api/billing/check-quota"), headers=tenant.console()), 200)
    return {item["resource"]: item["used"] for item in body["items"]}


async def metered_tokens(http: httpx.AsyncClient, ingress: Ingress, tenant: Tenant) -> int:
    body = await expect(await http.get(ingress.url("/api/ai/usage/overview?range=month"), headers=tenant.console()), 200)
    return int(body["total_tokens"])


async def wait_for(probe: Any, expected: Any, within: float = 90) -> Any:
    """Poll `probe()` until it returns `expected`; the last value otherwise (for the assertion)."""
    deadline = time.monotonic() + within
    value = None
    while time.monotonic() < deadline:
        try:
            value = await probe()
        except (AssertionError, httpx.HTTPError):
            value = None
        if value == expected:
            return value
        await asyncio.sleep(0.5)
    return value
