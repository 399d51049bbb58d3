"""Leased admissions, the holder's side (issue 38, decision 3; docs/architecture.md): a busy
API key's calls share one Redis trip for a block of them, handed out here until it is spent,
expires, or a revocation of the key is announced.

The arithmetic of one lease is leases.py, the Redis side lease_scripts.py; this is the table of
leases a replica holds, the demand that sizes the next block, the subscription that hears
revocations, and the give-back of leftovers (on expiry, on a drop, when the replica stops).
"""

import asyncio
import logging
import time
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

from redis.asyncio import Redis

from services.edge.admissions import ADMISSION_STORE_ERRORS
from services.edge.key_revocations import KeyCheck, KeyRevoked
from services.edge.lease_scripts import GIVE_BACK, LEASE_SCRIPT
from services.edge.leases import LEASE_S, LOCAL_MARGIN_S, REPLICA_TTL_S, Lease, wanted
from services.edge.quota_gate import CallsView
from services.edge.rate_limit import Decision, Limits, PerSubject, each, window_start
from services.edge.rate_scripts import ScriptKeys
from services.runtime.platform.logs import Throttled

log = logging.getLogger(__name__)

MAX_ANNOUNCED = 100_000  # revoked keys whose latest epoch is remembered; forgotten all at once beyond


@dataclass(slots=True, eq=False)
class _Leased:
    """A lease held here, with what giving it back needs: the Redis keys of its registry, its
    subjects' slots and its admissions, and each subject's burst."""

    lease: Lease
    key_id: UUID
    keys: list[str]
    bursts: list[int]


class PerCallStore(Protocol):
    """What leases need of the store that judges one call a trip (rate_store.RedisStore)."""

    async def judge(
        self, subjects: tuple[str, ...], limits: PerSubject, now: float, admission: tuple[CallsView, ...], known: KeyCheck
    ) -> tuple[Decision, int | None]:
        """One call judged alone (a block of 1): the per-call script, as without leases."""
        ...

    def failed_open(self, per: Sequence[Limits]) -> tuple[Decision, None]: ...

    def keep_copy(self, subjects: tuple[str, ...], stored: Sequence[bytes]) -> None: ...

    def forget_copy(self, subjects: tuple[str, ...]) -> None: ...


class LeaseHolder:
    """A replica's leases. A call that finds its key's trip in flight waits for it (`_leasing`)
    and counts as demand, which sizes the next block; the block is handed out here until it is
    spent, expires, or a revocation of the key is announced (`_listen`, then `_drop_held`)."""

    def __init__(self, redis: "Redis[bytes]", keys: ScriptKeys, store: PerCallStore) -> None:
        self._redis = redis
        self._keys = keys
        self._prefix = keys.prefix  # the rate limiter's: the registry, epoch and replicas live under it
        self._store = store
        self._lease_script = redis.register_script(LEASE_SCRIPT)
        self._give_back = redis.register_script(GIVE_BACK)
        self._replica = uuid.uuid4().hex
        self.drops_channel = keys.prefix + "drops"  # where revocations are announced (key_revocations)
        self._leases: dict[tuple[str, ...], _Leased] = {}
        self._leasing: dict[tuple[str, ...], asyncio.Future[bool]] = {}  # True: the trip failed
        self._demand: dict[tuple[str, ...], int] = {}
        self._held: dict[UUID, list[_Leased]] = {}  # registered in Redis, not yet given back
        self._announced: dict[UUID, int] = {}  # key -> the latest revocation epoch announced
        self._listening = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None
        self._giving_back: set[asyncio.Task[None]] = set()
        self._log = Throttled(log)

    async def admit(
        self, subjects: tuple[str, ...], limits: PerSubject, now: float, admission: tuple[CallsView, ...], known: KeyCheck
    ) -> tuple[Decision, int | None]:
        """An admitted API-key call: from its key's lease when one serves it, else after the trip
        in flight for the key (if any), else one trip of its own, for a block of the calls that
        came meanwhile (a block of 1 is the per-call trip, `PerCallStore.judge`: as without leases)."""
        totals = tuple((view.subject, view.period, view.total) for view in admission)  # a new period or total: Redis
        while True:
            held = self._leases.get(subjects)
            if held is not None:
                decision = held.lease.take(known.version, totals, time.monotonic(), known.user_version)
                if decision is not None:
                    self._demand[subjects] = self._demand.get(subjects, 0) + 1
                    return decision, 0
                returning = self._retire(subjects, held)
                if returning is not None:  # its leftovers go back before this call's own trip
                    await asyncio.shield(returning)
                continue  # another call may have taken a new lease meanwhile
            in_flight = self._leasing.get(subjects)
            if in_flight is None:
                break
            self._demand[subjects] = self._demand.get(subjects, 0) + 1
            if await asyncio.shield(in_flight):  # Redis failed that trip: fail open as it did, not one by one
                return self._store.failed_open(each(limits, len(subjects)))
        want = wanted(self._demand.pop(subjects, 0))
        leasing = self._leasing[subjects] = asyncio.get_running_loop().create_future()
        failed = False
        try:
            if want > 1 and await self._listens():
                judged = await self._take_lease(subjects, limits, now, admission, known, want, totals)
            else:
                judged = await self._store.judge(subjects, limits, now, admission, known)
            failed = judged[0].allowed and judged[1] is None  # let through, admissions not judged: the store failed
            return judged
        finally:
            del self._leasing[subjects]
            leasing.set_result(failed)

    async def _take_lease(
        self,
        subjects: tuple[str, ...],
        limits: PerSubject,
        now: float,
        admission: tuple[CallsView, ...],
        known: KeyCheck,
        want: int,
        totals: tuple[object, ...],
    ) -> tuple[Decision, int | None]:
        per = each(limits, len(subjects))
        keys, args = self._keys.call(subjects, per, now, admission, known, take=True)
        # around the revocation entry (and the user's)
        subject_keys, admission_keys = keys[: len(subjects)], keys[len(subjects) + self._keys.entries(known) :]
        registry = f"{self._prefix}lease:{known.key_id}"
        keys += [registry, f"{self._prefix}epoch:{known.key_id}", self._prefix + "replicas"]
        lease_id = uuid.uuid4().hex
        args += [want, self._replica, lease_id, int(LEASE_S * 1000), int(REPLICA_TTL_S * 1000)]
        asked = time.monotonic()  # before Redis's clock starts the lease: ours ends first
        try:
            result = await self._lease_script(keys=keys, args=args)
        except Exception:
            return self._store.failed_open(per)
        if result[0] == -1:
            raise KeyRevoked(result[1].decode())
        allowed, limit, remaining, reset, retry, admitted, block, epoch, *stored = result
        if block <= 1:  # (a lease's leftovers are calls this replica may still admit: no copy refuses them)
            self._store.keep_copy(subjects, stored)
        decision = Decision(bool(allowed), int(limit), int(remaining), int(reset), int(retry))
        if block > 1:
            lease = Lease(
                f"{epoch}:{lease_id}",
                int(epoch),
                known.version,
                totals,
                int(block) - 1,
                asked + LEASE_S - LOCAL_MARGIN_S,
                decision,
                window_start(now),
                user_version=known.user_version,
            )
            held = _Leased(lease, known.key_id, [registry, *subject_keys, *admission_keys], [lim.burst for lim in per])
            self._held.setdefault(known.key_id, []).append(held)
            announced = self._announced.get(known.key_id, -1)
            if announced > lease.epoch:  # revoked meanwhile: not used (one taken at that epoch came after it)
                self._drop_held(known.key_id, before=announced)
            else:
                self._leases[subjects] = held
                asyncio.get_running_loop().call_later(LEASE_S, self._expire, subjects, held)
            decision = Decision(True, decision.limit, lease.left, decision.reset_s, 0)  # only what this replica holds
        return decision, None if admitted == -1 else int(admitted)

    def _expire(self, subjects: tuple[str, ...], held: _Leased) -> None:
        """A lease's lifetime is over: its leftovers, if any, are given back (no call came for them)."""
        if self._leases.get(subjects) is held:
            self._retire(subjects, held)
            self._demand.pop(subjects, None)  # no trip since: the calls came slower than a lease lives
        self._forget_held(held)

    def _retire(self, subjects: tuple[str, ...], held: _Leased) -> "asyncio.Task[None] | None":
        """The lease serves no more calls: unused leftovers go back (in the background: the task, for
        a call that must be judged after them); a spent lease stays registered until it expires or a
        revocation's announcement acknowledges it."""
        if self._leases.get(subjects) is held:
            del self._leases[subjects]
        lease = held.lease
        if lease.left > 0 and not lease.dropped:
            if time.monotonic() >= lease.expires:  # calls came slower than a lease lives: start at 1 again
                self._demand.pop(subjects, None)
            lease.dropped = True
            self._store.forget_copy(subjects)  # the tokens given back may let a call through
            self._forget_held(held)
            return self._in_background(self._return(held))
        return None

    def _forget_held(self, held: _Leased) -> None:
        registered = self._held.get(held.key_id)
        if registered is not None and held in registered:
            registered.remove(held)
            if not registered:
                del self._held[held.key_id]

    def _drop_held(self, key_id: UUID, *, before: int | None = None) -> None:
        """A revocation of the key was announced (its epoch `before`; None: every lease, this
        replica stops hearing them): its leases here taken at an earlier epoch serve no more calls,
        and each leaves the registry (the toggle waits for that), with its leftovers. A lease taken
        at that epoch or later was judged after the revocation, by Redis: it stays."""
        registered = self._held.pop(key_id, [])
        kept = [held for held in registered if before is not None and held.lease.epoch >= before]
        if kept:
            self._held[key_id] = kept
        for held in registered:
            if held in kept:
                continue
            held.lease.dropped = True
            for subjects, current in list(self._leases.items()):
                if current is held:
                    del self._leases[subjects]
            self._in_background(self._return(held))

    async def _return(self, held: _Leased) -> None:
        lease = held.lease
        args: list[str | int] = [lease.member, lease.left, repr(lease.window), len(held.bursts), *held.bursts]
        try:
            await self._give_back(keys=held.keys, args=args)
        except Exception:
            ADMISSION_STORE_ERRORS.inc()
            self._log.warning("a lease's leftovers could not be given back (Redis): they stay taken", exc_info=True)

    def _in_background(self, work: Coroutine[object, object, None]) -> "asyncio.Task[None]":
        task = asyncio.get_running_loop().create_task(work)
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)
        return task

    async def _listens(self) -> bool:
        """Whether this replica hears revocations' announcements (then it may hold leases)."""
        if self._listening.is_set():
            return True
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(self._listen(), name="lease-drops")
        try:
            await asyncio.wait_for(self._listening.wait(), 0.5)
        except TimeoutError:
            return False
        return True

    async def _listen(self) -> None:
        pubsub = self._redis.pubsub()
        try:
            await pubsub.subscribe(self.drops_channel)
            async for message in pubsub.listen():
                if message["type"] == "subscribe":
                    self._listening.set()
                elif message["type"] == "message":
                    key, _, epoch = message["data"].decode().partition(" ")
                    self._announced_drop(UUID(key), int(epoch))
        except asyncio.CancelledError:
            raise
        except Exception:
            self._log.warning("revocation announcements lost (Redis): leases stop until heard again", exc_info=True)
        finally:
            self._listening.clear()
            for key_id in list(self._held):  # deaf: hold nothing a toggle could be waiting for
                self._drop_held(key_id)
            await pubsub.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose()

    def _announced_drop(self, key_id: UUID, epoch: int) -> None:
        if len(self._announced) >= MAX_ANNOUNCED:
            self._announced.clear()
        self._announced[key_id] = max(epoch, self._announced.get(key_id, 0))
        self._drop_held(key_id, before=epoch)

    async def close(self) -> None:
        """A stopping replica gives its leases' leftovers back before it goes."""
        for subjects, held in list(self._leases.items()):
            self._retire(subjects, held)
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
        if self._giving_back:
            await asyncio.gather(*self._giving_back)
