"""Rate-limit rules, pure: a token bucket (bursts) and a sliding window per minute, judged
together over several subjects (the account and the key) so that a rejection consumes nothing.

Each subject has two limits, its bucket and its window, and the X-RateLimit-* headers describe
the one that binds (as the IETF RateLimit draft says of several policies): on a refusal, the
limit that refused (of those refusing, the one Retry-After waits for), with Remaining 0; on an
admitted call, the one with the least room left. Limit is that limit's size in requests (the
bucket's burst, or the window's requests per minute), Remaining what it still lets through now,
and Reset the seconds until, with no more calls, it is whole again (Remaining back to Limit):
the bucket full, or the sliding window holding no call, which is up to 120 s, since a minute's
calls still weigh on the next one.

The sliding window is the two-window estimate (Cloudflare's): the previous fixed minute counts
in proportion to how much of it still overlaps the last 60 s. `services/edge/rate_store.py`
runs the same arithmetic in process or, for several replicas, in Redis as one Lua script.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from contracts.rate_limit import RateLimit

WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class Limits:
    """A subject's limits. Calls are judged over several subjects at once, each with its own
    (v4: a key with a rate limit of its own is narrower than its account): `PerSubject`."""

    per_second: float  # bucket refill rate
    burst: int  # bucket capacity
    per_minute: int  # sliding window limit

    @classmethod
    def of(cls, rate: RateLimit) -> "Limits":
        return cls(float(rate.per_second), rate.burst, rate.per_minute)


# One Limits for every subject, or one per subject, in the subjects' order.
PerSubject = Limits | Sequence[Limits]


def each(limits: PerSubject, n: int) -> Sequence[Limits]:
    """The limits of each of `n` subjects."""
    if isinstance(limits, Limits):
        return (limits,) * n
    if len(limits) != n:
        raise ValueError(f"{len(limits)} limits for {n} subjects")
    return limits


# Slot and Decision are made on every API-key call: slotted, not frozen (a frozen dataclass's
# __init__ pays a setattr call per field); nothing mutates them.
@dataclass(slots=True)
class Slot:
    """One subject's state: the bucket, and the current and previous fixed minute."""

    tokens: float
    updated: float
    wstart: float
    cur: float
    prev: float


@dataclass(slots=True)
class Decision:
    allowed: bool
    limit: int  # X-RateLimit-Limit: the binding limit's size (the burst, or requests per minute)
    remaining: int  # X-RateLimit-Remaining: what the binding limit still lets through (0 on a refusal)
    reset_s: int  # X-RateLimit-Reset: seconds until the binding limit is whole again, if no call comes
    retry_after_s: int  # Retry-After when not allowed (>= 1), else 0

    def headers(self) -> dict[str, str]:
        """The answer's headers: `limit_headers`, and Retry-After on a refusal (a 429)."""
        headers = self.limit_headers()
        if not self.allowed:
            headers["Retry-After"] = str(self.retry_after_s)
        return headers

    def limit_headers(self) -> dict[str, str]:
        """X-RateLimit-* alone: what a refusal other than the limiter's own (v4: a 403 of the key's
        rules) carries; no Retry-After, since waiting would not change that answer."""
        return {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(self.reset_s),
        }


def window_start(now: float) -> float:
    return math.floor(now / WINDOW_S) * WINDOW_S


def advance(slot: Slot | None, limits: Limits, now: float) -> Slot:
    """The slot as of `now`: tokens refilled, the window rolled (a clock going back changes nothing)."""
    wstart = window_start(now)
    if slot is None:
        return Slot(float(limits.burst), now, wstart, 0.0, 0.0)
    tokens = min(float(limits.burst), slot.tokens + max(0.0, now - slot.updated) * limits.per_second)
    updated = max(now, slot.updated)
    if wstart == slot.wstart:
        return Slot(tokens, updated, slot.wstart, slot.cur, slot.prev)
    if wstart == slot.wstart + WINDOW_S:
        return Slot(tokens, updated, wstart, 0.0, slot.cur)
    if wstart > slot.wstart:
        return Slot(tokens, updated, wstart, 0.0, 0.0)
    return Slot(tokens, updated, slot.wstart, slot.cur, slot.prev)


def estimate(slot: Slot, now: float) -> float:
    """Requests in the last 60 s: the previous minute weighted by its overlap, plus this one."""
    return slot.prev * max(0.0, (WINDOW_S - max(0.0, now - slot.wstart)) / WINDOW_S) + slot.cur


def bucket_wait(slot: Slot, limits: Limits) -> float:
    return 0.0 if slot.tokens >= 1.0 else (1.0 - slot.tokens) / limits.per_second


def window_wait(slot: Slot, limits: Limits, now: float) -> float:
    """Seconds until one more request fits the sliding window."""
    limit = float(limits.per_minute)
    if estimate(slot, now) + 1.0 <= limit:
        return 0.0
    elapsed = max(0.0, now - slot.wstart)
    if slot.cur + 1.0 <= limit and slot.prev > 0:
        # prev * (60 - elapsed - t) / 60 + cur + 1 <= limit
        return max(0.0, WINDOW_S - elapsed - WINDOW_S * (limit - slot.cur - 1.0) / slot.prev)
    # Not in this minute: in the next one `cur` becomes the weighted previous minute.
    to_next = slot.wstart + WINDOW_S - now
    if slot.cur > 0:
        to_next += max(0.0, WINDOW_S - WINDOW_S * (limit - 1.0) / slot.cur)
    return max(0.0, to_next)


def bucket_reset(slot: Slot, limits: Limits) -> float:
    """Seconds until the bucket is full again."""
    return max(0.0, (limits.burst - slot.tokens) / limits.per_second)


def window_reset(slot: Slot, now: float) -> float:
    """Seconds until the sliding window holds no call: this minute's calls weigh on it until the
    end of the next minute, the previous minute's until the end of this one."""
    if slot.cur > 0:
        return max(0.0, slot.wstart + 2 * WINDOW_S - now)
    if slot.prev > 0:
        return max(0.0, slot.wstart + WINDOW_S - now)
    return 0.0


def evaluate(
    slots: Sequence[Slot | None], limits: PerSubject, now: float, *, take: bool = True
) -> tuple[Decision, list[Slot] | None]:
    """Judge one request against every subject; the new slots only if it is allowed (a rejected
    request consumes nothing, from no subject and no limit). The headers describe the limit that
    binds (the module's docstring), whichever subject's it is. `take=False` is a peek (v4: the
    headers of a call refused by its key's own rules, which must take nothing): the same judgment,
    no slots, and on an allowed answer the room left now, this call not counted."""
    per = each(limits, len(slots))
    current = [advance(s, lim, now) for s, lim in zip(slots, per, strict=True)]
    refusing = _refusing(current, per, now)
    if refusing:
        # The limit that refused: the one whose wait is Retry-After (then the longest Reset).
        retry, reset, limit = max((_retry(wait), math.ceil(reset), size) for wait, reset, size in refusing)
        return Decision(False, limit, 0, max(reset, retry), retry), None
    after = [Slot(s.tokens - 1.0, s.updated, s.wstart, s.cur + 1.0, s.prev) for s in current] if take else current
    # The tightest limit: the least room left (then the longest until it is whole again).
    remaining, reset, limit = min(
        min(
            (math.floor(s.tokens), -math.ceil(bucket_reset(s, lim)), lim.burst),
            (math.floor(lim.per_minute - estimate(s, now)), -math.ceil(window_reset(s, now)), lim.per_minute),
        )
        for s, lim in zip(after, per, strict=True)
    )
    return Decision(True, limit, max(0, remaining), -reset, 0), after if take else None


# Float rounding may move a boundary the arithmetic below predicts by a few ulps: stop short of it.
STEADY_MARGIN_S = 0.001


def refusal_lasts(slots: Sequence[Slot | None], limits: PerSubject, now: float) -> float:
    """Seconds from `now` during which `evaluate(slots, limits, t)` answers the same refusal, the
    slots unchanged (a refusal writes nothing), so that a flood's refusals can share it. The
    answer is made of whole numbers of each refusing limit (Remaining is 0): its Retry-After and
    its Reset. Within the current whole second the window does not roll and a window's Reset
    does not tick; a refusing limit's wait and a bucket's Reset fall by a second a second, so
    neither ticks down (nor may a limit let a call through) before it has fallen to the next
    whole number below. Limits that refuse no call now cannot start to without a call."""
    per = each(limits, len(slots))
    current = [advance(s, lim, now) for s, lim in zip(slots, per, strict=True)]
    lasts = math.floor(now) + 1.0 - now
    for wait, reset, _ in _refusing(current, per, now):
        lasts = min(lasts, wait - (_retry(wait) - 1.0), reset - (math.ceil(reset) - 1.0))
    return max(0.0, lasts - STEADY_MARGIN_S)


def _retry(wait: float) -> int:
    return max(1, math.ceil(wait))


def _refusing(current: Sequence[Slot], per: Sequence[Limits], now: float) -> list[tuple[float, float, int]]:
    """(wait, reset, size) of every limit that refuses a request at `now`: a bucket without a
    whole token, a window without room for one more."""
    refusing = []
    for s, lim in zip(current, per, strict=True):
        if s.tokens < 1.0:
            refusing.append((bucket_wait(s, lim), bucket_reset(s, lim), lim.burst))
        if estimate(s, now) + 1.0 > lim.per_minute:
            refusing.append((window_wait(s, lim, now), window_reset(s, now), lim.per_minute))
    return refusing
