"""The edge's projections of users.v1 and sessions.v1 (pure logic)."""

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from pydantic import ValidationError

from contracts.common import Role, UserType
from contracts.errors import ErrorCode
from contracts.events import AccountState, SessionRevoked, UserState
from contracts.topics import SESSIONS_RETENTION_S
from services.edge.edge import Edge
from services.edge.errors import ApiError
from services.edge.session_revocations import RevokedSessions, UserSessions
from services.runtime.platform.settings import Settings

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
TTL = 3600


USER = uuid4()


def _revoked(sid: str, at: datetime, user=USER) -> SessionRevoked:
    return SessionRevoked(time=at, account_id=user, session_id=sid, user_id=user, revoked_at=at)


def _user(user_id, at: datetime, not_before: datetime | None = None, removed: bool = False) -> UserState:
    return UserState(
        time=at, account_id=user_id, user_id=user_id, role=Role.OWNER, sessions_not_before=not_before, removed=removed
    )


def test_a_revoked_session_is_refused_until_it_would_have_expired_anyway():
    revoked = RevokedSessions(TTL)
    revoked.apply(_revoked("a", NOW), NOW)
    assert (USER, "a") in revoked and (USER, "b") not in revoked
    assert (uuid4(), "a") not in revoked  # another user's session with the same id
    revoked.forget_expired(NOW + timedelta(seconds=TTL - 1))
    assert (USER, "a") in revoked
    revoked.forget_expired(NOW + timedelta(seconds=TTL))
    assert (USER, "a") not in revoked and len(revoked) == 0


def test_replayed_old_revocations_are_not_stored_and_the_projection_stays_bounded():
    revoked = RevokedSessions(TTL)
    for i in range(1000):  # a day of logouts replayed at start: only the last hour's stay
        at = NOW - timedelta(seconds=86_400) + timedelta(seconds=86.4 * i)
        revoked.apply(_revoked(f"s{i}", at), NOW)
    assert 0 < len(revoked) <= 1000 * TTL / 86_400 + 1
    assert (USER, "s999") in revoked and (USER, "s0") not in revoked


def test_sessions_issued_before_a_password_change_end_and_later_ones_do_not():
    users = UserSessions()
    uid = uuid4()
    assert not users.ended(uid, NOW.timestamp())  # unknown user: nothing ended
    users.apply(_user(uid, NOW, not_before=NOW))
    assert users.ended(uid, NOW.timestamp() - 0.000001)
    assert not users.ended(uid, NOW.timestamp())
    # an older state redelivered after the newer one changes nothing
    users.apply(_user(uid, NOW - timedelta(seconds=5)))
    assert users.ended(uid, NOW.timestamp() - 1)
    users.apply(_user(uid, NOW + timedelta(seconds=1), not_before=NOW, removed=True))
    assert users.ended(uid, NOW.timestamp() + 10)


def _edge(ttl: int) -> Edge:
    settings = Settings(
        kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@h/d", session_secret="s", session_ttl_seconds=ttl
    )
    edge = Edge(settings)
    edge.assume_caught_up()
    edge.accounts.apply(AccountState(time=NOW, account_id=USER, roles=[Role.OWNER], user_type=UserType.INDIVIDUAL))
    return edge


def test_a_logout_stays_in_force_after_the_ttl_is_shortened_and_the_edge_restarts():
    week, hour = 7 * 86_400, 3600
    token = _edge(week).issue_session(USER, "s1", NOW, USER)  # valid for a week by its own expiry
    logout = _revoked("s1", NOW + timedelta(minutes=1))
    later = NOW + timedelta(hours=2)
    restarted = _edge(hour)  # the operator shortened the TTL; the edge replays sessions.v1
    restarted.revoked_sessions.apply(logout, later)
    assert (USER, "s1") not in restarted.revoked_sessions  # the logout is forgotten after the new TTL...
    with pytest.raises(ApiError) as refused:  # ...and the session is over all the same
        restarted._authenticate_session(token, later)
    assert refused.value.code == ErrorCode.INVALID_SESSION
    fresh = restarted.issue_session(USER, "s2", later, USER)
    assert restarted._authenticate_session(fresh, later).session_id == "s2"


def test_the_session_ttl_cannot_outlast_the_retention_of_logouts():
    assert Settings(session_ttl_seconds=SESSIONS_RETENTION_S).session_ttl_seconds == SESSIONS_RETENTION_S
    with pytest.raises(ValidationError, match="SESSION_TTL_SECONDS must be at most 604800"):
        Settings(session_ttl_seconds=SESSIONS_RETENTION_S + 1)


def test_a_session_is_issued_at_the_time_given_not_moved_past_a_password_change_the_edge_learnt_since():
    """(review) The login takes the issue time with its password check; a change that reached this
    edge after that check ends the session the old password opened, it does not renew it."""
    edge = _edge(TTL)
    edge.users.apply(_user(USER, NOW, not_before=NOW + timedelta(milliseconds=1)))
    token = edge.issue_session(USER, "s1", NOW, USER)
    with pytest.raises(ApiError) as refused:
        edge._authenticate_session(token, NOW + timedelta(seconds=1))
    assert refused.value.code == ErrorCode.INVALID_SESSION
