"""A replica's admissions alone, in a process of its own (tests/integration/test_edge_leases.py):
`concurrency` callers of one key admit calls through a RedisStore until refused, then the
process prints its admitted count and leases held, as JSON, and (with `--hold`) waits to be killed.

    python -m tests.support.lease_holder REDIS_URL PREFIX ACCOUNT KEY TOTAL [--concurrency N] [--calls N] [--hold]
"""

import argparse
import asyncio
import json
import sys
import time
import uuid

from services.edge.quota_gate import CallsView
from services.edge.rate_limit import Limits
from services.edge.rate_store import KeyCheck, RedisStore

ROOMY = Limits(per_second=100_000.0, burst=100_000, per_minute=10_000_000)


async def caller_once(store: RedisStore, account: uuid.UUID, key: uuid.UUID, view: CallsView) -> None:
    _, taken = await store.hit_and_admit_all((f"a:{account}", f"k:{key}"), ROOMY, time.time(), (view,), KeyCheck(key, 1))
    assert taken == 0


async def main(args: argparse.Namespace) -> None:
    store = RedisStore(args.redis_url, args.prefix, args.prefix, f"{args.prefix}revoked:")
    account, key = uuid.UUID(args.account), uuid.UUID(args.key)
    view = CallsView(account, "2026-03", None, 0, 0, args.total)
    admitted = 0
    refused = False

    async def caller() -> None:
        nonlocal admitted, refused
        while not refused and (args.calls is None or admitted < args.calls):
            decision, taken = await store.hit_and_admit_all(
                (f"a:{account}", f"k:{key}"), ROOMY, time.time(), (view,), KeyCheck(key, 1)
            )
            assert decision.allowed
            if taken == 0:
                admitted += 1
            else:
                refused = True

    await asyncio.gather(*(caller() for _ in range(args.concurrency)))
    if args.hold:  # one more call, for a block of 64: leftovers the kill will lose
        store._lease_holder._demand[(f"a:{account}", f"k:{key}")] = 63
        await caller_once(store, account, key, view)
        admitted += 1
    leftovers = sum(held.lease.left for held in store._lease_holder._leases.values())
    print(json.dumps({"admitted": admitted, "leftovers": leftovers}), flush=True)
    if args.hold:
        await asyncio.sleep(3600)
    await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("redis_url", "prefix", "account", "key"):
        parser.add_argument(name)
    parser.add_argument("total", type=int)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--calls", type=int, default=None)
    parser.add_argument("--hold", action="store_true")
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
