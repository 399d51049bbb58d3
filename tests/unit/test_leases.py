"""The pure arithmetic of leased admissions (services/edge/leases.py): the block asked for and
granted, and a lease handing out its calls."""

from services.edge.leases import MAX_BLOCK, Lease, granted, wanted
from services.edge.rate_limit import Decision


def lease(left: int = 3, expires: float = 10.0) -> Lease:
    return Lease("0:l", 0, 7, (100,), left, expires, Decision(True, 50, 40, 12, 0), 60.0)


def test_a_call_alone_asks_for_one_and_the_block_grows_with_the_calls_that_came_meanwhile() -> None:
    assert wanted(0) == 1  # a trickle: today's single call, no lease
    assert wanted(9) == 10
    assert wanted(10_000) == MAX_BLOCK


def test_the_block_is_at_most_what_is_left_divided_by_the_live_replicas_down_to_one() -> None:
    assert granted(64, [1000], 3) == 64
    assert granted(64, [90], 3) == 30
    assert granted(64, [2], 3) == 1  # near the end: one at a time
    assert granted(64, [1000, 10], 1) == 10  # every api_calls limit's share (the key's own too)
    assert granted(64, [1000, 0], 1) == 0  # one has no room: nothing


def test_a_lease_hands_out_its_calls_with_remaining_only_what_it_still_holds() -> None:
    held = lease(left=3)
    taken = [held.take(7, (100,), 1.0) for _ in range(4)]
    assert [d.remaining if d else None for d in taken] == [2, 1, 0, None]
    first = taken[0]
    assert first is not None and (first.allowed, first.limit, first.reset_s) == (True, 50, 12)


def test_a_lease_serves_no_call_once_expired_dropped_or_judged_by_another_state_or_total() -> None:
    assert lease(expires=10.0).take(7, (100,), 10.0) is None  # expired (the holder's clock)
    dropped = lease()
    dropped.dropped = True
    assert dropped.take(7, (100,), 1.0) is None
    assert lease().take(8, (100,), 1.0) is None  # the key's state moved on
    assert lease().take(7, (90,), 1.0) is None  # a downgrade: judged again in Redis
    held = lease()
    assert held.take(8, (100,), 1.0) is None and held.left == 3  # a refused take takes nothing
