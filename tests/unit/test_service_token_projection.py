"""The edge's projection of service-tokens.v1: newest state wins, revoked tokens are forgotten,
uses are noted newest-first and drained once."""

import uuid
from datetime import UTC, datetime, timedelta

from contracts.common import ServiceScope
from contracts.credentials import SERVICE_TOKEN_PREFIX, hash_secret, new_service_token
from contracts.events import ServiceTokenState
from services.edge.service_tokens import ServiceTokenProjection

T0 = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)


def state(token_id: uuid.UUID, digest: str, at: datetime, *, revoked: bool = False) -> ServiceTokenState:
    return ServiceTokenState(
        time=at, token_id=token_id, name="gw", hash=digest, scopes=[ServiceScope.USAGE_WRITE], revoked=revoked
    )


def test_new_tokens_are_st_and_48_url_safe_characters_hashed_with_the_key_helper():
    token = new_service_token()
    assert token.startswith(SERVICE_TOKEN_PREFIX) and len(token) == 3 + 48
    assert all(c.isalnum() or c in "-_" for c in token[3:])
    assert len(hash_secret(token)) == 64
    assert new_service_token() != token


def test_a_revocation_wins_over_an_older_state_redelivered_after_it():
    tokens = ServiceTokenProjection()
    token_id, digest = uuid.uuid4(), hash_secret("st-x")
    tokens.apply(state(token_id, digest, T0))
    found = tokens.get(digest)
    assert found is not None and found.token_id == token_id and found.scopes == frozenset({ServiceScope.USAGE_WRITE})
    tokens.apply(state(token_id, digest, T0 + timedelta(seconds=1), revoked=True))
    assert tokens.get(digest) is None and len(tokens) == 0
    tokens.apply(state(token_id, digest, T0))  # the older live state, replayed: still revoked
    assert tokens.get(digest) is None


def test_a_tombstone_forgets_the_token():
    tokens = ServiceTokenProjection()
    token_id, digest = uuid.uuid4(), hash_secret("st-y")
    tokens.apply(state(token_id, digest, T0))
    tokens.remove(token_id)
    assert tokens.get(digest) is None
    tokens.remove(uuid.uuid4())  # unknown: nothing happens


def test_uses_are_kept_newest_per_token_and_drained_once():
    tokens = ServiceTokenProjection()
    a, b = uuid.uuid4(), uuid.uuid4()
    tokens.note_use(a, T0 + timedelta(seconds=2))
    tokens.note_use(a, T0)  # older: ignored
    tokens.note_use(b, T0)
    assert tokens.drain_uses() == {a: T0 + timedelta(seconds=2), b: T0}
    assert tokens.drain_uses() == {}
