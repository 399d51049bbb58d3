"""Faults under traffic: the broker stopped, Postgres restarted, consumers SIGKILLed mid-batch.

While a dependency is down the edge answers 503 with the contract's body (never hangs, never
500); afterwards every process recovers on its own and the books reconcile: every accepted usage
event is counted exactly once in ClickHouse and in the quota counters, every API call the edge
let through is counted once (less any it reported dropped), and every alert fired exactly once.
"""

import asyncio
import re
import time

import httpx
import pytest

from services.runtime.host import stack
from services.runtime.platform.settings import Settings
from tests.support.apps import ServeProcess
from tests.support.platform import (
    Ingress,
    Tenant,
    Traffic,
    client,
    expect,
    metered_tokens,
    new_service_token,
    new_tenant,
    quota_used,
    run_traffic,
    wait_for,
)

pytestmark = pytest.mark.integration
CLIENT_TIMEOUT_S = 15.0  # a request slower than this counts as hung


def _dropped_call_events(base_url: str) -> int:
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    return int(sum(float(v) for v in re.findall(r"^tollgate_edge_call_events_dropped_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)))


def _assert_answered_well(seen: Traffic) -> None:
    assert seen.calls and seen.posts
    assert 0 not in seen.statuses("calls") | seen.statuses("posts"), "a request hung or the connection broke"
    assert seen.slowest() < CLIENT_TIMEOUT_S
    assert seen.statuses("calls") <= {200, 429, 503}, seen.statuses("calls")
    assert seen.statuses("posts") <= {202, 429, 503}, seen.statuses("posts")
    for body in seen.bodies_5xx:
        assert '"code":"service_unavailable"' in body.replace(" ", ""), body


async def _reconcile(http: httpx.AsyncClient, ingress: Ingress, tenant: Tenant, seen: Traffic, dropped: int) -> None:
    assert seen.accepted_events > 0
    assert await wait_for(lambda: metered_tokens(http, ingress, tenant), seen.accepted_tokens) == seen.accepted_tokens
    counted_calls = sum(1 for status, _ in seen.calls if status not in {401, 403, 429})

    async def used() -> tuple[int, int]:
        q = await quota_used(http, ingress, tenant)
        return q["ai_tokens"], q["api_calls"]

    expected = (seen.accepted_tokens, counted_calls - dropped)
    assert await wait_for(used, expected) == expected


def _admin(settings: Settings) -> str:
    assert settings.admin_token is not None
    return settings.admin_token.get_secret_value()


def _ready(proc: ServeProcess) -> bool:
    try:
        return httpx.get(f"{proc.base_url}/readyz", timeout=3).status_code == 200
    except httpx.HTTPError:
        return False


async def _recovers(proc: ServeProcess, within: float = 90) -> None:
    deadline = time.monotonic() + within
    while not _ready(proc):
        assert time.monotonic() < deadline, f"{proc.base_url} did not recover; log {proc.log_path}"
        await asyncio.sleep(0.5)


async def test_kafka_stopped_for_ten_seconds_under_traffic(fault_stack, fault_settings: Settings):
    with_serve = ServeProcess(fault_settings)
    try:
        with_serve.wait_ready()
        ingress = Ingress.single(with_serve.base_url)
        async with client(CLIENT_TIMEOUT_S) as http:
            tenant = await new_tenant(http, ingress)
            service = await new_service_token(http, ingress, _admin(fault_settings))

            async def outage() -> None:
                await asyncio.sleep(4)
                await asyncio.to_thread(stack.stop_pid_file, fault_stack.state_dir / "kafka" / "kafka.pid", "kafka")
                await asyncio.sleep(10)
                await asyncio.to_thread(stack.kafka_up, fault_stack)

            seen, _ = await asyncio.gather(run_traffic(http, ingress, tenant, service=service, seconds=22), outage())
            _assert_answered_well(seen)
            assert 503 in seen.statuses("posts"), "usage reports while the broker was down should have been refused"
            assert 202 in seen.statuses("posts")
            await _recovers(with_serve)
            await _reconcile(http, ingress, tenant, seen, _dropped_call_events(with_serve.base_url))
    finally:
        with_serve.stop()


async def test_postgres_restarted_under_traffic(fault_stack, fault_settings: Settings):
    with_serve = ServeProcess(fault_settings)
    try:
        with_serve.wait_ready()
        ingress = Ingress.single(with_serve.base_url)
        async with client(CLIENT_TIMEOUT_S) as http:
            tenant = await new_tenant(http, ingress)
            service = await new_service_token(http, ingress, _admin(fault_settings))

            async def restart() -> None:
                await asyncio.sleep(4)
                await asyncio.to_thread(stack.postgres_down, fault_stack)
                await asyncio.sleep(3)
                await asyncio.to_thread(stack.postgres_up, fault_stack)

            seen, _ = await asyncio.gather(run_traffic(http, ingress, tenant, service=service, seconds=14), restart())
            _assert_answered_well(seen)
            assert 503 in seen.statuses("calls"), "project listings while Postgres was down should have been refused"
            await _recovers(with_serve)
            await _reconcile(http, ingress, tenant, seen, _dropped_call_events(with_serve.base_url))
    finally:
        with_serve.stop()


async def test_consumers_killed_mid_batch_in_the_split_mode(fault_settings: Settings):
    """One process per service; metering, quota and alerts are SIGKILLed under traffic and
    restarted. Every alert rule whose threshold the usage passed fires exactly once."""
    front = ServeProcess(fault_settings, "keys,billing,geo")
    consumers = {name: ServeProcess(fault_settings, name) for name in ("metering", "quota", "alerts")}
    everyone = [front, *consumers.values()]
    try:
        for proc in everyone:
            proc.wait_ready()
        ingress = Ingress(
            {
                "keys": front.base_url,
                "billing": front.base_url,
                "geo": front.base_url,
                **{name: proc.base_url for name, proc in consumers.items()},
            }
        )
        async with client(CLIENT_TIMEOUT_S) as http:
            tenant = await new_tenant(http, ingress)  # professional: 10M tokens; 1 % = 100k
            service = await new_service_token(http, ingress, _admin(fault_settings))
            rules_pct = (1, 5, 10, 20)
            for pct in rules_pct:
                rule = {"metric": "total_tokens", "threshold_pct": pct, "channels": ["in_site"], "recipients": []}
                await expect(await http.post(ingress.url("/api/ai/usage/alert"), json=rule, headers=tenant.console()), 201)

            async def kill_and_restart() -> None:
                await asyncio.sleep(5)
                for name in consumers:
                    consumers[name].kill()
                await asyncio.sleep(2)
                for name in consumers:
                    consumers[name] = ServeProcess(fault_settings, name, port=consumers[name].port)
                for proc in consumers.values():
                    await asyncio.to_thread(proc.wait_ready)

            seen, _ = await asyncio.gather(
                run_traffic(http, ingress, tenant, service=service, seconds=16, tokens_per_event=50_000, post_interval=0.05),
                kill_and_restart(),
            )
            everyone = [front, *consumers.values()]
            assert seen.statuses("calls") <= {200, 429}
            await _reconcile(http, ingress, tenant, seen, _dropped_call_events(front.base_url))
            reached_pct = seen.accepted_tokens * 100 // 10_000_000  # professional: 10M tokens
            expected = [pct for pct in rules_pct if pct <= reached_pct]
            assert expected, "the traffic should pass at least the 1 % rule"

            async def fired() -> list[int]:
                body = await expect(await http.get(ingress.url("/api/notifications"), headers=tenant.console()), 200)
                return sorted(item["threshold_pct"] for item in body["items"])

            assert await wait_for(fired, expected) == expected
            rules = await expect(await http.get(ingress.url("/api/ai/usage/alert"), headers=tenant.console()), 200)
            assert {r["threshold_pct"] for r in rules["rules"] if r["fired_this_period"]} == set(expected)
    finally:
        for proc in everyone:
            proc.stop()
