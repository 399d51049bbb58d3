"""Leased admissions (issue 38, decision 3): the pure arithmetic of a lease held by one edge replica.

A busy key's calls (several at once for the same key) need not each make the Redis round trip:
one trip takes a *block* of calls for the key, each with everything the per-call script gives a
call (its rate-limit tokens in the account's and the key's bucket and window, its api_calls
admissions, the revocation check), and the replica hands them out locally until the block is
spent, the lease expires, or the keys service announces a revocation of the key (then the holder
drops it and acknowledges). A call alone (a trickle, or one client calling in sequence) takes a
block of 1: today's script, one trip, no lease registered.

Why each guarantee holds (docs/architecture.md, "Leased admissions"):
- overshoot 0: a block's admissions are added to the shared count when it is taken, so leased
  and per-call admissions together never pass what is left;
- strict revocation: a lease is registered in Redis with the key's revocation epoch and a
  lifetime of `LEASE_S`; the toggle, DELETE or narrowing PATCH bumps the epoch and answers only
  once no lease of an older epoch is registered (dropped by its holder on the announcement, or
  expired). The holder stops using a lease `LOCAL_MARGIN_S` before Redis lets it expire, so a
  replica cut off from Redis stops admitting within `LEASE_S`;
- truthful headers: a leased call reports as Remaining only the block's leftovers after it, which
  this replica will admit whatever others do (never more than what is left);
- under-admission: leftovers are given back when a lease expires unused or is dropped, and when
  the replica stops; a killed replica's leftovers (at most `MAX_BLOCK` per key it was leasing,
  and at most what was left divided by the live replicas) stay taken until the period ends, as
  the calls.v1 events it held do.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from services.edge.rate_limit import Decision

LEASE_S = 1.0  # a lease's lifetime in Redis, from the moment it is taken (Redis's clock)
# The holder's lease ends this much earlier, measured from before it asked: it never admits from a
# lease Redis has already let expire (a toggle has stopped waiting for it).
LOCAL_MARGIN_S = 0.05
MAX_BLOCK = 64  # calls in one lease: bounds a killed replica's lost leftovers per key
REPLICA_TTL_S = 5.0  # a replica counts as live this long after its last lease


def wanted(demand: int) -> int:
    """The block to ask for, from the calls that came for the key while its last trip or lease
    was live (`demand`): 1 (today's single call) until calls come faster than a round trip."""
    return max(1, min(MAX_BLOCK, demand + 1))


def granted(want: int, left: Sequence[int], live: int) -> int:
    """The block Redis grants (LEASE_FN, statement for statement; the rate limit may stop it
    earlier): at most what is left of every api_calls limit divided by the live replicas, down
    to 1 near the end; 0 when one has nothing left."""
    if any(room <= 0 for room in left):
        return 0
    share = min((max(1, room // max(1, live)) for room in left), default=want)
    return max(1, min(want, share))


@dataclass(slots=True)
class Lease:
    """A block of calls this replica holds for one key (its rate-limit subjects), taken at
    `version` of the key's state against the api_calls `totals` it knew (each limit's period and
    total): a call judged by another version or totals does not use it (the key's state, the plan
    or the period changed: it goes to Redis)."""

    member: str  # its entry in the key's lease registry in Redis
    epoch: int  # the key's revocation epoch when it was taken
    version: int
    totals: tuple[object, ...]
    left: int  # calls not yet handed out
    expires: float  # time.monotonic() past which it is not used
    decision: Decision  # the headers' limit and reset when it was taken
    window: float  # the rate limit's window start when it was taken (giving back)
    dropped: bool = False
    # the version of the users.v1 state of the key's user it was taken with (-1: none known)
    user_version: int = -1

    def take(self, version: int, totals: tuple[object, ...], now: float, user_version: int = -1) -> Decision | None:
        """One call from the block, with its headers (Remaining: the leftovers after it), or None
        when the lease cannot serve this call (spent, expired, dropped, or judged otherwise: by
        another state of the key or of its user)."""
        if not self.usable(now) or version != self.version or totals != self.totals or user_version != self.user_version:
            return None
        self.left -= 1
        return Decision(True, self.decision.limit, self.left, self.decision.reset_s, 0)

    def usable(self, now: float) -> bool:
        return not self.dropped and self.left > 0 and now < self.expires
