"""Service tokens' revocations shared in Redis: a replica whose service-tokens.v1 consumer is behind
or cut off still refuses a revoked token within `CHECK_EVERY_S` of the revocation.

The keys service writes `<prefix><token id>` (kept a week, as a key's revocation) before the
revocation answers. A replica asks Redis whether a token it holds live was revoked at most once per
`CHECK_EVERY_S` per token, measured from before it asked (the calls that come meanwhile share the
answer): a busy token costs some twenty round trips a second per replica, whatever its calls'
rate, and none on the API key's own path. A revocation is final, so a token found revoked is
refused here without asking again.
"""

import asyncio
import logging
import time
from uuid import UUID

from redis.asyncio import Redis

from services.edge.key_revocations import REVOCATION_TTL_S
from services.edge.user_revocations import CREDENTIAL_CHECK_ERRORS
from services.runtime.platform.logs import Throttled

log = logging.getLogger(__name__)

# How long a "not revoked" answer holds here: the bound (after the revocation was written) within
# which every replica that reaches Redis refuses the token; the contract's p99 <= 50 ms.
CHECK_EVERY_S = 0.05
PREFIX = "tollgate:revoked-token:"
MAX_REMEMBERED = 10_000  # tokens whose answers are remembered; forgotten all at once beyond


class TokenRevocations:
    def __init__(self, redis: "Redis[bytes]", prefix: str) -> None:
        self._redis = redis
        self._prefix = prefix
        self._live_until: dict[UUID, float] = {}  # token -> time.monotonic() until which "not revoked" holds
        self._revoked: set[UUID] = set()
        self._asking: dict[UUID, asyncio.Future[bool]] = {}
        self._log = Throttled(log)

    async def revoke(self, token_id: UUID, version: int) -> None:
        """Every replica refuses the token from now on (within CHECK_EVERY_S). Raises when Redis fails."""
        await self._redis.set(self._prefix + str(token_id), str(version).encode(), ex=REVOCATION_TTL_S)

    async def revoked(self, token_id: UUID) -> bool:
        """Whether the shared store says the token was revoked. Redis failing: False (judged by this
        process's projection alone, as a key's revocation is: counted and logged)."""
        if token_id in self._revoked:
            return True
        if time.monotonic() < self._live_until.get(token_id, 0.0):
            return False
        asking = self._asking.get(token_id)
        if asking is not None:
            return await asyncio.shield(asking)
        asking = self._asking[token_id] = asyncio.get_running_loop().create_future()
        found = False
        try:
            found = await self._ask(token_id)
        finally:
            del self._asking[token_id]
            asking.set_result(found)
        return found

    async def _ask(self, token_id: UUID) -> bool:
        asked = time.monotonic()  # before Redis answers: the answer holds from no later than this
        try:
            found = bool(await self._redis.exists(self._prefix + str(token_id)))
        except Exception:
            CREDENTIAL_CHECK_ERRORS.inc()
            self._log.warning("a service token's revocation could not be asked (Redis): judged by this process alone")
            return False
        if len(self._live_until) >= MAX_REMEMBERED:
            self._live_until.clear()
        if found:
            if len(self._revoked) >= MAX_REMEMBERED:
                self._revoked.clear()
            self._revoked.add(token_id)
            self._live_until.pop(token_id, None)
        else:
            self._live_until[token_id] = asked + CHECK_EVERY_S
        return found


async def share_token_revocation(url: str, token_id: UUID, version: int, prefix: str = PREFIX) -> None:
    """`TokenRevocations.revoke` from a process without an edge (`tollgate service-token revoke`)."""
    redis: Redis[bytes] = Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        await TokenRevocations(redis, prefix).revoke(token_id, version)
    finally:
        await redis.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose()
