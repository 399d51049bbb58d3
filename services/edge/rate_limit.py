"""Rate-limit rules, pure: a token bucket (bursts) and a sliding window per minute, judged
together over several subjects (the account and the key) so that a rejection consumes nothing.

The sliding window is the two-window estimate (Cloudflare's): the previous fixed minute counts
in proportion to how much of it still overlaps the last 60 s. `services/edge/rate_store.py`
runs the same arithmetic in process or, for several replicas, in Redis as one Lua script.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from contracts.events import RateLimit

WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class Limits:
    per_second: float  # bucket refill rate
    burst: int  # bucket capacity
    per_minute: int  # sliding window limit

    @classmethod
    def of(cls, rate: RateLimit) -> "Limits":
        return cls(float(rate.per_second), rate.burst, rate.per_minute)


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
    limit: int  # X-RateLimit-Limit: requests per minute
    remaining: int  # X-RateLimit-Remaining: the tightest subject's window room after this call
    reset_s: int  # X-RateLimit-Reset: seconds until the current minute ends
    retry_after_s: int  # Retry-After when not allowed (>= 1), else 0

    def headers(self) -> dict[str, str]:
        headers = {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(self.reset_s),
        }
        if not self.allowed:
            headers["Retry-After"] = str(self.retry_after_s)
        return headers


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


def evaluate(slots: Sequence[Slot | None], limits: Limits, now: float) -> tuple[Decision, list[Slot] | None]:
    """Judge one request against every subject; the new slots only if it is allowed (a rejected
    request consumes nothing, from no subject and no limit)."""
    current = [advance(s, limits, now) for s in slots]
    blocked = _blocked(current, limits, now)
    allowed = not blocked
    wait = _wait(blocked, limits, now)
    after = [Slot(s.tokens - 1.0, s.updated, s.wstart, s.cur + 1.0, s.prev) for s in current] if allowed else current
    remaining = min((math.floor(limits.per_minute - estimate(s, now)) for s in after), default=limits.per_minute)
    reset = math.ceil(window_start(now) + WINDOW_S - now)
    decision = Decision(
        allowed=allowed,
        limit=limits.per_minute,
        remaining=max(0, remaining),
        reset_s=max(0, reset),
        retry_after_s=0 if allowed else max(1, math.ceil(wait)),
    )
    return decision, (after if allowed else None)


# Float rounding may move a boundary the arithmetic below predicts by a few ulps: stop short of it.
STEADY_MARGIN_S = 0.001


def refusal_lasts(slots: Sequence[Slot | None], limits: Limits, now: float, refusal: Decision) -> float:
    """Seconds from `now` during which `evaluate(slots, limits, t)` answers `refusal` again, the
    slots unchanged (a refusal writes nothing), so that a flood's refusals can share it. Within
    the current whole second the window does not roll and X-RateLimit-Reset does not tick; each
    blocked subject's wait falls by at most a second a second, so Retry-After cannot tick down
    (nor a call be allowed) before the wait has fallen to the next whole number below; a subject's
    estimate falls at `prev / 60` a second, so X-RateLimit-Remaining cannot rise before
    `limit - estimate` has reached the next whole number above."""
    current = [advance(s, limits, now) for s in slots]
    until_retry_ticks = _wait(_blocked(current, limits, now), limits, now) - (refusal.retry_after_s - 1.0)
    lasts = min(math.floor(now) + 1.0 - now, until_retry_ticks)
    for slot in current:
        if slot.prev > 0:
            room = limits.per_minute - estimate(slot, now)
            lasts = min(lasts, (math.floor(room) + 1.0 - room) * WINDOW_S / slot.prev)
    return max(0.0, lasts - STEADY_MARGIN_S)


def _blocked(current: Sequence[Slot], limits: Limits, now: float) -> list[Slot]:
    return [s for s in current if s.tokens < 1.0 or estimate(s, now) + 1.0 > limits.per_minute]


def _wait(blocked: Sequence[Slot], limits: Limits, now: float) -> float:
    """Seconds until every blocked subject would let one more request through."""
    return max((max(bucket_wait(s, limits), window_wait(s, limits, now)) for s in blocked), default=0.0)
