"""API-key revocations shared in Redis: every replica refuses a key revoked at a later version
than the state it judged the key by, before keys.v1 brings it that state.

The entry per key (`<revoked prefix><key id>`: "<version> <how>") is read by the rate limiter's
script (rate_scripts.REVOKED_FN), so the check costs no round trip of its own. Writing one also
moves the key's lease epoch on and announces it (REVOKE): `revoke` answers once every lease of
the key taken before is dropped by its holder (lease_holder.py) or has expired.
"""

import asyncio
import logging
import time
from dataclasses import dataclass
from uuid import UUID

from prometheus_client import Counter
from redis.asyncio import Redis

from services.edge.leases import LEASE_S
from services.runtime.platform.logs import Throttled

log = logging.getLogger(__name__)

REVOCATION_STORE_ERRORS = Counter(
    "tollgate_edge_revocation_store_errors_total",
    "Revocations (keys, users, sessions, service tokens) not shared in Redis: their topics carried them (unit: revocations)",
)
# A revoked key's entry outlives any replica's lag behind keys.v1 but a partition of a week.
REVOCATION_TTL_S = 7 * 24 * 3600
# A toggle waits for the leases of the key taken before it at most this long (they expire in LEASE_S).
DROP_WAIT_S = LEASE_S + 0.5


# revoke(KEYS: the key's entry, its epoch, its lease registry; ARGV: version, how, ttl, the drops
# channel, the key's id). The entry is kept only if newer than what it holds (as before leases);
# the epoch moves on whatever, and is announced. Returns the new epoch and whether a lease of an
# older epoch is still live (the caller then waits: `STILL_HELD`).
REVOKE = """
local kept = redis.call('GET', KEYS[1])
local newer = true
if kept then
  local version = tonumber(string.match(kept, '^(%d+)'))
  if version and version >= tonumber(ARGV[1]) then newer = false end
end
if newer then
  redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[2], 'EX', tonumber(ARGV[3]))
end
local epoch = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
redis.call('PUBLISH', ARGV[4], ARGV[5] .. ' ' .. epoch)
local t = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local held = redis.call('ZCARD', KEYS[3]) > 0 and 1 or 0
return {epoch, held}
"""

# still_held(KEYS: a key's lease registry; ARGV: an epoch): 1 while a lease taken before that
# epoch is registered and not expired (Redis's clock), else 0.
STILL_HELD = """
local t = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if tonumber(string.match(member, '^(%d+):')) < tonumber(ARGV[1]) then return 1 end
end
return 0
"""


@dataclass(frozen=True, slots=True)
class KeyCheck:
    """An API key and the version of its state a process knows (judged by, or revoked at), and
    the user it acts as with the version of that user's users.v1 state it was judged by (-1: none
    known). Without a user (None) the user's changes are not asked (user_revocations.py)."""

    key_id: UUID
    version: int
    user_id: UUID | None = None
    user_version: int = -1


class KeyRevoked(Exception):
    """The key was disabled, deleted or (v4) given new rules (`narrowed`) at a version later than
    the one this process judged it by; or the user it acts as was removed (`removed`) or given
    another role (`role`) at a version later than the user's state this process judged it by."""

    def __init__(self, how: str) -> None:
        super().__init__(how)
        self.how = how
        self.deleted = how in ("deleted", "removed")
        self.narrowed = how in ("narrowed", "role")


class KeyRevocations:
    """Writes a key's revocation and waits for the leases it ends."""

    def __init__(self, redis: "Redis[bytes]", prefix: str, revoked_prefix: str, drops_channel: str) -> None:
        self._prefix = prefix  # the rate limiter's: the lease registry and epoch live under it
        self._revoked_prefix = revoked_prefix
        self._drops_channel = drops_channel
        self._revoke = redis.register_script(REVOKE)
        self._still_held = redis.register_script(STILL_HELD)
        self._log = Throttled(log)

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
            self._log.warning("a lease of a revoked key outlived its lifetime in Redis (clock?)")


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
