"""Where rate-limit slots live: this process (default) or Redis (`REDIS_URL`, several replicas).

Both run `rate_limit.evaluate`'s arithmetic atomically over all of a request's subjects: the
in-process store needs no lock (no await between read and write on the event loop); the Redis
store is one Lua script (rate_scripts.py), so replicas share the limits exactly; the same script
admits the call against the shared api_calls count (admissions.py) and checks the key's shared
revocation (key_revocations.py), so an API-key call costs one round trip, and a busy key's calls
share one trip for a block of them (lease_holder.py). The same script asks whether the user the key
acts as was removed or given another role (user_revocations.py). Both stores give the same decisions. A
subject over its limit is refused from the Redis store's copy of its slots until that copy would
let a request through: a flood of 429s costs no round trips. (v4) `peek` is the same judgment
taking nothing (the headers of a call its key's own rules refuse): the script run read-only, or
the copy's refusal without a round trip.
"""

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Counter
from redis.asyncio import Redis

from services.edge.admissions import ADMISSION_STORE_ERRORS, RELEASE, admission_key
from services.edge.key_revocations import KeyCheck, KeyRevocations, KeyRevoked
from services.edge.lease_holder import LeaseHolder
from services.edge.quota_gate import CallsView
from services.edge.rate_limit import WINDOW_S, Decision, Limits, PerSubject, Slot, each, evaluate, refusal_lasts
from services.edge.rate_scripts import SCRIPT, ScriptKeys
from services.edge.token_revocations import PREFIX as TOKENS_PREFIX
from services.edge.token_revocations import TokenRevocations
from services.edge.user_revocations import UserRevocations
from services.runtime.platform.logs import Throttled
from services.runtime.platform.metrics import DEPENDENCY_ERRORS

# KeyCheck and KeyRevoked are part of this store's interface (hit_and_admit_all, peek).
__all__ = ["STORE_ERRORS", "KeyCheck", "KeyRevoked", "MemoryStore", "RateLimitStore", "RedisStore"]

log = logging.getLogger(__name__)

STORE_ERRORS = Counter(
    "tollgate_edge_rate_limit_store_errors_total", "Rate-limit store (Redis) failures: the call was let through (unit: calls)"
)


class RateLimitStore(Protocol):
    async def hit(self, subjects: Sequence[str], limits: PerSubject, now: float) -> Decision: ...

    async def peek(self, subjects: Sequence[str], limits: PerSubject, now: float) -> Decision:
        """What `hit` would answer now, taking nothing (rate_limit.evaluate's take=False): Remaining
        is the room left now, this call not counted. (v4) The headers of a call refused by its
        key's own rules, which must leave every limit as it was."""
        ...

    def refused(self, subjects: Sequence[str], limits: PerSubject, now: float) -> Decision | None:
        """The refusal `hit` would answer without a round trip, or None (then `hit` judges); changes
        nothing. The edge's screen asks it before routing (screen.py)."""
        ...

    def judging(self, subjects: Sequence[str]) -> asyncio.Future[None] | None:
        """A judgment of these subjects in flight that `refused` may answer differently after."""
        ...

    async def close(self) -> None: ...


class MemoryStore:
    def __init__(self, max_subjects: int = 200_000) -> None:
        self._slots: dict[str, Slot] = {}
        self._max = max_subjects

    async def hit(self, subjects: Sequence[str], limits: PerSubject, now: float) -> Decision:
        decision, after = evaluate([self._slots.get(s) for s in subjects], limits, now)
        if after is not None:
            if len(self._slots) >= self._max:
                self._forget_idle(now)
            for subject, slot in zip(subjects, after, strict=True):
                self._slots[subject] = slot
        return decision

    async def peek(self, subjects: Sequence[str], limits: PerSubject, now: float) -> Decision:
        return evaluate([self._slots.get(s) for s in subjects], limits, now, take=False)[0]

    def refused(self, subjects: Sequence[str], limits: PerSubject, now: float) -> Decision | None:
        decision, _ = evaluate([self._slots.get(s) for s in subjects], limits, now)
        return None if decision.allowed else decision

    def judging(self, subjects: Sequence[str]) -> asyncio.Future[None] | None:
        return None  # every judgment here is immediate

    def _forget_idle(self, now: float) -> None:
        """Slots idle for two minutes are full buckets and empty windows: same as absent."""
        idle = [s for s, slot in self._slots.items() if now - slot.updated > 2 * WINDOW_S + 3600]
        for subject in idle:
            del self._slots[subject]

    async def close(self) -> None:
        return None


MAX_COPIES = 100_000  # subjects whose slots are copied; forgotten all at once beyond


class RedisStore:
    """The rate limits, and with them the api_calls admissions (admissions.py): one Lua script,
    one round trip per API-key call, or per block of a busy key's calls (lease_holder.py)."""

    def __init__(
        self,
        url: str,
        prefix: str = "tollgate:rl:",
        admissions_prefix: str = "tollgate:adm:",
        revoked_prefix: str = "tollgate:revoked:",
        users_prefix: str = "tollgate:user:",
        logouts_prefix: str = "tollgate:logout:",
        tokens_prefix: str = TOKENS_PREFIX,
    ) -> None:
        # A hung Redis must not hang the API: its calls fail open after half a second.
        self._redis: Redis[bytes] = Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self._keys = ScriptKeys(prefix, admissions_prefix, revoked_prefix, users_prefix)
        self._script = self._redis.register_script(SCRIPT)
        self._release = self._redis.register_script(RELEASE)
        self._releases: set[asyncio.Task[None]] = set()
        self._outage_log, self._release_log = Throttled(log), Throttled(log)
        # Subjects whose next request Redis would refuse (it refused the last one, or the last one
        # took their last token), with their slots as Redis stored them. Replicas only ever take
        # from a slot, so a request these copies refuse, Redis would refuse too, and a flood over
        # its limit is answered here without a round trip. The first request the copy would let
        # through goes to Redis again; the requests behind it wait for that judgment (`judging`)
        # instead of each asking Redis during its round trip.
        self._copies: dict[tuple[str, ...], _Copy] = {}
        self._judging: dict[tuple[str, ...], asyncio.Future[None]] = {}
        # Leased admissions: a busy key's calls share one trip for a block of them.
        self._lease_holder = LeaseHolder(self._redis, self._keys, self)
        self._revocations = KeyRevocations(self._redis, prefix, revoked_prefix, self._lease_holder.drops_channel)
        # Users' and sessions' ends (the user's part is asked in the script above), service tokens'
        self.users = UserRevocations(
            self._redis,
            prefix=prefix,
            users_prefix=users_prefix,
            logouts_prefix=logouts_prefix,
            drops_channel=self._lease_holder.drops_channel,
        )
        self.tokens = TokenRevocations(self._redis, tokens_prefix)

    async def hit(self, subjects: Sequence[str], limits: PerSubject, now: float) -> Decision:
        return (await self.hit_and_admit(subjects, limits, now, None))[0]

    async def hit_and_admit(
        self,
        subjects: Sequence[str],
        limits: PerSubject,
        now: float,
        admission: CallsView | None,
        known: KeyCheck | None = None,
    ) -> tuple[Decision, bool | None]:
        """`hit_and_admit_all` of one admission: whether it was taken (None: not judged)."""
        decision, refused_by = await self.hit_and_admit_all(
            subjects, limits, now, () if admission is None else (admission,), known
        )
        return decision, None if refused_by is None else refused_by == 0

    async def hit_and_admit_all(
        self,
        subjects: Sequence[str],
        limits: PerSubject,
        now: float,
        admissions: Sequence[CallsView],
        known: KeyCheck | None = None,
    ) -> tuple[Decision, int | None]:
        """The rate limit's decision and, for a call it lets through, the api_calls admissions of
        `admissions` (the account's, then (v4) its key's own api_calls limits), taken all or none:
        0 when taken, i when the i-th had no room; None: not asked, or not judged because Redis
        failed (the limit then fails open and the caller judges the admissions itself). Raises KeyRevoked, taking nothing, when
        `known`'s key was revoked at a later version than `known`'s."""
        subjects = tuple(subjects)  # the edge's are tuples already
        refusal = self.refused(subjects, limits, now)
        if refusal is not None:
            return refusal, None
        admission = tuple(admissions) or None
        judged: asyncio.Future[None] | None = None
        if self._copies.pop(subjects, None) is not None and subjects not in self._judging:
            # The copy would let this one through: Redis judges it, and the requests of the same
            # subjects that arrive meanwhile wait for that (a flood would send each of them).
            judged = self._judging[subjects] = asyncio.get_running_loop().create_future()
        try:
            if admission is None or known is None:
                return await self.judge(subjects, limits, now, admission, known)
            return await self._lease_holder.admit(subjects, limits, now, admission, known)
        finally:
            if judged is not None:
                del self._judging[subjects]
                judged.set_result(None)

    async def peek(self, subjects: Sequence[str], limits: PerSubject, now: float, known: KeyCheck | None = None) -> Decision:
        """What `hit` would answer now, taking nothing: the copy's refusal while it refuses (no
        round trip, as a flood of 429s), else one read-only run of the script, which asks the
        revocation check as `hit_and_admit_all` does (raises KeyRevoked) and keeps a refusal's
        slots in the copy."""
        subjects = tuple(subjects)
        refusal = self.refused(subjects, limits, now)
        if refusal is not None:
            return refusal
        return (await self.judge(subjects, limits, now, None, known, take=False))[0]

    async def judge(
        self,
        subjects: tuple[str, ...],
        limits: PerSubject,
        now: float,
        admission: tuple[CallsView, ...] | None,
        known: KeyCheck | None,
        *,
        take: bool = True,
    ) -> tuple[Decision, int | None]:
        """One run of SCRIPT (rate_scripts.py): the call judged alone, or (take=False) a peek."""
        per = each(limits, len(subjects))
        keys, args = self._keys.call(subjects, per, now, admission, known, take=take)
        try:
            result = await self._script(keys=keys, args=args)
        except Exception:
            return self.failed_open(per)
        if result[0] == -1:
            raise KeyRevoked(result[1].decode())
        allowed, limit, remaining, reset, retry, admitted, *stored = result
        self.keep_copy(subjects, stored)
        decision = Decision(bool(allowed), int(limit), int(remaining), int(reset), int(retry))
        return decision, None if admitted == -1 else int(admitted)

    def failed_open(self, per: Sequence[Limits]) -> tuple[Decision, None]:
        """A limiter outage must not take the API down: the call goes through, loudly."""
        STORE_ERRORS.inc()
        DEPENDENCY_ERRORS.labels("redis").inc()
        self._outage_log.warning("rate-limit store failed; allowing calls (see the store errors metric)", exc_info=True)
        window = min(lim.per_minute for lim in per)
        return Decision(True, window, window, 0, 0), None

    def keep_copy(self, subjects: tuple[str, ...], stored: Sequence[bytes]) -> None:
        if stored:  # the next request would be refused: keep the slots to refuse it here
            if len(self._copies) >= MAX_COPIES:
                self._copies.clear()
            self._copies[subjects] = _Copy([_slot(stored[i : i + 5]) for i in range(0, len(stored), 5)])

    def forget_copy(self, subjects: tuple[str, ...]) -> None:
        self._copies.pop(subjects, None)

    def refused(self, subjects: Sequence[str], limits: PerSubject, now: float) -> Decision | None:
        copy = self._copies.get(tuple(subjects))
        return None if copy is None else copy.refused(limits, now)

    def judging(self, subjects: Sequence[str]) -> asyncio.Future[None] | None:
        """Redis's judgment in flight of the request these subjects' copy let through last, if
        any: a request it would refuse can wait for it and ask `refused` again."""
        return self._judging.get(tuple(subjects))

    async def revoke(self, revoked: KeyCheck, *, how: str) -> None:
        """key_revocations.KeyRevocations.revoke: shared, and answered once the key's leases are dropped."""
        await self._revocations.revoke(revoked, how=how)

    async def release(self, admission: CallsView) -> None:
        """Give back one admission of `admission`'s account and period: its call ended refused,
        so quota will not count it. Raises when Redis fails."""
        await self._release(keys=[admission_key(self._keys.admissions_prefix, admission)])

    def release_soon(self, admission: CallsView) -> None:
        """`release` in the background (after the response); a failure keeps the place taken
        (the account is refused one call early), counted and logged."""
        task = asyncio.get_running_loop().create_task(self._release_logged(admission))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release_logged(self, admission: CallsView) -> None:
        try:
            await self.release(admission)
        except Exception:
            ADMISSION_STORE_ERRORS.inc()
            self._release_log.warning(
                "an api_calls admission could not be given back (Redis): its place stays taken", exc_info=True
            )

    async def admitted(self, admission: CallsView) -> int:
        """The account's admissions of the period: counted by quota or in flight (tests, benchmarks)."""
        return int(await self._redis.hget(admission_key(self._keys.admissions_prefix, admission), "admitted") or 0)

    async def close(self) -> None:
        """A stopping replica gives its leases' leftovers back before it goes."""
        await self._lease_holder.close()
        if self._releases:
            await asyncio.gather(*self._releases)
        await self._redis.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose()


@dataclass(slots=True)
class _Copy:
    """Some subjects' slots as Redis stored them at their last judgment, and the last refusal
    judged from them, which holds from `since` until `until` for `limits` (a flood's thousands
    of refusals a second share it instead of each judging the slots again)."""

    slots: list[Slot | None]
    refusal: Decision | None = None
    limits: PerSubject | None = None
    since: float = 0.0
    until: float = 0.0

    def refused(self, limits: PerSubject, now: float) -> Decision | None:
        if self.refusal is not None and self.since <= now < self.until and limits == self.limits:
            return self.refusal
        decision, _ = evaluate(self.slots, limits, now)
        if decision.allowed:
            return None
        self.refusal, self.limits, self.since = decision, limits, now
        self.until = now + refusal_lasts(self.slots, limits, now)
        return decision


def _slot(fields: Sequence[bytes]) -> Slot | None:
    """A slot as the script returned it (five `%.17g` strings, or empty ones for none yet)."""
    return Slot(*(float(f) for f in fields)) if fields[0] else None
