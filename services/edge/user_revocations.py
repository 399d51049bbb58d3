"""Users' and sessions' ends shared in Redis: every replica refuses a logged-out session, a session
ended by a password change, and a removed user's or a re-roled user's sessions and keys, before
users.v1 or sessions.v1 brings it the new state (a replica whose Kafka consumer is behind or cut
off), as key_revocations.py does for a toggled key.

Per user, one hash `<users prefix><user id>`, kept a week from its last write:
- `acts` = "<version> <how>": the user was removed (`removed`) or given another role (`role`) at
  that version of its users.v1 state. The rate limiter's script reads it for every API-key call
  (`USER_CHANGED_FN`, beside the key's own revocation entry: no round trip of its own), and refuses
  a key judged by an older state of its user: `removed` as a deleted key (401), `role` as a
  narrowed one (503, retry: the replica cannot tell whether the new role is narrower). Writing it
  moves the epoch of each of the user's keys on, as a toggle does, and answers once no lease of
  those keys taken before is held (lease_holder.py): a key's leased calls were taken with the old role.
- `nb`: the user's `sessions_not_before` (unix seconds): a session issued before it is over (a
  password change).
A logged-out session is `<logouts prefix><user id>:<session id>`, kept as long as the session
could still be valid (the session lifetime). A console call asks both in one round trip
(`CHECK_SESSION`); console traffic is light, so it asks on every call.
"""

import asyncio
import logging
import time
from collections.abc import Sequence
from uuid import UUID

from prometheus_client import Counter
from redis.asyncio import Redis

from services.edge.key_revocations import DROP_WAIT_S, REVOCATION_TTL_S, STILL_HELD
from services.runtime.platform.logs import Throttled

log = logging.getLogger(__name__)

CREDENTIAL_CHECK_ERRORS = Counter(
    "tollgate_edge_credential_check_errors_total",
    "Checks of a session's or a service token's end in Redis that failed: judged by the projections alone (unit: checks)",
)

# user_changed(entry, known): how the user was changed ('removed' | 'role') when its entry was
# written at a later version of its users.v1 state than `known` (-1: no state known), else nil.
USER_CHANGED_FN = """
local function user_changed(entry, known)
  local acts = redis.call('HGET', entry, 'acts')
  if acts then
    local version, how = string.match(acts, '^(%d+) (%a+)$')
    if version and tonumber(version) > known then
      return how
    end
  end
  return nil
end
"""

# change(KEYS: the user's entry, then each key's epoch and lease registry; ARGV: version, how, ttl,
# the drops channel, then the keys' ids). `acts` is kept only if newer than what it holds; each
# key's epoch moves on whatever, and is announced (lease_holder.py drops its leases). Returns each
# key's new epoch and whether a lease of an older epoch is still live.
CHANGE = """
local kept = redis.call('HGET', KEYS[1], 'acts')
local newer = true
if kept then
  local version = tonumber(string.match(kept, '^(%d+)'))
  if version and version >= tonumber(ARGV[1]) then newer = false end
end
if newer then
  redis.call('HSET', KEYS[1], 'acts', ARGV[1] .. ' ' .. ARGV[2])
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local result = {}
for i = 5, #ARGV do
  local j = 2 * (i - 4)
  local epoch = redis.call('INCR', KEYS[j])
  redis.call('EXPIRE', KEYS[j], tonumber(ARGV[3]))
  redis.call('PUBLISH', ARGV[4], ARGV[i] .. ' ' .. epoch)
  redis.call('ZREMRANGEBYSCORE', KEYS[j + 1], '-inf', ms)
  result[#result + 1] = epoch
  result[#result + 1] = redis.call('ZCARD', KEYS[j + 1]) > 0 and 1 or 0
end
return result
"""

# end_sessions(KEYS: the user's entry; ARGV: sessions_not_before (unix seconds), ttl): the later one kept.
END_SESSIONS = """
local kept = redis.call('HGET', KEYS[1], 'nb')
if not kept or tonumber(kept) < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'nb', ARGV[1])
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return 0
"""

# check_session(KEYS: the user's entry, the session's logout; ARGV: the version of the user's
# users.v1 state the caller judged it by (-1: none), the session's issue time (unix seconds)).
# Returns why the session is over ('logout' | 'removed' | 'role' | 'ended'), or nil.
CHECK_SESSION = (
    USER_CHANGED_FN
    + """
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 'logout'
end
local how = user_changed(KEYS[1], tonumber(ARGV[1]))
if how then
  return how
end
local nb = redis.call('HGET', KEYS[1], 'nb')
if nb and tonumber(ARGV[2]) < tonumber(nb) then
  return 'ended'
end
return false
"""
)


class UserRevocations:
    """Writes users' and sessions' ends, and asks them for a console call."""

    def __init__(self, redis: "Redis[bytes]", *, prefix: str, users_prefix: str, logouts_prefix: str, drops_channel: str) -> None:
        self._redis = redis
        self._prefix = prefix  # the rate limiter's: the keys' lease registries and epochs live under it
        self.users_prefix = users_prefix
        self._logouts_prefix = logouts_prefix
        self._drops_channel = drops_channel
        self._change = redis.register_script(CHANGE)
        self._end_sessions = redis.register_script(END_SESSIONS)
        self._check_session = redis.register_script(CHECK_SESSION)
        self._still_held = redis.register_script(STILL_HELD)
        self._log = Throttled(log)

    async def change(self, user_id: UUID, version: int, how: str, key_ids: Sequence[UUID]) -> None:
        """Every replica refuses the user's keys and sessions judged by a users.v1 state older than
        `version` (`how`: removed, or role). Answers once every lease of `key_ids` (the user's
        keys) taken before is dropped by its holder or has expired. Raises when Redis fails."""
        keys = [self.users_prefix + str(user_id)]
        for key_id in key_ids:
            keys += [f"{self._prefix}epoch:{key_id}", f"{self._prefix}lease:{key_id}"]
        args: list[str | int] = [version, how, REVOCATION_TTL_S, self._drops_channel, *(str(k) for k in key_ids)]
        result = await self._change(keys=keys, args=args)
        pending = [
            (f"{self._prefix}lease:{key_id}", int(result[2 * i])) for i, key_id in enumerate(key_ids) if int(result[2 * i + 1])
        ]
        deadline = time.monotonic() + DROP_WAIT_S
        while pending and time.monotonic() < deadline:
            await asyncio.sleep(0.002)
            pending = [(r, e) for r, e in pending if await self._still_held(keys=[r], args=[e])]
        if pending:
            self._log.warning("a lease of a re-roled or removed user's key outlived its lifetime in Redis (clock?)")

    async def end_sessions(self, user_id: UUID, not_before: float) -> None:
        """Every replica refuses the user's sessions issued before `not_before` (unix seconds)."""
        await self._end_sessions(keys=[self.users_prefix + str(user_id)], args=[repr(not_before), REVOCATION_TTL_S])

    async def log_out(self, sessions: Sequence[tuple[UUID, str, int]]) -> None:
        """Every replica refuses each (user id, session id) for its lifetime left (seconds), in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for user_id, session_id, ttl_s in sessions:
                pipe.set(f"{self._logouts_prefix}{user_id}:{session_id}", b"1", ex=max(1, ttl_s))
            await pipe.execute()

    async def session_over(self, user_id: UUID, session_id: str, user_version: int, issued_at: float) -> str | None:
        """Why the session is over for the shared store ('logout', 'removed', 'ended': refused;
        'role': its user's role changed after the state this process judged it by), or None.
        Raises when Redis fails."""
        found = await self._check_session(
            keys=[self.users_prefix + str(user_id), f"{self._logouts_prefix}{user_id}:{session_id}"],
            args=[user_version, repr(issued_at)],
        )
        return None if found is None else (found.decode() if isinstance(found, bytes) else str(found))
