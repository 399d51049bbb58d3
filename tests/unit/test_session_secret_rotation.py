"""Rotating SESSION_SECRET without ending every session (docs/backup.md): replicas rolled through
three settings, each step's sessions still accepted by every replica of the step before and after.
Edges fed by hand: no I/O."""

import uuid
from datetime import UTC, datetime

import pytest

from contracts.common import Role, UserType
from contracts.events import AccountState
from services.edge.edge import Edge
from services.edge.errors import ApiError
from services.runtime.platform.settings import Settings

NOW = datetime.now(UTC)
ACCOUNT = uuid.uuid4()
OLD, NEW = "old-secret", "new-secret"
# (SESSION_SECRET, SESSION_SECRET_PREVIOUS) of every replica, step by step
STEPS = [(OLD, None), (OLD, NEW), (NEW, OLD), (NEW, None)]


def _edge(secret: str, previous: str | None) -> Edge:
    settings = Settings(
        kafka_bootstrap_servers="127.0.0.1:1",
        database_url="postgresql://u@h/d",
        session_secret=secret,
        session_secret_previous=previous,
    )
    edge = Edge(settings)
    edge.assume_caught_up()
    edge.accounts.apply(AccountState(time=NOW, account_id=ACCOUNT, roles=[Role.OWNER], user_type=UserType.INDIVIDUAL))
    return edge


def _accepts(edge: Edge, token: str) -> bool:
    try:
        edge._authenticate_session(token, NOW)
    except ApiError as refused:
        assert (refused.status, refused.code) == (401, "invalid_session")
        return False
    return True


@pytest.mark.parametrize("step", range(len(STEPS) - 1))
def test_during_a_rolling_restart_both_steps_replicas_accept_each_others_sessions(step: int) -> None:
    before, after = _edge(*STEPS[step]), _edge(*STEPS[step + 1])
    for issuer in (before, after):
        token = issuer.issue_session(ACCOUNT, uuid.uuid4().hex, NOW)
        assert _accepts(before, token) and _accepts(after, token)


def test_without_the_middle_steps_a_changed_secret_ends_every_session() -> None:
    token = _edge(OLD, None).issue_session(ACCOUNT, uuid.uuid4().hex, NOW)
    assert not _accepts(_edge(NEW, None), token)


def test_the_previous_secret_is_accepted_but_never_signs() -> None:
    rotated = _edge(NEW, OLD)
    token = rotated.issue_session(ACCOUNT, uuid.uuid4().hex, NOW)
    assert _accepts(_edge(NEW, None), token) and not _accepts(_edge(OLD, None), token)
