"""A Slack or Teams incoming-webhook URL is itself a credential (whoever has it posts to the
channel): a failed attempt's error, which goes to the delivery log and, once the delivery fails
for good, to the process's log line, names the URL's host, never its path."""

import socket
import uuid
from datetime import UTC, datetime

import pytest

from services.alerts import webhook

SLACK_URL = "https://hooks.slack.com/services/T0AAAAAAA/B0BBBBBBB/XXXXsecretXXXXsecretXXXX"


async def test_a_name_that_does_not_resolve_is_named_by_its_host_not_its_url(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_address(host: str, port: int) -> list[object]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(webhook, "resolve", no_address)
    sender = webhook.WebhookSender(allow_private=False)
    try:
        request = webhook.WebhookRequest(SLACK_URL, None, uuid.uuid4(), 1, b"{}", https_only=True, ok_body="ok")
        result = await sender.attempt(request, datetime.now(UTC))
    finally:
        await sender.close()
    assert result.error is not None
    assert "hooks.slack.com" in result.error
    assert "secret" not in result.error and "/services/" not in result.error
