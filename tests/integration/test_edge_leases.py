"""Leased admissions (issue 38, decision 3; services/edge/leases.py) on a real redis-server: a busy
key's calls share one round trip for a block of them, and still overshoot 0, strict revocation,
truthful headers, leftovers given back; a holder cut off from Redis or killed holds nothing a
toggle waits for longer than a lease lives."""

import asyncio
import hashlib
import json
import signal
import subprocess
import sys
import time
import uuid

import pytest
from redis.asyncio import Redis

from services.edge.leases import LEASE_S, MAX_BLOCK
from services.edge.quota_gate import CallsView
from services.edge.rate_limit import Limits
from services.edge.rate_store import KeyCheck, KeyRevoked, RedisStore
from tests.integration.test_keys_api import bearer, new_key, signup
from tests.support.apps import REPO, free_port, running_app
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration

ROOMY = Limits(per_second=100_000.0, burst=100_000, per_minute=10_000_000)


class Replica:
    """One replica's RedisStore and one key of one account, on a prefix of the test's own."""

    def __init__(self, url: str, prefix: str, account: uuid.UUID, key: uuid.UUID, total: int) -> None:
        self.store = RedisStore(url, prefix, prefix, f"{prefix}revoked:")
        self.subjects = (f"a:{account}", f"k:{key}")
        self.view = CallsView(account, "2026-03", None, 0, 0, total)
        self.key = key

    async def call(self, limits: Limits = ROOMY, version: int = 1) -> tuple[bool, int | None, int]:
        """(allowed by the rate limit, admitted: 0 taken / 1 no room / None not judged, Remaining)."""
        decision, taken = await self.store.hit_and_admit_all(
            self.subjects, limits, time.time(), (self.view,), KeyCheck(self.key, version)
        )
        return decision.allowed, taken, decision.remaining

    async def burst(self, n: int, limits: Limits = ROOMY) -> list[tuple[bool, int | None, int]]:
        return list(await asyncio.gather(*(self.call(limits) for _ in range(n))))

    async def until_refused(self, callers: int) -> int:
        """`callers` concurrent callers that call until one is refused (as the three-process test's
        clients): the calls admitted."""
        admitted, refused = 0, False

        async def caller() -> None:
            nonlocal admitted, refused
            while not refused:
                _, taken, _ = await self.call()
                if taken == 0:
                    admitted += 1
                else:
                    refused = True

        await asyncio.gather(*(caller() for _ in range(callers)))
        return admitted


def new_ids() -> tuple[str, uuid.UUID, uuid.UUID]:
    return f"t{uuid.uuid4().hex[:8]}:", uuid.uuid4(), uuid.uuid4()


async def admitted_in_redis(url: str, prefix: str, account: uuid.UUID) -> int:
    redis = Redis.from_url(url)
    try:
        return int(await redis.hget(f"{prefix}{account}:2026-03", "admitted") or 0)
    finally:
        await redis.aclose()


async def script_runs(url: str) -> int:
    redis = Redis.from_url(url)
    try:
        stats = await redis.info("commandstats")
        return int(stats.get("cmdstat_evalsha", {"calls": 0})["calls"])
    finally:
        await redis.aclose()


async def test_a_busy_key_takes_blocks_two_replicas_admit_exactly_the_total_and_give_leftovers_back(redis_url):
    prefix, account, key = new_ids()
    a, b = (Replica(redis_url, prefix, account, key, 1000) for _ in range(2))
    before = await script_runs(redis_url)
    try:
        admitted = await asyncio.gather(a.until_refused(50), b.until_refused(50))
        assert sum(admitted) == 1000, admitted  # overshoot 0, and no under-admission while both call
        assert await script_runs(redis_url) - before < 1000 / 4  # blocks: far fewer trips than calls
    finally:
        await a.store.close()
        await b.store.close()
    assert await admitted_in_redis(redis_url, prefix, account) == 1000


async def test_a_stopping_replica_gives_its_leftovers_back(redis_url):
    prefix, account, key = new_ids()
    a = Replica(redis_url, prefix, account, key, 1000)
    await lease_of(a, 20)
    assert await admitted_in_redis(redis_url, prefix, account) == 20
    await a.store.close()
    assert await admitted_in_redis(redis_url, prefix, account) == 1
    redis = Redis.from_url(redis_url)
    assert await redis.zcard(f"{prefix}lease:{key}") == 0  # and nothing left registered
    await redis.aclose()


async def test_leftovers_unused_for_a_lease_lifetime_go_back(redis_url):
    prefix, account, key = new_ids()
    a = Replica(redis_url, prefix, account, key, 1000)
    try:
        await lease_of(a, 20)
        assert await admitted_in_redis(redis_url, prefix, account) == 20
        await asyncio.sleep(LEASE_S + 0.2)
        assert await admitted_in_redis(redis_url, prefix, account) == 1
    finally:
        await a.store.close()


async def test_a_call_a_lease_cannot_serve_is_judged_after_its_leftovers_went_back(redis_url):
    """A call judged by another state of the key (or of its user, or another total) retires the
    lease it cannot use: the leftovers go back before that call's own trip, so the account's last
    places are not refused while this replica's unused block still holds them."""
    prefix, account, key = new_ids()
    a = Replica(redis_url, prefix, account, key, 20)
    try:
        await lease_of(a, 20)  # 1 call, 19 leftovers: the account's whole total is taken in Redis
        assert await admitted_in_redis(redis_url, prefix, account) == 20
        assert (await a.call(version=2))[1] == 0  # a newer key state: not from the lease, yet admitted
        assert await admitted_in_redis(redis_url, prefix, account) == 2
    finally:
        await a.store.close()


async def test_leftovers_given_back_to_a_count_redis_lost_leave_no_key_without_expiry(redis_url):
    """The admissions' hash went (evicted, flushed) while a lease held leftovers: giving them back
    writes nothing, instead of a count of 0 that would never expire."""
    prefix, account, key = new_ids()
    a = Replica(redis_url, prefix, account, key, 1000)
    redis = Redis.from_url(redis_url)
    try:
        await lease_of(a, 20)
        await redis.delete(f"{prefix}{account}:2026-03")
        await a.store.close()  # gives its 19 leftovers back
        assert await redis.exists(f"{prefix}{account}:2026-03") == 0
    finally:
        await redis.aclose()


async def test_a_revocation_answers_once_the_holder_dropped_its_lease(redis_url):
    """The holder hears the announcement and drops its lease in milliseconds: the revocation waits
    for that (not for the lease's second), and afterwards the holder refuses the key."""
    prefix, account, key = new_ids()
    holder, keys_service = (Replica(redis_url, prefix, account, key, 10_000) for _ in range(2))
    try:
        await lease_of(holder, 20)
        started = time.monotonic()
        await keys_service.store.revoke(KeyCheck(key, 2), how="disabled")
        waited = time.monotonic() - started
        assert waited < LEASE_S / 4, waited  # dropped on the announcement, not expired
        assert not holder.store._lease_holder._leases
        with pytest.raises(KeyRevoked):
            await holder.call()
    finally:
        await holder.store.close()
        await keys_service.store.close()


async def test_a_lease_taken_after_a_revocation_serves_its_calls(redis_url):
    """A revocation ends the leases taken before it (an older epoch), not those taken after it at its
    epoch: a key whose rules were once narrowed (or that was disabled and enabled again) is served
    from leases afterwards, as any busy key, by the state of the later version."""
    prefix, account, key = new_ids()
    holder, keys_service = (Replica(redis_url, prefix, account, key, 10_000) for _ in range(2))
    try:
        await lease_of(holder, 20)
        await keys_service.store.revoke(KeyCheck(key, 2), how="narrowed")  # answers once the holder dropped it
        assert not holder.store._lease_holder._leases
        holder.store._lease_holder._demand[holder.subjects] = 19  # busy again, judged by the new rules
        assert (await holder.call(version=2))[1] == 0
        assert sum(h.lease.left for h in holder.store._lease_holder._leases.values()) == 19  # kept, not given back
        assert await admitted_in_redis(redis_url, prefix, account) == 1 + 20  # the first lease's call, and this block
        # The announcement of that revocation heard (again, or late: after this lease was taken) ends nothing newer.
        [epoch] = {h.lease.epoch for h in holder.store._lease_holder._leases.values()}
        holder.store._lease_holder._announced_drop(key, epoch)
        assert sum(h.lease.left for h in holder.store._lease_holder._leases.values()) == 19
    finally:
        await holder.store.close()
        await keys_service.store.close()


async def test_no_call_of_a_busy_key_is_admitted_from_a_lease_once_its_revocation_answered(redis_url):
    """The holder has 63 calls left and four callers taking one every 10 ms each when the key is
    revoked elsewhere: none is admitted from the lease after the revocation answered."""
    prefix, account, key = new_ids()
    holder, keys_service = (Replica(redis_url, prefix, account, key, 1_000_000) for _ in range(2))
    admitted_at: list[float] = []
    stop = False

    async def busy() -> None:
        while not stop:
            try:
                _, taken, _ = await holder.call()
            except KeyRevoked:
                taken = None
            if taken == 0:
                admitted_at.append(time.monotonic())
            await asyncio.sleep(0.01)

    try:
        await lease_of(holder, 64)
        callers = [asyncio.create_task(busy()) for _ in range(4)]
        await asyncio.sleep(0.02)
        await keys_service.store.revoke(KeyCheck(key, 2), how="disabled")
        answered = time.monotonic()
        await asyncio.sleep(0.2)
    finally:
        stop = True
        await asyncio.gather(*callers)
        await holder.store.close()
        await keys_service.store.close()
    assert len(admitted_at) > 4
    assert max(admitted_at) <= answered


async def holding(replica: Replica) -> None:
    """Until the replica holds a lease registered in Redis (its callers are busy)."""
    for _ in range(2000):
        if replica.store._lease_holder._held:
            return
        await asyncio.sleep(0)
    raise AssertionError("no lease held")


async def lease_of(replica: Replica, block: int) -> None:
    """One call that takes a lease of `block` (as if `block - 1` calls had come during the last one)."""
    replica.store._lease_holder._demand[replica.subjects] = block - 1
    assert (await replica.call())[1] == 0
    assert sum(h.lease.left for h in replica.store._lease_holder._leases.values()) == block - 1


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, silent: list[asyncio.StreamWriter]) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except asyncio.CancelledError:
        silent.append(writer)  # cut: the socket stays open, and nothing comes through it
        return
    except ConnectionError:
        pass
    writer.close()


class CuttableLink:
    """A TCP proxy to Redis whose connections can be frozen (a replica cut off: nothing gets
    through, nothing is closed)."""

    def __init__(self, url: str) -> None:
        host_port = url.split("//")[1].split("/")[0]
        self.host, port = host_port.rsplit(":", 1)
        self.port = int(port)
        self.tasks: list[asyncio.Task[None]] = []
        self.silent: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.listen = free_port()

    async def __aenter__(self) -> str:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
            self.tasks += [
                asyncio.create_task(_forward(reader, up_writer, self.silent)),
                asyncio.create_task(_forward(up_reader, writer, self.silent)),
            ]

        self.server = await asyncio.start_server(accept, "127.0.0.1", self.listen)
        return f"redis://127.0.0.1:{self.listen}/0"

    def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for task in self.tasks:
            task.cancel()  # stop forwarding; the sockets stay open, silent

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for writer in self.silent:
            writer.close()


async def test_a_holder_cut_off_from_redis_stops_admitting_from_its_lease_within_a_second(redis_url):
    """The holder has 63 calls left in its lease and is called every 20 ms when it is cut off: it
    admits from the lease for less than a second, and the revocation waits that second at most."""
    prefix, account, key = new_ids()
    link = CuttableLink(redis_url)
    async with link as through_link:
        holder = Replica(through_link, prefix, account, key, 1_000_000)
        keys_service = Replica(redis_url, prefix, account, key, 1_000_000)
        await lease_of(holder, 64)
        from_lease: list[float] = []
        stop = False

        async def slow() -> None:
            while not stop:
                _, taken, _ = await holder.call()
                if taken == 0:
                    from_lease.append(time.monotonic())
                await asyncio.sleep(0.02)

        caller = asyncio.create_task(slow())
        link.cut()
        cut = time.monotonic()
        await keys_service.store.revoke(KeyCheck(key, 2), how="disabled")
        answered = time.monotonic()
        await asyncio.sleep(0.3)
        stop = True
        await caller
        await keys_service.store.close()
        await asyncio.wait_for(holder.store.close(), 10)
    assert answered - cut <= LEASE_S + 0.1  # the toggle waited for the lease's second at most
    assert len(from_lease) > 10  # it went on admitting from its lease meanwhile
    assert max(from_lease) - cut < LEASE_S  # and stopped within the second
    assert max(from_lease) <= answered


def _holder(redis_url: str, prefix: str, account: uuid.UUID, key: uuid.UUID, total: int, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.support.lease_holder", redis_url, prefix, str(account), str(key), str(total)]
    return subprocess.Popen([*command, *extra], cwd=REPO, stdout=subprocess.PIPE, text=True)


async def test_three_processes_admit_exactly_the_total(redis_url):
    prefix, account, key = new_ids()
    holders = [_holder(redis_url, prefix, account, key, 3000) for _ in range(3)]
    outputs = [json.loads(h.communicate(timeout=120)[0]) for h in holders]
    assert sum(o["admitted"] for o in outputs) == 3000, outputs
    assert await admitted_in_redis(redis_url, prefix, account) == 3000


async def test_a_killed_holders_lease_expires_and_its_loss_is_bounded_by_one_block(redis_url):
    prefix, account, key = new_ids()
    killed = _holder(redis_url, prefix, account, key, 100_000, "--calls", "300", "--hold")
    assert killed.stdout is not None
    held = json.loads(await asyncio.to_thread(killed.stdout.readline))
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    lost = await admitted_in_redis(redis_url, prefix, account) - held["admitted"]
    assert 0 < lost == held["leftovers"] < MAX_BLOCK  # taken for the period: less than one block per key
    keys_service = Replica(redis_url, prefix, account, key, 100_000)
    started = time.monotonic()
    await keys_service.store.revoke(KeyCheck(key, 2), how="disabled")  # its lease: expired, not waited for
    assert time.monotonic() - started <= LEASE_S + 0.1
    await keys_service.store.close()


async def test_remaining_never_promises_more_than_is_left(redis_url):
    """A tight bucket (20 calls, refilling one an hour) and 60 calls at once over two replicas:
    20 admitted, and a call that said Remaining r had at least r admitted calls after it."""
    prefix, account, key = new_ids()
    tight = Limits(per_second=1 / 3600, burst=20, per_minute=1000)
    a, b = (Replica(redis_url, prefix, account, key, 1000) for _ in range(2))
    try:
        await a.burst(3, tight)  # demand, so that the next burst leases
        results = [r for burst in await asyncio.gather(a.burst(30, tight), b.burst(30, tight)) for r in burst]
    finally:
        await a.store.close()
        await b.store.close()
    admitted = sorted((remaining for allowed, taken, remaining in results if allowed), reverse=True)
    assert len(admitted) == 17  # 20 less the 3 before
    assert all(remaining <= len(admitted) - 1 - i for i, remaining in enumerate(admitted)), admitted
    assert all(remaining == 0 for allowed, _, remaining in results if not allowed)


async def test_a_busy_key_on_another_replica_is_refused_the_moment_its_toggle_answered(settings):
    """The whole path: B serves a key's calls from leases of 64 (two callers, one call every 20 ms
    each: a lease outlasts its calls) and is cut off from Kafka when A's toggle disables the key:
    no call B receives after the toggle answered is admitted."""
    async with running_app(settings) as (_app_a, a), running_app(settings) as (app_b, b):
        account, owner = await signup(a)
        key = await new_key(a, owner)
        digest = hashlib.sha256(key["key"].encode()).hexdigest()
        await wait_until(lambda: _knows(app_b.state.runtime.edge, digest), timeout=20, interval=0.02)
        store = app_b.state.runtime.edge.shared
        subjects = (f"a:{account['id']}", f"k:{key['id']}")
        admitted_after: list[int] = []
        answered: float | None = None
        stop = False
        leased = 0

        async def busy() -> None:
            nonlocal leased
            while not stop:
                if not any(h.lease.left > 0 for h in store._lease_holder._leases.values()):
                    store._lease_holder._demand[subjects] = 63  # as if 63 calls had come during the last one
                sent = time.monotonic()
                status = (await b.get("/api/geo/projects", headers=bearer(key["key"]))).status_code
                leased = max(leased, sum(h.lease.left for h in store._lease_holder._leases.values()))
                if status == 200 and answered is not None and sent > answered:
                    admitted_after.append(status)
                await asyncio.sleep(0.02)

        callers = [asyncio.create_task(busy()) for _ in range(2)]
        await asyncio.sleep(0.2)
        await app_b.state.runtime.edge._follower.stop()  # B hears nothing more from Kafka: the lease alone is judged
        disabled = await a.post(f"/api/api-keys/{key['id']}/toggle", headers=owner)
        answered = time.monotonic()
        assert disabled.json()["status"] == "disabled"
        await asyncio.sleep(0.5)
        stop = True
        await asyncio.gather(*callers)
        assert leased > 0  # B did serve the key from leases
        assert admitted_after == []


async def _knows(edge: object, digest: str) -> bool:
    return edge.keys.get(digest) is not None  # type: ignore[attr-defined]


async def test_a_block_is_at_most_what_is_left_divided_by_the_live_replicas(redis_url):
    prefix, account, key = new_ids()
    a, b, c = (Replica(redis_url, prefix, account, key, 100) for _ in range(3))
    try:
        for replica in (a, b, c):
            await lease_of(replica, 2)  # three replicas live; 94 left
        assert (await a.call())[1] == 0  # a's last leased call
        a.store._lease_holder._demand[a.subjects] = 63
        assert (await a.call())[1] == 0  # a block of 64 asked: 94 // 3 = 31 granted
        assert a.store._lease_holder._leases[a.subjects].lease.left == 30
    finally:
        for replica in (a, b, c):
            await replica.store.close()


async def test_calls_waiting_for_a_trip_that_fails_fail_open_with_it_not_one_after_another(redis_url):
    """Redis hung: the calls of a busy key that waited for the trip in flight are let through
    when it fails (as each was before leases), not each after a trip of its own in turn."""
    prefix, account, key = new_ids()
    link = CuttableLink(redis_url)
    async with link as through_link:
        replica = Replica(through_link, prefix, account, key, 1000)
        await replica.call()  # connected
        link.cut()
        started = time.monotonic()
        results = await replica.burst(20)
        took = time.monotonic() - started
        await asyncio.wait_for(replica.store.close(), 10)
    assert all(allowed and taken is None for allowed, taken, _ in results)  # failed open, not judged
    assert took < 2.0, took  # one 0.5 s timeout (or a few), not twenty in a row
