"""Where rate-limit slots live: this process (default) or Redis (`REDIS_URL`, several replicas).

Both run `rate_limit.evaluate`'s arithmetic atomically over all of a request's subjects: the
in-process store needs no lock (no await between read and write on the event loop); the Redis
store is one Lua script, so replicas share the limits exactly; the same script admits the call
against the shared api_calls count (admissions.py), so an API-key call costs one round trip.
Redis keeps the doubles as `%.17g` strings, which round-trip exactly, so both stores give the
same decisions. A subject over its limit is refused from the Redis store's copy of its slots
until that copy would let a request through: a flood of 429s costs no round trips. (v4) `peek`
is the same judgment taking nothing (the headers of a call its key's own rules refuse): the
script run read-only, or the copy's refusal without a round trip.
"""

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

from prometheus_client import Counter
from redis.asyncio import Redis

from services.edge.admissions import ADMISSION_STORE_ERRORS, ADMIT_FN, RELEASE, admission_args, admission_key
from services.edge.lease_scripts import GIVE_BACK, LEASE_BODY, REVOKE, STILL_HELD
from services.edge.leases import LEASE_S, LOCAL_MARGIN_S, REPLICA_TTL_S, Lease, wanted
from services.edge.quota_gate import CallsView
from services.edge.rate_limit import WINDOW_S, Decision, Limits, PerSubject, Slot, each, evaluate, refusal_lasts, window_start
from services.runtime.platform.logs import Throttled
from services.runtime.platform.metrics import DEPENDENCY_ERRORS

log = logging.getLogger(__name__)

STORE_ERRORS = Counter(
    "tollgate_edge_rate_limit_store_errors_total", "Rate-limit store (Redis) failures: the call was let through (unit: calls)"
)
REVOCATION_STORE_ERRORS = Counter(
    "tollgate_edge_revocation_store_errors_total",
    "Key revocations that could not be shared in Redis: keys.v1 carried them alone (unit: revocations)",
)
# A revoked key's entry outlives any replica's lag behind keys.v1 but a partition of a week.
REVOCATION_TTL_S = 7 * 24 * 3600


@dataclass(frozen=True, slots=True)
class KeyCheck:
    """An API key and the version of its state a process knows (judged by, or revoked at)."""

    key_id: UUID
    version: int


class KeyRevoked(Exception):
    """The key was disabled, deleted or (v4) given new rules (`narrowed`) at a version later than
    the one this process judged it by."""

    def __init__(self, how: str) -> None:
        super().__init__(how)
        self.deleted = how == "deleted"
        self.narrowed = how == "narrowed"


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


# The same arithmetic as rate_limit.py, statement for statement (keep them in step).
# rate_limit(keys, now, limits, ttl, take) -> allowed; the headers' limit, remaining, reset and retry
# (the binding limit's, as rate_limit.evaluate); the slots as stored after the call (HMGET-like
# rows); whether a request at the same time would be refused. limits[i] = {rate, burst, limit} of
# keys[i]. `take` false is a peek (evaluate's take=False): nothing written, the room left now.
RATE_LIMIT_FN = """
local function rate_limit(keys, now, limits, ttl, take)
  local W = 60.0
  local wnow = math.floor(now / W) * W
  local slots = {}
  local function estimate(s)
    return s.prev * math.max(0.0, (W - math.max(0.0, now - s.wstart)) / W) + s.cur
  end
  local stored = {}
  for i, key in ipairs(keys) do
    local rate, burst = limits[i][1], limits[i][2]
    local h = redis.call('HMGET', key, 'tokens', 'updated', 'wstart', 'cur', 'prev')
    stored[i] = h
    local s
    if not h[1] then
      s = {tokens = burst, updated = now, wstart = wnow, cur = 0.0, prev = 0.0}
    else
      s = {tokens = tonumber(h[1]), updated = tonumber(h[2]), wstart = tonumber(h[3]),
           cur = tonumber(h[4]), prev = tonumber(h[5])}
      s.tokens = math.min(burst, s.tokens + math.max(0.0, now - s.updated) * rate)
      s.updated = math.max(now, s.updated)
      if wnow == s.wstart then
      elseif wnow == s.wstart + W then
        s.prev = s.cur; s.cur = 0.0; s.wstart = wnow
      elseif wnow > s.wstart then
        s.prev = 0.0; s.cur = 0.0; s.wstart = wnow
      end
    end
    slots[i] = s
  end
  -- The limits that refuse a request now: {retry, reset, size} (rate_limit._refusing), and of
  -- them the one the headers describe: the longest Retry-After, then Reset, then size.
  local allowed, retry, reset, size = true, 0, 0, 0
  local function refusing(wait, full, of)
    local r, f = math.max(1, math.ceil(wait)), math.ceil(full)
    if allowed or r > retry or (r == retry and (f > reset or (f == reset and of > size))) then
      retry, reset, size = r, f, of
    end
    allowed = false
  end
  local function window_reset(s)
    if s.cur > 0 then return math.max(0.0, s.wstart + 2 * W - now) end
    if s.prev > 0 then return math.max(0.0, s.wstart + W - now) end
    return 0.0
  end
  for i, s in ipairs(slots) do
    local rate, burst, limit = limits[i][1], limits[i][2], limits[i][3]
    if s.tokens < 1.0 then
      refusing((1.0 - s.tokens) / rate, math.max(0.0, (burst - s.tokens) / rate), burst)
    end
    local est = estimate(s)
    if est + 1.0 > limit then
      local elapsed = math.max(0.0, now - s.wstart)
      local ww
      if s.cur + 1.0 <= limit and s.prev > 0 then
        ww = math.max(0.0, W - elapsed - W * (limit - s.cur - 1.0) / s.prev)
      else
        ww = s.wstart + W - now
        if s.cur > 0 then ww = ww + math.max(0.0, W - W * (limit - 1.0) / s.cur) end
        ww = math.max(0.0, ww)
      end
      refusing(ww, window_reset(s), limit)
    end
  end
  local remaining = 0
  if allowed then
    -- The tightest limit after the call: the least room, then the longest Reset, then the smaller.
    local first = true
    local function room(r, f, of)
      if first or r < remaining or (r == remaining and (f > reset or (f == reset and of < size))) then
        remaining, reset, size = r, f, of
      end
      first = false
    end
    for i, s in ipairs(slots) do
      local rate, burst, limit = limits[i][1], limits[i][2], limits[i][3]
      if take then
        s.tokens = s.tokens - 1.0
        s.cur = s.cur + 1.0
        stored[i] = {string.format('%.17g', s.tokens), string.format('%.17g', s.updated),
          string.format('%.17g', s.wstart), string.format('%.17g', s.cur), string.format('%.17g', s.prev)}
        redis.call('HSET', keys[i], 'tokens', stored[i][1], 'updated', stored[i][2], 'wstart', stored[i][3],
          'cur', stored[i][4], 'prev', stored[i][5])
        redis.call('EXPIRE', keys[i], ttl)
      end
      room(math.floor(s.tokens), math.ceil(math.max(0.0, (burst - s.tokens) / rate)), burst)
      room(math.floor(limit - estimate(s)), math.ceil(window_reset(s)), limit)
    end
  else
    reset = math.max(reset, retry)
  end
  local next_refused = not allowed
  for i, s in ipairs(slots) do
    if s.tokens < 1.0 or estimate(s) + 1.0 > limits[i][3] then next_refused = true end
  end
  return allowed, size, math.max(0, remaining), reset, retry, stored, next_refused
end
"""
# KEYS: the rate limit's subjects, then (when ARGV[4] >= 0) the key's revocation entry, then the
# ARGV[3] admissions' hashes. ARGV[1..2]: now, ttl; ARGV[4]: the version of the key's state the
# caller judged it by (-1: no check); ARGV[5]: n, the number of subjects; ARGV[6]: 1 to take, 0 for
# a peek (v4: writes nothing, and asks no admission); then each subject's rate, burst, limit (3n
# values); then 6 per admission (admissions.admission_args). Returns
# {-1, 'deleted' | 'disabled' | 'narrowed'} when the key was revoked (v4: or given new rules) at a
# later version (nothing is taken), else {allowed, limit, remaining, reset, retry (the headers'),
# admitted (0: every admission taken; i: the i-th had no room, none taken; -1 not judged), and
# when the subjects' next request would be refused, their slots as stored...}.
SCRIPT = (
    RATE_LIMIT_FN
    + ADMIT_FN
    + """
local wants = tonumber(ARGV[3])
local known = tonumber(ARGV[4])
local n = tonumber(ARGV[5])
local take = ARGV[6] == '1'
local limits = {}
for i = 1, n do
  limits[i] = {tonumber(ARGV[4 + 3 * i]), tonumber(ARGV[5 + 3 * i]), tonumber(ARGV[6 + 3 * i])}
end
local last = #KEYS - wants
local before_admissions = last
if known >= 0 then
  local revoked = redis.call('GET', KEYS[last])
  last = last - 1
  if revoked then
    local version, how = string.match(revoked, '^(%d+) (%a+)$')
    if version and tonumber(version) > known then
      return {-1, how}
    end
  end
end
local subjects = {}
for i = 1, last do subjects[i] = KEYS[i] end
local allowed, size, remaining, reset, retry, stored, next_refused = rate_limit(
  subjects, tonumber(ARGV[1]), limits, tonumber(ARGV[2]), take)
local admitted = -1
if allowed and take and wants > 0 then
  admitted = 0
  local counts = {}
  for i = 1, wants do
    local count, fits = room(KEYS[before_admissions + i], ARGV, 7 + 3 * n + (i - 1) * 6)
    counts[i] = count
    if not fits and admitted == 0 then admitted = i end
  end
  if admitted == 0 then
    for i = 1, wants do redis.call('HSET', KEYS[before_admissions + i], 'admitted', counts[i] + 1) end
  end
end
local result = {allowed and 1 or 0, size, remaining, reset, retry, admitted}
if next_refused then
  -- the slots as stored after this call (a refusal or a peek writes nothing), for the caller's copy
  for i, h in ipairs(stored) do
    for f = 1, 5 do result[#result + 1] = h[1] and h[f] or '' end
  end
end
return result
"""
)
MAX_COPIES = 100_000  # subjects whose slots are copied; forgotten all at once beyond
LEASE_SCRIPT = RATE_LIMIT_FN + ADMIT_FN + LEASE_BODY
# A toggle waits for the leases of the key taken before it at most this long (they expire in LEASE_S).
DROP_WAIT_S = LEASE_S + 0.5
MAX_ANNOUNCED = 100_000  # revoked keys whose latest epoch is remembered; forgotten all at once beyond


async def shared_revocations(url: str, prefix: str = "tollgate:revoked:") -> dict[UUID, tuple[int, str]]:
    """Every key revocation the shared store holds (`revoke`): key id -> (the version of the
    state it was revoked at, "deleted" | "disabled" | "narrowed"). For reconciling after a
    restore (services/keys/reconcile.py): a witness of ends that Kafka may have forgotten."""
    redis: Redis[bytes] = Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    found: dict[UUID, tuple[int, str]] = {}
    try:
        async for name in redis.scan_iter(match=prefix + "*", count=1000):
            value = await redis.get(name)
            if value is None:  # expired meanwhile
                continue
            version, _, how = value.decode().partition(" ")
            try:
                found[UUID(name.decode().removeprefix(prefix))] = (int(version), how)
            except ValueError:  # not an entry `revoke` wrote
                continue
    finally:
        await redis.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose()
    return found


class RedisStore:
    """The rate limits, and with them the api_calls admissions (admissions.py): one Lua script,
    one round trip per API-key call."""

    def __init__(
        self,
        url: str,
        prefix: str = "tollgate:rl:",
        admissions_prefix: str = "tollgate:adm:",
        revoked_prefix: str = "tollgate:revoked:",
    ) -> None:
        # A hung Redis must not hang the API: its calls fail open after half a second.
        self._redis: Redis[bytes] = Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self._prefix = prefix
        self._admissions_prefix = admissions_prefix
        self._revoked_prefix = revoked_prefix
        self._script = self._redis.register_script(SCRIPT)
        self._revoke = self._redis.register_script(REVOKE)
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
        # Leased admissions (leases.py): a busy key's calls share one trip for a block of them.
        # A call that finds its key's trip in flight waits for it (`_leasing`) and counts as
        # demand, which sizes the next block; the block is handed out here until it is spent,
        # expires, or a revocation of the key is announced (`_listen`, then `_drop`).
        self._lease_script = self._redis.register_script(LEASE_SCRIPT)
        self._give_back = self._redis.register_script(GIVE_BACK)
        self._still_held = self._redis.register_script(STILL_HELD)
        self._replica = uuid.uuid4().hex
        self._drops_channel = prefix + "drops"
        self._leases: dict[tuple[str, ...], _Leased] = {}
        self._leasing: dict[tuple[str, ...], asyncio.Future[bool]] = {}  # True: the trip failed
        self._demand: dict[tuple[str, ...], int] = {}
        self._held: dict[UUID, list[_Leased]] = {}  # registered in Redis, not yet given back
        self._announced: dict[UUID, int] = {}  # key -> the latest revocation epoch announced
        self._listening = asyncio.Event()
        self._listener: asyncio.Task[None] | None = None
        self._lease_log = Throttled(log)

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
                return await self._judge(subjects, limits, now, admission, known)
            return await self._leased(subjects, limits, now, admission, known)
        finally:
            if judged is not None:
                del self._judging[subjects]
                judged.set_result(None)

    async def _leased(
        self, subjects: tuple[str, ...], limits: PerSubject, now: float, admission: tuple[CallsView, ...], known: KeyCheck
    ) -> tuple[Decision, int | None]:
        """An admitted API-key call: from its key's lease when one serves it, else after the trip
        in flight for the key (if any), else one trip of its own, for a block of the calls that
        came meanwhile (a block of 1 is SCRIPT: the same trip as without leases)."""
        totals = tuple((view.subject, view.period, view.total) for view in admission)  # a new period or total: Redis
        while True:
            held = self._leases.get(subjects)
            if held is not None:
                decision = held.lease.take(known.version, totals, time.monotonic())
                if decision is not None:
                    self._demand[subjects] = self._demand.get(subjects, 0) + 1
                    return decision, 0
                self._retire(subjects, held)
            in_flight = self._leasing.get(subjects)
            if in_flight is None:
                break
            self._demand[subjects] = self._demand.get(subjects, 0) + 1
            if await asyncio.shield(in_flight):  # Redis failed that trip: fail open as it did, not one by one
                return self._failed_open(each(limits, len(subjects)))
        want = wanted(self._demand.pop(subjects, 0))
        leasing = self._leasing[subjects] = asyncio.get_running_loop().create_future()
        failed = False
        try:
            if want > 1 and await self._listens():
                judged = await self._take_lease(subjects, limits, now, admission, known, want, totals)
            else:
                judged = await self._judge(subjects, limits, now, admission, known)
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
        ttl = int(2 * WINDOW_S + max(math.ceil(lim.burst / lim.per_second) for lim in per))
        subject_keys = [self._prefix + s for s in subjects]
        registry = f"{self._prefix}lease:{known.key_id}"
        keys = [*subject_keys, self._revoked_prefix + str(known.key_id)]
        args: list[str | int] = [repr(now), ttl, len(admission), known.version, len(per), 1]
        for lim in per:
            args += [repr(lim.per_second), lim.burst, lim.per_minute]
        admission_keys = [admission_key(self._admissions_prefix, view) for view in admission]
        keys += admission_keys
        for view in admission:
            args += admission_args(view)
        keys += [registry, f"{self._prefix}epoch:{known.key_id}", self._prefix + "replicas"]
        lease_id = uuid.uuid4().hex
        args += [want, self._replica, lease_id, int(LEASE_S * 1000), int(REPLICA_TTL_S * 1000)]
        asked = time.monotonic()  # before Redis's clock starts the lease: ours ends first
        try:
            result = await self._lease_script(keys=keys, args=args)
        except Exception:
            return self._failed_open(per)
        if result[0] == -1:
            raise KeyRevoked(result[1].decode())
        allowed, limit, remaining, reset, retry, admitted, block, epoch, *stored = result
        if block <= 1:  # (a lease's leftovers are calls this replica may still admit: no copy refuses them)
            self._keep_copy(subjects, stored)
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
            )
            held = _Leased(lease, known.key_id, [registry, *subject_keys, *admission_keys], [lim.burst for lim in per])
            self._held.setdefault(known.key_id, []).append(held)
            if self._announced.get(known.key_id, -1) >= lease.epoch:  # revoked meanwhile: not used
                self._drop_held(known.key_id)
            else:
                self._leases[subjects] = held
                asyncio.get_running_loop().call_later(LEASE_S, self._expire, subjects, held)
            decision = Decision(True, decision.limit, lease.left, decision.reset_s, 0)  # only what this replica holds
        return decision, None if admitted == -1 else int(admitted)

    def _expire(self, subjects: tuple[str, ...], held: "_Leased") -> None:
        """A lease's lifetime is over: its leftovers, if any, are given back (no call came for them)."""
        if self._leases.get(subjects) is held:
            self._retire(subjects, held)
            self._demand.pop(subjects, None)  # no trip since: the calls came slower than a lease lives
        self._forget_held(held)

    def _retire(self, subjects: tuple[str, ...], held: "_Leased") -> None:
        """The lease serves no more calls: unused leftovers go back (in the background); a spent
        lease stays registered until it expires or a revocation's announcement acknowledges it."""
        if self._leases.get(subjects) is held:
            del self._leases[subjects]
        lease = held.lease
        if lease.left > 0 and not lease.dropped:
            if time.monotonic() >= lease.expires:  # calls came slower than a lease lives: start at 1 again
                self._demand.pop(subjects, None)
            lease.dropped = True
            self._copies.pop(subjects, None)  # the tokens given back may let a call through
            self._forget_held(held)
            self._in_background(self._return(held))

    def _forget_held(self, held: "_Leased") -> None:
        registered = self._held.get(held.key_id)
        if registered is not None and held in registered:
            registered.remove(held)
            if not registered:
                del self._held[held.key_id]

    def _drop_held(self, key_id: UUID) -> None:
        """A revocation of the key was announced: its leases here serve no more calls, and each
        leaves the registry (the toggle waits for that), with its leftovers."""
        for held in self._held.pop(key_id, []):
            held.lease.dropped = True
            for subjects, current in list(self._leases.items()):
                if current is held:
                    del self._leases[subjects]
            self._in_background(self._return(held))

    async def _return(self, held: "_Leased") -> None:
        lease = held.lease
        args: list[str | int] = [lease.member, lease.left, repr(lease.window), len(held.bursts), *held.bursts]
        try:
            await self._give_back(keys=held.keys, args=args)
        except Exception:
            ADMISSION_STORE_ERRORS.inc()
            self._lease_log.warning("a lease's leftovers could not be given back (Redis): they stay taken", exc_info=True)

    def _in_background(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

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
            await pubsub.subscribe(self._drops_channel)
            async for message in pubsub.listen():
                if message["type"] == "subscribe":
                    self._listening.set()
                elif message["type"] == "message":
                    key, _, epoch = message["data"].decode().partition(" ")
                    self._announced_drop(UUID(key), int(epoch))
        except asyncio.CancelledError:
            raise
        except Exception:
            self._lease_log.warning("revocation announcements lost (Redis): leases stop until heard again", exc_info=True)
        finally:
            self._listening.clear()
            for key_id in list(self._held):  # deaf: hold nothing a toggle could be waiting for
                self._drop_held(key_id)
            await pubsub.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose()

    def _announced_drop(self, key_id: UUID, epoch: int) -> None:
        if len(self._announced) >= MAX_ANNOUNCED:
            self._announced.clear()
        self._announced[key_id] = max(epoch, self._announced.get(key_id, 0))
        self._drop_held(key_id)

    async def peek(self, subjects: Sequence[str], limits: PerSubject, now: float, known: KeyCheck | None = None) -> Decision:
        """What `hit` would answer now, taking nothing: the copy's refusal while it refuses (no
        round trip, as a flood of 429s), else one read-only run of the script, which asks the
        revocation check as `hit_and_admit_all` does (raises KeyRevoked) and keeps a refusal's
        slots in the copy."""
        subjects = tuple(subjects)
        refusal = self.refused(subjects, limits, now)
        if refusal is not None:
            return refusal
        return (await self._judge(subjects, limits, now, None, known, take=False))[0]

    async def _judge(
        self,
        subjects: tuple[str, ...],
        limits: PerSubject,
        now: float,
        admission: tuple[CallsView, ...] | None,
        known: KeyCheck | None,
        *,
        take: bool = True,
    ) -> tuple[Decision, int | None]:
        # Idle slots expire once a full bucket and an empty window would be the same thing.
        per = each(limits, len(subjects))
        ttl = int(2 * WINDOW_S + max(math.ceil(lim.burst / lim.per_second) for lim in per))
        keys = [self._prefix + s for s in subjects]
        args: list[str | int] = [repr(now), ttl, 0 if admission is None else len(admission)]
        args += [-1 if known is None else known.version, len(per), 1 if take else 0]
        for lim in per:
            args += [repr(lim.per_second), lim.burst, lim.per_minute]
        if known is not None:
            keys.append(self._revoked_prefix + str(known.key_id))
        for view in admission or ():
            keys.append(admission_key(self._admissions_prefix, view))
            args += admission_args(view)
        try:
            result = await self._script(keys=keys, args=args)
        except Exception:
            return self._failed_open(per)
        if result[0] == -1:
            raise KeyRevoked(result[1].decode())
        allowed, limit, remaining, reset, retry, admitted, *stored = result
        self._keep_copy(subjects, stored)
        decision = Decision(bool(allowed), int(limit), int(remaining), int(reset), int(retry))
        return decision, None if admitted == -1 else int(admitted)

    def _failed_open(self, per: Sequence[Limits]) -> tuple[Decision, None]:
        """A limiter outage must not take the API down: the call goes through, loudly."""
        STORE_ERRORS.inc()
        DEPENDENCY_ERRORS.labels("redis").inc()
        self._outage_log.warning("rate-limit store failed; allowing calls (see the store errors metric)", exc_info=True)
        window = min(lim.per_minute for lim in per)
        return Decision(True, window, window, 0, 0), None

    def _keep_copy(self, subjects: tuple[str, ...], stored: Sequence[bytes]) -> None:
        if stored:  # the next request would be refused: keep the slots to refuse it here
            if len(self._copies) >= MAX_COPIES:
                self._copies.clear()
            self._copies[subjects] = _Copy([_slot(stored[i : i + 5]) for i in range(0, len(stored), 5)])

    def refused(self, subjects: Sequence[str], limits: PerSubject, now: float) -> Decision | None:
        copy = self._copies.get(tuple(subjects))
        return None if copy is None else copy.refused(limits, now)

    def judging(self, subjects: Sequence[str]) -> asyncio.Future[None] | None:
        """Redis's judgment in flight of the request these subjects' copy let through last, if
        any: a request it would refuse can wait for it and ask `refused` again."""
        return self._judging.get(tuple(subjects))

    async def revoke(self, revoked: KeyCheck, *, how: str) -> None:
        """Every replica refuses the key from now on (`how`: deleted, disabled, or narrowed: judged
        by a state older than its new rules), unless its projection has a state of this version or
        later: one entry per key, the newest revocation's. Raises when Redis fails.
        (Leases) The key's epoch moves on and is announced; this answers once every lease of the
        key taken before has been dropped by its holder (milliseconds) or has expired (a holder
        cut off from Redis: `LEASE_S` at most)."""
        key = str(revoked.key_id)
        registry = f"{self._prefix}lease:{key}"
        keys = [self._revoked_prefix + key, f"{self._prefix}epoch:{key}", registry]
        args: list[str | int] = [revoked.version, how, REVOCATION_TTL_S, self._drops_channel, key]
        epoch, held = await self._revoke(keys=keys, args=args)
        deadline = time.monotonic() + DROP_WAIT_S
        while held and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
            held = await self._still_held(keys=[registry], args=[epoch])
        if held:
            self._lease_log.warning("a lease of a revoked key outlived its lifetime in Redis (clock?)")

    async def release(self, admission: CallsView) -> None:
        """Give back one admission of `admission`'s account and period: its call ended refused,
        so quota will not count it. Raises when Redis fails."""
        await self._release(keys=[admission_key(self._admissions_prefix, admission)])

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
        return int(await self._redis.hget(admission_key(self._admissions_prefix, admission), "admitted") or 0)

    async def close(self) -> None:
        """A stopping replica gives its leases' leftovers back before it goes."""
        for subjects, held in list(self._leases.items()):
            self._retire(subjects, held)
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
        if self._releases:
            await asyncio.gather(*self._releases)
        await self._redis.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose()


@dataclass(slots=True, eq=False)
class _Leased:
    """A lease held here, with what giving it back needs: the Redis keys of its registry, its
    subjects' slots and its admissions, and each subject's burst."""

    lease: Lease
    key_id: UUID
    keys: list[str]
    bursts: list[int]


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
