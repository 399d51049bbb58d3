"""The rate-limit rules alone: token bucket + sliding window over several subjects."""

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from services.edge.rate_limit import STEADY_MARGIN_S, Limits, Slot, advance, estimate, evaluate, refusal_lasts
from services.edge.rate_store import MemoryStore, _Copy

T0 = 1_800_000_000.0  # a minute boundary


def run(store: MemoryStore, subjects: tuple[str, ...], limits: Limits, now: float):
    return asyncio.run(store.hit(subjects, limits, now))


def test_burst_then_refill_at_the_bucket_rate():
    store, limits = MemoryStore(), Limits(per_second=2, burst=3, per_minute=1000)
    assert [run(store, ("k",), limits, T0).allowed for _ in range(4)] == [True, True, True, False]
    denied = run(store, ("k",), limits, T0)
    assert denied.retry_after_s == 1 and denied.headers()["Retry-After"] == "1"
    assert run(store, ("k",), limits, T0 + 0.5).allowed  # one token back after 1/2 s
    assert not run(store, ("k",), limits, T0 + 0.5).allowed


def test_sliding_window_counts_the_previous_minute_by_its_overlap():
    store, limits = MemoryStore(), Limits(per_second=1000, burst=1000, per_minute=10)
    assert all(run(store, ("k",), limits, T0 + 50).allowed for _ in range(10))
    denied = run(store, ("k",), limits, T0 + 50)
    # The window refused: its 10 calls weigh until the end of the next minute (Reset 70 s), and
    # one more fits 16 s from now (10 s to the next minute, where 10 * (60 - 6) / 60 = 9 weigh).
    assert (denied.allowed, denied.limit, denied.remaining, denied.reset_s, denied.retry_after_s) == (False, 10, 0, 70, 16)
    # 15 s into the next minute the previous one still weighs 10 * 45/60 = 7.5: room for 2
    assert [run(store, ("k",), limits, T0 + 75).allowed for _ in range(3)] == [True, True, False]
    assert run(store, ("k",), limits, T0 + 125).allowed


def test_headers_on_success_describe_the_tightest_limit():
    store, limits = MemoryStore(), Limits(per_second=5, burst=20, per_minute=120)
    decision = run(store, ("a", "k"), limits, T0 + 12.5)
    # The bucket has 19 of 20 left (full again in 1/5 s), the window 119 of 120: the bucket binds.
    assert decision.headers() == {"X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "19", "X-RateLimit-Reset": "1"}
    store, limits = MemoryStore(), Limits(per_second=5, burst=20, per_minute=30)
    assert sum(run(store, ("a", "k"), limits, T0 + 20).allowed for _ in range(40)) == 20  # the burst
    assert all(run(store, ("a", "k"), limits, T0 + 40).allowed for _ in range(4))  # the bucket refilled
    # 25 of 30 in this minute (20 tokens left): the window binds, and its calls weigh on the
    # sliding window until the end of the next minute.
    window = run(store, ("a", "k"), limits, T0 + 40)
    assert window.headers() == {"X-RateLimit-Limit": "30", "X-RateLimit-Remaining": "5", "X-RateLimit-Reset": "80"}


def test_a_burst_refusal_reports_the_bucket_that_refused_not_the_window():
    """Issue #41: after a free key's burst the 429 said Remaining 100 (the window's room)."""
    store, limits = MemoryStore(), Limits(per_second=5, burst=20, per_minute=120)
    assert all(run(store, ("a", "k"), limits, T0 + 30).allowed for _ in range(20))
    refused = run(store, ("a", "k"), limits, T0 + 30)
    assert refused.headers() == {
        "X-RateLimit-Limit": "20",  # the bucket
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "4",  # 20 tokens at 5 a second
        "Retry-After": "1",
    }


def test_a_rejected_request_consumes_nothing_from_the_other_limit_or_subject():
    store, limits = MemoryStore(), Limits(per_second=1, burst=2, per_minute=3)
    assert run(store, ("acct", "key1"), limits, T0).allowed
    assert run(store, ("acct", "key1"), limits, T0).allowed
    for _ in range(10):  # the buckets are empty: rejected, and the windows keep their room
        assert not run(store, ("acct", "key1"), limits, T0).allowed
    assert run(store, ("acct", "key2"), limits, T0 + 1).allowed  # the account's 3rd of 3 this minute
    for _ in range(10):  # the account's window is full: rejected, and no bucket pays for it
        assert not run(store, ("acct", "key1"), limits, T0 + 1.5).allowed
    slots = store._slots
    assert slots["key1"].tokens == 0 and slots["key2"].tokens == 1 and slots["acct"].cur == 3


times = st.lists(st.floats(min_value=0, max_value=300, allow_nan=False), min_size=1, max_size=200).map(sorted)
limit_sets = st.builds(
    Limits,
    per_second=st.floats(min_value=0.1, max_value=20),
    burst=st.integers(min_value=1, max_value=30),
    per_minute=st.integers(min_value=1, max_value=60),
)


@settings(max_examples=150, deadline=None)
@given(times=times, limits=limit_sets)
def test_never_more_than_the_bucket_and_the_minute_allow(times, limits):
    slot: Slot | None = None
    allowed: list[float] = []
    for t in times:
        decision, after = evaluate([slot], limits, T0 + t)
        if after is not None:
            slot = after[0]
            allowed.append(t)
        assert decision.allowed == (after is not None)
        assert 0 <= decision.remaining <= limits.per_minute
    for i, t in enumerate(allowed):
        for span in (0.0, 1.0, 10.0):  # the bucket: burst + refill over any span
            assert sum(1 for u in allowed[: i + 1] if u >= t - span) <= limits.burst + limits.per_second * span + 1e-6
        minute = (T0 + t) // 60
        assert sum(1 for u in allowed if (T0 + u) // 60 == minute) <= limits.per_minute


@settings(max_examples=150, deadline=None)
@given(times=times, limits=limit_sets)
def test_retry_after_is_honest(times, limits):
    """A caller that waits the Retry-After it was given (and sends nothing meanwhile) gets in."""
    slot: Slot | None = None
    for t in times:
        decision, after = evaluate([slot], limits, T0 + t)
        if after is not None:
            slot = after[0]
            continue
        retry, _ = evaluate([slot], limits, T0 + t + decision.retry_after_s + 1e-6)
        assert retry.allowed, (decision, slot)


@settings(max_examples=150, deadline=None)
@given(times=times, limits=limit_sets)
def test_a_peek_takes_nothing_and_counts_no_call_in_its_remaining(times, limits):
    """(v4) A peek (the headers of a call its key's own rules refuse) is the judgment a call
    would get, taking nothing: the same refusal, or the room left now, this call not counted
    (one more than the call would leave), and the store as it was."""
    store, subjects = MemoryStore(), ("acct", "key")
    for i, t in enumerate(times):
        now = T0 + t
        before = dict(store._slots)
        peeked = asyncio.run(store.peek(subjects, limits, now))
        assert store._slots == before and evaluate([before.get(s) for s in subjects], limits, now, take=False)[1] is None
        if i % 2:  # every other moment, only peeks: the next call's judgment is unchanged
            continue
        decision = run(store, subjects, limits, now)
        assert peeked.allowed == decision.allowed
        if decision.allowed:
            assert peeked.remaining == decision.remaining + 1
        else:
            assert peeked == decision


def test_a_peek_of_untouched_subjects_answers_their_whole_limits():
    limits = Limits(per_second=5, burst=20, per_minute=120)
    peeked = asyncio.run(MemoryStore().peek(("acct", "key"), limits, T0))
    assert (peeked.allowed, peeked.limit, peeked.remaining, peeked.reset_s, peeked.retry_after_s) == (True, 20, 20, 0, 0)


def test_a_refusal_lasts_until_its_headers_or_its_answer_would_change():
    store, limits = MemoryStore(), Limits(per_second=1, burst=1, per_minute=1000)
    assert run(store, ("k",), limits, T0 + 10.0).allowed  # the only token
    slots = [store._slots["k"]]
    refusal, _ = evaluate(slots, limits, T0 + 10.25)
    assert (refusal.allowed, refusal.limit, refusal.remaining, refusal.retry_after_s, refusal.reset_s) == (False, 1, 0, 1, 1)
    # The token is back at T0 + 11, when Reset ticks too: the refusal holds until just before.
    assert refusal_lasts(slots, limits, T0 + 10.25) == 0.75 - STEADY_MARGIN_S
    assert evaluate(slots, limits, T0 + 10.9985)[0] == refusal
    assert evaluate(slots, limits, T0 + 11.0)[0].allowed


def test_a_refusal_with_room_in_the_window_lasts_until_a_whole_second():
    limits = Limits(per_second=1, burst=1, per_minute=100)
    now = T0 + 90.05  # 30.05 s into the minute: the previous minute's 90 calls weigh 44.925
    slots: list[Slot | None] = [Slot(tokens=0.0, updated=now, wstart=T0 + 60, cur=0.0, prev=90.0)]
    refusal, _ = evaluate(slots, limits, now)
    # The bucket refused: its headers, not the window's 55 of room (which fades on, unreported).
    assert (refusal.allowed, refusal.limit, refusal.remaining, refusal.reset_s, refusal.retry_after_s) == (False, 1, 0, 1, 1)
    lasts = refusal_lasts(slots, limits, now)
    assert abs(lasts - (0.95 - STEADY_MARGIN_S)) < 1e-6  # (the clock's doubles: ~1e-7 s apart)
    assert evaluate(slots, limits, now + lasts)[0] == refusal
    assert evaluate(slots, limits, now + 1.0)[0].allowed  # the token is back


def _whole(slot: Slot | None, limits: Limits, size: int, at: float) -> bool:
    """Whether the limit of this size is whole again for this subject at `at`."""
    state = advance(slot, limits, at)
    full = state.tokens >= limits.burst - 1e-9 if size == limits.burst else False
    return full or (size == limits.per_minute and estimate(state, at) == 0.0)


@settings(max_examples=150, deadline=None)
@given(times=times, limits=limit_sets)
def test_the_headers_describe_the_binding_limit(times, limits):
    """A refusal reports the limit that refused, with nothing left; an admitted call the tightest
    limit; and a caller that waits Reset seconds, calling nothing, finds that limit whole."""
    slots: list[Slot | None] = [None, None]
    for i, t in enumerate(times):
        subjects = [0, 1] if i % 3 else [0]  # the account's slot takes the other key's calls too
        now = T0 + t
        decision, after = evaluate([slots[j] for j in subjects], limits, now)
        assert decision.limit in (limits.burst, limits.per_minute)
        if after is None:
            assert decision.remaining == 0 and decision.reset_s >= decision.retry_after_s >= 1
            continue
        for j, slot in zip(subjects, after, strict=True):
            slots[j] = slot
        rooms = [(int(s.tokens), limits.burst) for s in after]
        rooms += [(int(limits.per_minute - estimate(s, now)), limits.per_minute) for s in after]
        assert decision.remaining == min(room for room, _ in rooms)
        assert (decision.remaining, decision.limit) in rooms
        assert any(_whole(s, limits, decision.limit, now + decision.reset_s + 1e-6) for s in after), (decision, after)


@settings(max_examples=300, deadline=None)
@given(
    key_times=times,
    other_times=times,
    limits=limit_sets,
    at=st.floats(min_value=0, max_value=360, allow_nan=False),
    later=st.lists(st.floats(min_value=0, max_value=1, exclude_max=True), min_size=1, max_size=20),
)
def test_a_refusal_is_what_evaluate_answers_for_as_long_as_it_lasts(key_times, other_times, limits, at, later):
    """The account's slot takes another key's calls too: two subjects, each with its own past."""
    store = MemoryStore()
    for t in sorted(key_times + other_times):
        run(store, ("acct", "key" if t in key_times else "other"), limits, T0 + t)
    slots = [store._slots.get("acct"), store._slots.get("key")]
    now = T0 + max(at, *key_times, *other_times)
    refusal, _ = evaluate(slots, limits, now)
    if refusal.allowed:
        return
    lasts = refusal_lasts(slots, limits, now)
    for u in [*later, 1 - 1e-9]:
        assert evaluate(slots, limits, now + u * lasts)[0] == refusal, (slots, now, lasts, u)


def test_a_copy_of_redis_slots_shares_its_refusal_while_it_lasts_and_judges_again_after():
    limits = Limits(per_second=1, burst=1, per_minute=1000)
    copy = _Copy([Slot(tokens=0.0, updated=T0 + 10, wstart=T0, cur=1.0, prev=0.0)])
    first = copy.refused(limits, T0 + 10.25)
    assert first is not None and copy.refused(limits, T0 + 10.5) is first  # the flood's next refusal: shared
    slower = copy.refused(Limits(per_second=0.5, burst=1, per_minute=1000), T0 + 10.5)  # another plan: judged
    assert slower is not None and slower.retry_after_s == 2
    assert copy.refused(limits, T0 + 11.0) is None  # the token is back: Redis judges the call
