"""(issue 38, decision 3) The edge's admission store alone: what one admitted API-key call costs the
request process and Redis, with `--callers` concurrent callers over `--keys` keys of one account
each (as wrk's connections rotating keys), against a redis-server of its own.

Prints the calls admitted a second, the request process's CPU per call (time.process_time: the
store's client side, event loop included), Redis's CPU per call (INFO cpu) and the scripts Redis
ran per call (its round trips). Run it in a worktree of the base and of the branch to compare.

    .venv/bin/python bench/lease_store.py [--seconds 10] [--callers 32] [--keys 8]
"""

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis

from services.edge.quota_gate import CallsView
from services.edge.rate_limit import Limits
from services.edge.rate_store import KeyCheck, RedisStore
from tests.support.redis_server import running_redis

ROOMY = Limits(per_second=100_000.0, burst=100_000, per_minute=10_000_000)


def redis_figures(url: str) -> tuple[float, int]:
    """Redis's CPU seconds so far and the scripts it has run."""
    client = redis.Redis.from_url(url)
    cpu = client.info("cpu")
    stats = client.info("commandstats")
    client.close()
    scripts = sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), scripts


async def run(url: str, seconds: float, callers: int, keys: int) -> None:
    store = RedisStore(url)
    account = uuid.uuid4()
    view = CallsView(account, "2026-03", None, 0, 0, 10**12)
    ids = [uuid.uuid4() for _ in range(keys)]
    # as the edge asks since the strict ends of users: the key's user and its users.v1 version too
    # (a base without them asks the key alone)
    with_user = "user_id" in KeyCheck.__dataclass_fields__
    checks = {key: KeyCheck(key, 1, uuid.uuid4(), 3) if with_user else KeyCheck(key, 1) for key in ids}
    admitted = 0
    stop = False

    async def caller(i: int) -> None:
        nonlocal admitted
        n = i
        while not stop:
            key = ids[n % keys]
            n += 1
            _, taken = await store.hit_and_admit_all((f"a:{account}", f"k:{key}"), ROOMY, time.time(), (view,), checks[key])
            admitted += taken == 0

    async def timer(lasting: float) -> None:
        nonlocal stop
        await asyncio.sleep(lasting)
        stop = True

    await asyncio.gather(*(caller(i) for i in range(callers)), timer(1.0))  # warm-up: scripts, connections
    admitted, stop = 0, False
    redis_before, scripts_before = redis_figures(url)
    cpu_before, wall_before = time.process_time(), time.monotonic()
    await asyncio.gather(*(caller(i) for i in range(callers)), timer(seconds))
    cpu, wall = time.process_time() - cpu_before, time.monotonic() - wall_before
    redis_after, scripts_after = redis_figures(url)
    await store.close()
    print(
        f"{admitted / wall:,.0f} admitted calls/s over {wall:.1f} s ({callers} callers, {keys} keys): "
        f"request process {cpu / admitted * 1e6:,.1f} us/call, "
        f"redis {(redis_after - redis_before) / admitted * 1e6:,.1f} us/call, "
        f"{(scripts_after - scripts_before) / admitted:.3f} scripts (round trips) per call"
        + (" (the key and its user checked)" if with_user else " (the key checked)")
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--callers", type=int, default=32)
    parser.add_argument("--keys", type=int, default=8)
    args = parser.parse_args()
    with running_redis() as redis_url:
        asyncio.run(run(redis_url, args.seconds, args.callers, args.keys))
