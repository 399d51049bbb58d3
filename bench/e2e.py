"""End-to-end load through `tollgate up` on the local stack, then a reconciliation.

N accounts, each with an API key, call GET /api/geo/projects while reporting AI usage
(POST /api/usage/events) at a steady rate for --seconds. Prints sustained calls/s and events/s,
p50/p99 latency, the 5xx count (must be 0), and then reconciles every account: each accepted
usage event counted exactly once in ClickHouse (overview) and in the quota counters, each API
call counted once, and each alert threshold passed fired exactly once (one in-site
notification per rule). Baseline, same run: the same client against GET /healthz (no auth,
no work) for the same time, so calls/s is also printed as a ratio of what this server and
client can do at all here.

    .venv/bin/python bench/e2e.py [--accounts 10] [--seconds 120]
"""

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import ratio_line, summary_ms
from tests.support.apps import REPO, free_port
from tests.support.platform import (
    Ingress,
    Tenant,
    Traffic,
    client,
    expect,
    metered_tokens,
    new_tenant,
    quota_used,
    run_traffic,
    wait_for,
)

RULES_PCT = (1, 2, 5)
PRO_TOKENS = 10_000_000


def tollgate_up(state: Path, port: int, *up_args: str) -> tuple[dict[str, str], dict[str, str]]:
    """The environment of the stack `tollgate up` started, and its demo service token's headers."""
    env = {
        **{k: v for k, v in os.environ.items() if k not in {"KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL", "CLICKHOUSE_DSN"}},
        "TOLLGATE_STATE_DIR": str(state),
        "TOLLGATE_KAFKA_PORT": str(free_port()),
        "TOLLGATE_KAFKA_CONTROLLER_PORT": str(free_port()),
        "TOLLGATE_POSTGRES_PORT": str(free_port()),
        "LOG_LEVEL": "WARNING",
    }
    cli = [sys.executable, "-m", "services.runtime.host.cli"]
    up = subprocess.run(
        # an empty demo account: the benchmarks' own tenants make all the load
        [*cli, "up", "--port", str(port), "--no-demo-data", *up_args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if up.returncode != 0:  # what did start (Postgres, Kafka, ClickHouse, redis) must not outlive the run
        subprocess.run([*cli, "down"], env=env, cwd=REPO, capture_output=True, check=False)
        raise SystemExit(f"tollgate up failed:\n{up.stdout}\n{up.stderr}")
    printed = json.loads(up.stdout[up.stdout.index("{") :])
    return env, {"Authorization": f"Bearer {printed['demo_service_token']}"}


async def baseline_calls_per_s(http: httpx.AsyncClient, base: str, seconds: float, workers: int) -> float:
    done = 0
    stop_at = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            (await http.get(f"{base}/healthz")).raise_for_status()
            done += 1

    await asyncio.gather(*(worker() for _ in range(workers)))
    return done / seconds


async def reconcile(http: httpx.AsyncClient, ingress: Ingress, tenant: Tenant, seen: Traffic) -> list[str]:
    problems: list[str] = []
    tokens = await wait_for(lambda: metered_tokens(http, ingress, tenant), seen.accepted_tokens, within=120)
    if tokens != seen.accepted_tokens:
        problems.append(f"{tenant.email}: ClickHouse has {tokens} tokens, {seen.accepted_tokens} were accepted")
    counted_calls = sum(1 for status, _ in seen.calls if status not in {401, 403, 429})

    async def used() -> tuple[int, int]:
        q = await quota_used(http, ingress, tenant)
        return q["ai_tokens"], q["api_calls"]

    expected = (seen.accepted_tokens, counted_calls)
    got = await wait_for(used, expected, within=120)
    if got != expected:
        problems.append(f"{tenant.email}: quota counted (tokens, calls) {got}, expected {expected}")
    reached = seen.accepted_tokens * 100 // PRO_TOKENS
    fired_expected = [p for p in RULES_PCT if p <= reached]

    async def fired() -> list[int]:
        body = await expect(await http.get(ingress.url("/api/notifications"), headers=tenant.console()), 200)
        return sorted(item["threshold_pct"] for item in body["items"])

    got_fired = await wait_for(fired, fired_expected, within=60)
    if got_fired != fired_expected:
        problems.append(f"{tenant.email}: notifications {got_fired}, expected exactly {fired_expected}")
    return problems


async def main(accounts: int, seconds: float, tokens_per_event: int) -> int:
    state = REPO / ".tollgate" / f"bench-e2e-{uuid.uuid4().hex[:6]}"
    port = free_port()
    env, service = tollgate_up(state, port)
    base = f"http://127.0.0.1:{port}"
    ingress = Ingress.single(base)
    try:
        async with client(30, connections=4 * accounts) as http:
            tenants = [await new_tenant(http, ingress) for _ in range(accounts)]
            for tenant in tenants:
                for pct in RULES_PCT:
                    rule = {"metric": "total_tokens", "threshold_pct": pct, "channels": ["in_site"], "recipients": []}
                    await expect(await http.post(ingress.url("/api/ai/usage/alert"), json=rule, headers=tenant.console()), 201)
            baseline = await baseline_calls_per_s(http, base, min(15.0, seconds / 4), workers=2 * accounts)
            started = time.monotonic()
            runs = await asyncio.gather(
                *(
                    run_traffic(
                        http,
                        ingress,
                        t,
                        service=service,
                        seconds=seconds,
                        tokens_per_event=tokens_per_event,
                        call_interval=0.0,
                        post_interval=0.05,
                    )
                    for t in tenants
                )
            )
            elapsed = time.monotonic() - started
            calls = [d for r in runs for s, d in r.calls if s == 200]
            posts = [d for r in runs for s, d in r.posts if s == 202]
            fivexx = sum(1 for r in runs for s, _ in r.calls + r.posts if s >= 500 or s == 0)
            limited = sum(1 for r in runs for s, _ in r.calls if s == 429)
            events = sum(r.accepted_events for r in runs)
            print(f"accounts={accounts} seconds={elapsed:.0f}")
            print(ratio_line("API-key calls (200)", len(calls) / elapsed, baseline, "calls/s"))
            print(f"usage events accepted: {events / elapsed:,.1f} events/s ({events} events)")
            print(f"call latency:  {summary_ms(calls)}")
            print(f"usage latency: {summary_ms(posts)}")
            print(f"429 rate-limited calls: {limited}; 5xx or broken: {fivexx} (must be 0)")
            problems = [p for t, r in zip(tenants, runs, strict=True) for p in await reconcile(http, ingress, t, r)]
            print(
                "reconciliation: "
                + ("exact (0 lost, 0 double-counted, every threshold fired once)" if not problems else "FAILED")
            )
            for problem in problems:
                print(f"  {problem}")
            return 1 if problems or fivexx else 0
    finally:
        await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "services.runtime.host.cli", "down"],
            env=env,
            cwd=REPO,
            capture_output=True,
            check=False,
        )
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accounts", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--tokens-per-event", type=int, default=5_000)
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.accounts, args.seconds, args.tokens_per_event)))
