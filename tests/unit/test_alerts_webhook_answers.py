"""Whatever a customer's webhook URL and its receiver's answer hold (an internationalised host name,
a charset that is no text encoding), an attempt ends in a result (sent, or an error the delivery
log shows), never in an exception. An exception would leave the delivery pending with no attempt
recorded, so the sweeper would post to that URL again at every sweep, past the retry window and
for ever, and the log would show nothing."""

import ipaddress
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest

from services.alerts import targets, webhook

# Codecs Python knows that are not text encodings (bytes.decode raises LookupError), and one whose
# decoder has no "replace" error handling (UnicodeError).
NOT_TEXT = ["zlib", "hex", "base64", "bz2", "rot13", "uu", "idna"]


def _sender(status: int, charset: str) -> webhook.WebhookSender:
    def handle(request: httpx.Request) -> httpx.Response:
        async def streamed() -> AsyncIterator[bytes]:
            yield b"\xffno such thing here"

        return httpx.Response(status, headers={"Content-Type": f"text/plain; charset={charset}"}, content=streamed())

    return webhook.WebhookSender(True, client=httpx.AsyncClient(transport=httpx.MockTransport(handle)))


def _request() -> webhook.WebhookRequest:
    return webhook.WebhookRequest("http://127.0.0.1:9/hook", "whsec_x", "d-1", 1, b"{}")


@pytest.mark.parametrize("charset", NOT_TEXT)
async def test_an_answer_in_a_charset_that_is_no_text_encoding_still_ends_the_attempt(charset: str) -> None:
    failing = _sender(500, charset)
    result = await failing.attempt(_request(), datetime.now(UTC))
    await failing.close()
    assert result.status_code == 500
    assert result.error is not None and result.error.startswith("receiver answered 500: ")
    assert result.error.endswith("no such thing here")  # read as UTF-8 (replacing what is not)

    fine = _sender(200, charset)
    result = await fine.attempt(_request(), datetime.now(UTC))
    await fine.close()
    assert (result.status_code, result.error) == (200, None)


async def test_an_internationalised_host_is_sent_as_its_ascii_name(monkeypatch: pytest.MonkeyPatch) -> None:
    async def resolve(host: str, port: int) -> list[targets.IPAddress]:
        assert host == "xn--bcher-kva.example"  # what DNS is asked
        return [ipaddress.ip_address("93.184.216.34")]  # a global address: allowed

    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)

        async def streamed() -> AsyncIterator[bytes]:
            yield b""

        return httpx.Response(204, content=streamed())

    monkeypatch.setattr(webhook, "resolve", resolve)
    sender = webhook.WebhookSender(False, client=httpx.AsyncClient(transport=httpx.MockTransport(handle)))
    for url in ("https://bücher.example/hook", "https://BÜCHER.example:8443/hook"):
        result = await sender.attempt(webhook.WebhookRequest(url, "whsec_x", "d-1", 1, b"{}"), datetime.now(UTC))
        assert (result.status_code, result.error) == (204, None)
    await sender.close()
    assert [r.headers["host"] for r in seen] == ["xn--bcher-kva.example", "xn--bcher-kva.example:8443"]
    assert seen[0].extensions["sni_hostname"] == "xn--bcher-kva.example"
    with pytest.raises(targets.TargetError):  # a label no DNS name may have: refused as a URL (422 at creation)
        targets.parse_target("https://" + "ü" * 64 + ".example/hook")


async def test_any_failure_of_the_exchange_ends_the_attempt_as_an_error() -> None:
    """Beyond the cases above: whatever breaks while the request is written or the answer read is
    a failed attempt (logged, retried with backoff), not an exception out of the sender."""

    def handle(request: httpx.Request) -> httpx.Response:
        raise RuntimeError("something no one foresaw")

    sender = webhook.WebhookSender(True, client=httpx.AsyncClient(transport=httpx.MockTransport(handle)))
    result = await sender.attempt(_request(), datetime.now(UTC))
    await sender.close()
    assert (result.status_code, result.error) == (None, "the attempt failed: RuntimeError")


@pytest.mark.parametrize("host", ["a" * 64 + ".example", "a..example", "ü" * 64 + ".example"])
async def test_a_name_no_resolver_takes_is_refused_as_a_url_not_raised_from_the_resolver(host: str) -> None:
    """The resolver encodes a name (IDNA) before it asks DNS and raises UnicodeError for a label over
    63 characters or an empty one: that was a 500 at the rule's creation and an exception out of
    every attempt. The URL's own check refuses such a name first (422 at creation)."""
    url = f"https://{host}/hook"
    with pytest.raises(targets.TargetError):
        targets.parse_target(url)
    sender = webhook.WebhookSender(False)
    result = await sender.attempt(webhook.WebhookRequest(url, "whsec_x", "d-1", 1, b"{}"), datetime.now(UTC))
    await sender.close()
    assert result.status_code is None and (result.error or "").startswith("target refused: ")


async def test_a_nul_in_the_answer_is_not_in_the_error_the_log_keeps() -> None:
    """Postgres text cannot hold a NUL: an error holding one would fail the delivery log's write."""

    def handle(request: httpx.Request) -> httpx.Response:
        async def streamed() -> AsyncIterator[bytes]:
            yield b"not\x00today"

        return httpx.Response(500, content=streamed())

    sender = webhook.WebhookSender(True, client=httpx.AsyncClient(transport=httpx.MockTransport(handle)))
    result = await sender.attempt(_request(), datetime.now(UTC))
    await sender.close()
    assert (result.status_code, result.error) == (500, "receiver answered 500: not\ufffdtoday")
