"""Properties of the keys rules, the edge's projections, sessions and the login throttle."""

import asyncio
import ipaddress
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.common import KeyStatus, Role, UserType
from contracts.credentials import hash_secret, mask, new_api_key
from contracts.errors import ErrorCode
from contracts.events import AccountState, KeyState
from services.edge import sessions
from services.edge.calls import client_ip, parse_networks
from services.edge.errors import ApiError
from services.edge.projections import AccountProjection, KeyProjection
from services.keys import domain
from services.keys.login_throttle import Limit, LoginThrottle

URLSAFE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
secrets_ = st.text(alphabet=URLSAFE, min_size=40, max_size=80).map(lambda s: "sk-" + s)
moments = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))


@settings(max_examples=50)
@given(st.integers(0, 100))
def test_new_secrets_are_long_url_safe_and_unique(_):
    a, b = new_api_key(), new_api_key()
    assert a != b
    assert re.fullmatch(r"sk-[A-Za-z0-9_-]{40,}", a)


@given(secrets_)
def test_the_mask_shows_four_and_four_characters_and_never_the_middle(secret):
    masked = mask(secret)
    body = secret[3:]
    assert masked == f"sk-{body[:4]}...{body[-4:]}"
    assert body[4:-4] not in masked or len(body[4:-4]) == 0
    assert not re.search(r"sk-[A-Za-z0-9_-]{40,}", masked)


@given(st.datetimes(timezones=st.just(UTC)) | st.none(), moments, st.integers(0, 604_800))
def test_a_rotation_never_extends_the_old_keys_life(current, now, grace):
    end = domain.rotation_expiry(current, now, grace)
    assert end <= now + timedelta(seconds=grace)
    if current is not None:
        assert end <= current
    else:
        assert end == now + timedelta(seconds=grace)


@given(st.sampled_from(KeyStatus))
def test_toggling_twice_is_the_identity(status):
    assert domain.toggled(domain.toggled(status)) == status != domain.toggled(status)


@given(st.emails())
def test_email_normalisation_is_idempotent_and_case_blind(email):
    once = domain.normalize_email(email)
    assert domain.normalize_email(once) == once == domain.normalize_email(f"  {email.upper()} ")


def _key_states(deletions: bool):
    """States of one key (one secret, one hash) at distinct times."""
    key_id, account, secret = uuid.uuid4(), uuid.uuid4(), "sk-" + "k" * 45
    return st.lists(
        st.tuples(st.integers(0, 10_000), st.sampled_from(KeyStatus), st.booleans() if deletions else st.just(False)),
        min_size=1,
        max_size=8,
        unique_by=lambda t: t[0],
    ).map(
        lambda rows: [
            KeyState(
                time=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=t),
                account_id=account,
                key_id=key_id,
                hash=hash_secret(secret),
                status=status,
                deleted=deleted,
                roles=[Role.OWNER],
            )
            for t, status, deleted in sorted(rows)
        ]
    )


@given(st.data())
def test_the_key_projection_keeps_the_newest_state_whatever_the_order(data):
    states = data.draw(_key_states(deletions=False))
    projection = KeyProjection()
    for state in data.draw(st.permutations(states)):
        projection.apply(state)
    assert projection.get(states[-1].hash) == states[-1] and len(projection) == 1


@given(st.data())
def test_rewinds_change_nothing_and_a_deletion_is_final(data):
    """keys.v1 is keyed by key id, so one key's states arrive in order, but at least once: after a
    rebalance a consumer may rewind to any earlier offset and read on from there."""
    states = data.draw(_key_states(deletions=False))
    if data.draw(st.booleans()):  # a deleted key never comes back: deletion can only be the last state
        states[-1] = states[-1].model_copy(update={"deleted": True})
    stream: list[KeyState] = []
    for i in range(len(states)):
        stream.append(states[i])
        if data.draw(st.booleans()):
            stream.extend(states[data.draw(st.integers(0, i)) : i + 1])  # rewind and read on
    projection = KeyProjection()
    for state in stream:
        projection.apply(state)
    newest = states[-1]
    assert projection.get(newest.hash) == (None if newest.deleted else newest)


@given(st.data())
def test_the_account_projection_ends_at_the_newest_state_whatever_the_order(data):
    account = uuid.uuid4()
    times = data.draw(st.lists(st.integers(0, 10_000), min_size=1, max_size=8, unique=True))
    states = [
        AccountState(
            time=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=t),
            account_id=account,
            roles=[data.draw(st.sampled_from(Role))],
            user_type=data.draw(st.sampled_from(UserType)),
            deleted=data.draw(st.booleans()),
        )
        for t in times
    ]
    projection = AccountProjection()
    for state in data.draw(st.permutations(states)):
        projection.apply(state)
    newest = max(states, key=lambda s: s.time)
    assert projection.get(account) == (None if newest.deleted else newest)


@given(st.uuids(), st.text(min_size=1, max_size=40), st.integers(1, 2**35), st.binary(min_size=16, max_size=64))
def test_sessions_round_trip_until_expiry_and_never_look_like_keys(account, sid, expires, secret):
    claims = sessions.SessionClaims(account, sid, expires)
    token = sessions.issue(secret, claims)
    assert not token.startswith("sk-")
    assert sessions.verify(secret, token, datetime.fromtimestamp(expires - 1, UTC)) == claims
    with pytest.raises(sessions.InvalidSession):
        sessions.verify(secret, token, datetime.fromtimestamp(expires, UTC))
    with pytest.raises(sessions.InvalidSession):
        sessions.verify(secret + b"x", token, datetime.fromtimestamp(expires - 1, UTC))


ips = st.ip_addresses(v=4).map(str)


@given(ips, st.lists(ips | st.text(max_size=10), max_size=5))
def test_a_client_cannot_choose_its_address_through_x_forwarded_for(peer, hops):
    header = ", ".join(hops)
    assert client_ip(peer, header, ()) == peer  # no trusted proxies: the header is ignored
    trusted = parse_networks(["10.0.0.0/8"])
    if not peer.startswith("10."):
        assert client_ip(peer, header, trusted) == peer  # an untrusted peer's header is ignored


@given(st.lists(ips, min_size=1, max_size=4), st.ip_addresses(v=4).map(str).filter(lambda a: not a.startswith("10.")))
def test_behind_trusted_proxies_the_rightmost_untrusted_hop_is_the_client(proxies, client):
    trusted = parse_networks(["10.0.0.0/8"])
    chain = [client] + [f"10.0.0.{i}" for i in range(len(proxies))]
    assert client_ip("10.9.9.9", ", ".join(chain), trusted) == client
    forged = ["6.6.6.6", *chain]  # whatever the client puts to the left is not believed
    assert client_ip("10.9.9.9", ", ".join(forged), trusted) == client


@given(st.lists(st.ip_addresses(v=6).map(str), min_size=1, max_size=3), st.ip_addresses(v=6).map(str))
def test_behind_trusted_ipv6_proxies_the_rightmost_untrusted_hop_is_the_client(proxies, client):
    trusted = parse_networks(["fd00::/8"])
    if client_ip(client, "", trusted) != client or ipaddress.ip_address(client) in trusted[0]:
        return  # the client itself inside the proxies' network: nothing to tell apart
    chain = [client] + [f"fd00::{i + 1:x}" for i in range(len(proxies))]
    assert client_ip("fd00::99", ", ".join(chain), trusted) == str(ipaddress.ip_address(client))
    assert client_ip("fd00::99", ", ".join(["2001:db8::666", *chain]), trusted) == str(ipaddress.ip_address(client))


def test_a_trusted_proxy_seen_as_an_ipv4_mapped_address_is_still_trusted():
    """A dual-stack listener (uvicorn on `::`) sees an IPv4 proxy as ::ffff:10.0.0.5, and a proxy
    may write a client's IPv4 address in that form: both are the IPv4 address they stand for."""
    trusted = parse_networks(["10.0.0.0/8"])
    assert client_ip("::ffff:10.0.0.5", "198.51.100.7", trusted) == "198.51.100.7"
    assert client_ip("10.0.0.5", "198.51.100.7, ::ffff:10.0.0.6", trusted) == "198.51.100.7"
    assert client_ip("::ffff:192.0.2.1", "198.51.100.7", trusted) == "::ffff:192.0.2.1"  # not a proxy: ignored


# ---- login throttle: never more than `limit` counted failures per subject in any window ---------
attempts = st.lists(
    st.tuples(
        st.floats(0, 30, allow_nan=False),  # seconds since the previous attempt
        st.sampled_from(["a@example.com", "b@example.com", "A@example.com "]),
        st.sampled_from(["10.0.0.1", "10.0.0.2"]),
        st.sampled_from(["wrong", "right", "down"]),
    ),
    max_size=60,
)


@given(attempts, st.integers(1, 5), st.integers(1, 8))
def test_the_login_throttle_lets_through_at_most_limit_failures_per_window(steps, email_limit, ip_limit):
    window = 60.0
    now = [0.0]
    throttle = LoginThrottle(Limit(email_limit, window), Limit(ip_limit, window), clock=lambda: now[0])
    failures: dict[str, list[float]] = {}

    async def login(email: str, ip: str, outcome: str) -> None:
        async with throttle.attempt(email, ip):
            if outcome == "wrong":
                raise ApiError(401, ErrorCode.INVALID_CREDENTIALS, "wrong")
            if outcome == "down":
                raise ApiError(503, ErrorCode.SERVICE_UNAVAILABLE, "down")

    for gap, email, ip, outcome in steps:
        now[0] += gap
        try:
            asyncio.run(login(email, ip, outcome))
        except ApiError as exc:
            if exc.status == 429:
                assert 1 <= int(exc.headers["Retry-After"]) <= window
                continue
            if exc.status == 401:
                for subject in (domain.normalize_email(email), ip):
                    failures.setdefault(subject, []).append(now[0])
        else:
            failures.pop(domain.normalize_email(email), None)  # a success forgives the e-mail
    for subject, times in failures.items():
        limit = ip_limit if subject.startswith("10.") else email_limit
        for t in times:
            assert sum(1 for u in times if t <= u < t + window) <= limit, (subject, times)
