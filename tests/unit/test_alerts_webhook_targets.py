"""The webhook address rule and URL form (services/alerts/targets.py), the signature and the
backoff (services/alerts/webhook.py), without the network. The resolver is the system's own
(numeric hosts resolve without DNS), so "2130706433" is judged as the 127.0.0.1 it becomes."""

import hashlib
import hmac
import ipaddress
import uuid

import pytest

from contracts.alerts_api import Channel, WebhookRecipient
from services.alerts import domain, targets, webhook

ACCOUNT = uuid.UUID("00000000-0000-0000-0000-0000000000aa")

REFUSED = [
    "127.0.0.1",
    "127.255.0.9",
    "10.1.2.3",
    "172.16.0.1",
    "192.168.1.1",
    "169.254.169.254",  # cloud metadata
    "100.64.0.1",  # carrier-grade NAT
    "0.0.0.0",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    "::1",
    "::",
    "fe80::1",
    "febf::1",
    "fc00::1",
    "fd12:3456::1",
    "ff02::1",
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "2002:7f00:1::",  # 6to4 around 127.0.0.1
    "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
    "::127.0.0.1",  # IPv4-compatible (deprecated)
    "2001::1",  # Teredo
    "2001:db8::1",  # documentation
    "fec0::1",  # site-local
]
ALLOWED = [
    "93.184.215.14",
    "8.8.8.8",
    "1.1.1.1",
    "2606:4700:4700::1111",
    "::ffff:8.8.8.8",
    "64:ff9b::808:808",
    "2a00:1450:4001::1",
]


@pytest.mark.parametrize("address", REFUSED)
def test_non_global_addresses_are_refused(address: str) -> None:
    assert targets.refusal(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", ALLOWED)
def test_global_unicast_addresses_are_allowed(address: str) -> None:
    assert targets.refusal(ipaddress.ip_address(address)) is None


def test_a_name_is_refused_when_any_of_its_addresses_is() -> None:
    good, bad = ipaddress.ip_address("8.8.8.8"), ipaddress.ip_address("10.0.0.1")
    assert targets.refusal_of_all([good]) is None
    assert targets.refusal_of_all([good, bad]) is not None


@pytest.mark.parametrize("host", ["2130706433", "0177.0.0.1", "0x7f.1", "127.1", "017700000001"])
async def test_decimal_octal_and_short_hosts_are_judged_by_what_the_resolver_makes_of_them(host: str) -> None:
    target = targets.parse_target(f"http://{host}:8080/hook")
    addresses = await webhook.resolve(target.host, target.port)
    assert addresses == [ipaddress.ip_address("127.0.0.1")]
    with pytest.raises(webhook.TargetRefused):
        await webhook.checked_addresses(target, allow_private=False)
    assert await webhook.checked_addresses(target, allow_private=True) == addresses
    assert await webhook.creation_refusal(f"http://{host}:8080/hook", allow_private=False) is not None


async def test_ipv6_literals_are_judged_too() -> None:
    for url in ("http://[::1]:9/x", "https://[::ffff:127.0.0.1]/x", "http://[fe80::1]/"):
        assert await webhook.creation_refusal(url, allow_private=False) is not None, url
    assert await webhook.creation_refusal("http://[::1]:9/x", allow_private=True) is None


async def test_a_name_that_does_not_resolve_is_accepted_at_creation() -> None:
    assert await webhook.creation_refusal("https://no-such-host.invalid/hook", allow_private=False) is None


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/x",
        "file:///etc/passwd",
        "gopher://example.com",
        "javascript:alert(1)",
        "example.com/x",
        "http://",
        "https://user:pw@example.com/",
        "http://example.com:99999/",
    ],
)
def test_urls_that_are_not_http_s_with_a_host_are_refused(url: str) -> None:
    with pytest.raises(targets.TargetError):
        targets.parse_target(url)
    problems = domain.validate_rule([Channel.WEBHOOK], [WebhookRecipient(url=url)])
    assert [p.field for p in problems] == ["recipients.0.url"]


def test_the_connection_goes_to_the_checked_address_with_the_name_in_the_host_header() -> None:
    target = targets.parse_target("https://Hooks.Example.com/a/b?x=1#frag")
    assert (target.scheme, target.host, target.port, target.host_header) == (
        "https",
        "hooks.example.com",
        443,
        "hooks.example.com",
    )
    assert target.url_for(ipaddress.ip_address("93.184.215.14")) == "https://93.184.215.14:443/a/b?x=1"
    v6 = targets.parse_target("http://[2606:4700::1]:8080/h")
    assert v6.host_header == "[2606:4700::1]:8080"
    assert v6.url_for(ipaddress.ip_address("2606:4700::1")) == "http://[2606:4700::1]:8080/h"


def test_webhook_rules_need_a_url_and_a_url_needs_the_webhook_channel() -> None:
    hook = WebhookRecipient(url="https://hooks.example.com/x")
    assert domain.validate_rule([Channel.WEBHOOK], [hook]) == []
    assert [p.field for p in domain.validate_rule([Channel.WEBHOOK], [])] == ["recipients"]
    assert [p.field for p in domain.validate_rule([Channel.IN_SITE], [hook])] == ["channels"]
    planned = domain.plan_deliveries(ACCOUNT, [Channel.WEBHOOK], [hook, hook])
    assert planned == [domain.PlannedDelivery(Channel.WEBHOOK, "url:https://hooks.example.com/x")]
    assert domain.address_of(planned[0].recipient) == "https://hooks.example.com/x"


def test_the_signature_is_an_hmac_of_timestamp_dot_body_and_verifies() -> None:
    body, secret = b'{"a":1}', "whsec_test"
    header = webhook.signature(secret, 1700000000, body)
    mac = hmac.new(secret.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
    assert header == f"t=1700000000,v1={mac}"
    assert webhook.verify(secret, header, body)
    assert not webhook.verify(secret, header, body + b" ")
    assert not webhook.verify("whsec_other", header, body)
    assert not webhook.verify(secret, "garbage", body)
    assert not webhook.verify(secret, header[:-1] + "\xe9", body)  # not ASCII: refused, not a TypeError
    assert webhook.new_secret() != webhook.new_secret() and len(webhook.new_secret()) > 40


def test_the_backoff_doubles_up_to_its_cap() -> None:
    backoff = webhook.Backoff(initial_seconds=30, max_seconds=3600, window_seconds=86400)
    assert [backoff.delay(n, 0) for n in (1, 2, 3, 4)] == [30, 60, 120, 240]
    assert backoff.delay(20, 0) == 3600
    assert 30 <= backoff.delay(1, 0.99) <= 33
