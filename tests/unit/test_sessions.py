from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from services.edge import sessions

SECRET = b"s3cret"
NOW = datetime(2026, 11, 22, 8, 0, tzinfo=UTC)


def _claims(ttl: int = 60) -> sessions.SessionClaims:
    return sessions.SessionClaims(uuid4(), "sid", int(NOW.timestamp()) + ttl)


def test_a_genuine_token_verifies_and_never_looks_like_an_api_key():
    claims = _claims()
    token = sessions.issue(SECRET, claims)
    assert not token.startswith("sk-")
    assert sessions.verify(SECRET, token, NOW) == claims


def test_expiry_is_exact():
    token = sessions.issue(SECRET, _claims(ttl=60))
    sessions.verify(SECRET, token, NOW + timedelta(seconds=59))
    with pytest.raises(sessions.InvalidSession):
        sessions.verify(SECRET, token, NOW + timedelta(seconds=60))


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t + "x",
        lambda t: t.replace("tg1.", "tg2."),
        lambda t: "tg1." + t.split(".")[1][:-2] + "AA." + t.split(".")[2],
        lambda t: "garbage",
        lambda t: "tg1.e30.sig",
    ],
)
def test_tampered_tokens_are_refused(mangle):
    with pytest.raises(sessions.InvalidSession):
        sessions.verify(SECRET, mangle(sessions.issue(SECRET, _claims())), NOW)


def test_another_secret_is_refused():
    with pytest.raises(sessions.InvalidSession):
        sessions.verify(b"other", sessions.issue(SECRET, _claims()), NOW)


def test_the_issue_time_travels_with_microseconds():
    claims = sessions.SessionClaims(uuid4(), "sid", int(NOW.timestamp()) + 60, NOW.timestamp() + 0.123456)
    assert sessions.verify(SECRET, sessions.issue(SECRET, claims), NOW).issued_at == claims.issued_at


def test_a_token_without_issue_time_is_refused():
    # Issued before v2 ({sub, sid, exp}): the edge could not tell whether a password change ended it.
    payload = sessions._b64(b'{"sub": "%s", "sid": "s", "exp": %d}' % (str(uuid4()).encode(), int(NOW.timestamp()) + 60))
    token = f"tg1.{payload}.{sessions._sign(SECRET, payload)}"
    with pytest.raises(sessions.InvalidSession):
        sessions.verify(SECRET, token, NOW)


def test_a_token_ends_the_current_lifetime_after_its_issue_whatever_its_own_expiry():
    # issued under a TTL of a week; the TTL is an hour now
    claims = sessions.SessionClaims(uuid4(), "sid", int(NOW.timestamp()) + 7 * 86_400, NOW.timestamp())
    token = sessions.issue(SECRET, claims)
    assert sessions.verify(SECRET, token, NOW + timedelta(seconds=3599), max_lifetime_s=3600) == claims
    with pytest.raises(sessions.InvalidSession):
        sessions.verify(SECRET, token, NOW + timedelta(seconds=3600), max_lifetime_s=3600)
    # a lifetime longer than the token's own changes nothing
    with pytest.raises(sessions.InvalidSession):
        sessions.verify(SECRET, sessions.issue(SECRET, _claims(ttl=60)), NOW + timedelta(seconds=60), max_lifetime_s=3600)


@pytest.mark.parametrize(
    "token",
    [
        "tg1.abc.d\xe9f",  # a latin-1 byte of a header, as Starlette decodes it
        lambda t: t[:-1] + "\xe9",  # a genuine token's signature, one character off
        lambda t: t.replace(".", ".\u00fc", 1),  # in the payload
        "tg1.e30.\u2603",
    ],
)
def test_a_token_that_is_not_ascii_is_refused_not_raised(token):
    text = token(sessions.issue(SECRET, _claims())) if callable(token) else token
    with pytest.raises(sessions.InvalidSession):
        sessions.verify(SECRET, text, NOW)
