"""A webhook's name is resolved by the system resolver, in a thread (getaddrinfo blocks). A name
whose DNS never answers holds that thread for the resolver's own timeout, long after the attempt
(or the rule's creation) gave up at 5 s: on the event loop's default executor, a customer creating
rules with such names (a key with alerts:write may) would hold every thread the process's other
work needs (argon2 for sign-ins, ClickHouse reads for analytics). Webhook names are resolved on
threads of their own."""

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from services.alerts import webhook

HUNG = "never-answers.example"


@pytest.fixture
def hung_resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    release = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == HUNG:
            release.wait(30)  # a resolver waiting for an answer that never comes
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(webhook, "ATTEMPT_TIMEOUT_SECONDS", 0.2)
    yield release
    release.set()


async def test_names_that_never_resolve_hold_none_of_the_threads_other_work_needs(hung_resolver: threading.Event) -> None:
    refusals = await asyncio.gather(*(webhook.creation_refusal(f"https://{HUNG}/hook", False) for _ in range(40)))
    assert refusals == [None] * 40  # not resolvable now: accepted, as before (deliveries retry)
    # The default executor (asyncio.to_thread: argon2, ClickHouse) still has a thread at once.
    assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), timeout=2) == "free"

    hung_resolver.set()  # the answers come (as errors): the webhook threads are free again
    assert await webhook.creation_refusal("http://127.0.0.1/hook", False) is not None  # judged again
