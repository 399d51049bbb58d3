"""The webhook channel: a signed JSON POST to the rule's URL, one attempt per call. (v4) The
`slack` and `teams` channels post through here too: another body, unsigned, https only.

The address rule (services/alerts/targets.py) is applied where the connection is made: the name
is resolved once, every address it gives is checked, and the request goes to that checked
address (the Host header and TLS SNI carry the name). A DNS answer that changes between the check
and the connection therefore cannot steer a delivery into the platform's own network.
"""

import asyncio
import functools
import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from services.alerts import domain, targets

ATTEMPT_TIMEOUT_SECONDS = 5.0  # resolving, then the exchange (connecting, sending, the answer) each
ANSWER_READ_BYTES = 4096  # of a receiver's answer: enough for its status and an error's first words
SIGNATURE_HEADER = "Tollgate-Signature"
USER_AGENT = "Tollgate-Webhooks/1"

log = logging.getLogger(__name__)


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """`t=<unix>,v1=<hex HMAC-SHA256 of "t.body">` (API.md, "Alerts")."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: str, header: str, body: bytes) -> bool:
    """What a receiver does (docs/alerts.md shows the same in a few lines); used by the tests."""
    if not header.isascii():  # never a genuine signature; hmac.compare_digest would raise TypeError
        return False
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        expected = signature(secret, int(fields["t"]), body)
    except (KeyError, ValueError):
        return False
    return hmac.compare_digest(expected, header)


def payload(delivery_id: Any, rule_id: Any, account_id: Any, fired_at: datetime, message: domain.AlertMessage) -> bytes:
    """The alert as JSON; the same bytes on every attempt of a delivery (only the signature's
    timestamp changes), so a receiver can drop a repeat by `id`."""
    body = {
        "id": str(delivery_id),
        "type": "usage.alert",
        "time": fired_at.isoformat(),
        "account_id": str(account_id),
        "rule_id": str(rule_id),
        "metric": message.metric.value,
        "resource": message.resource.value,
        "threshold_pct": message.threshold_pct,
        "used": message.used,
        "total": message.total,
        "usage_pct": str(message.usage_pct),
        "period": message.period,
        # (v4) the key whose own limit was crossed (`period` is then the limit's window), else null
        "scope": (
            {
                "api_key_id": str(message.key.api_key_id),
                "masked_key": message.key.masked_key,
                "limit_period": message.key.limit_period.value if message.key.limit_period else None,
            }
            if message.key
            else None
        ),
        "title": message.title,
        "message": message.summary(),
        "links": {"upgrade_plan": message.links.upgrade_plan, "buy_quota_package": message.links.buy_quota_package},
    }
    return json.dumps(body, separators=(",", ":")).encode()


# ---- resolving and checking ---------------------------------------------------------------------
class TargetRefused(Exception):
    """The URL's host resolves to an address webhooks may not reach (or does not resolve)."""


# getaddrinfo blocks: it runs in a thread, which a name whose DNS never answers holds for the
# resolver's own timeout, long after the attempt (or the rule's creation) gave up. On the loop's
# default executor, names chosen by customers could hold every thread the process's other work
# needs (argon2 for sign-ins, ClickHouse reads, connecting to Postgres); webhook names are resolved
# on threads of their own. When all of them are held, a resolution waits its turn within the
# attempt's timeout, then fails like a name that does not resolve (logged, retried later).
RESOLVER_THREADS = 8
_RESOLVER = ThreadPoolExecutor(max_workers=RESOLVER_THREADS, thread_name_prefix="webhook-dns")


async def resolve(host: str, port: int) -> list[targets.IPAddress]:
    """The addresses the system resolver gives for `host` (numbers in any form it accepts too)."""
    lookup = functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    infos = await asyncio.get_running_loop().run_in_executor(_RESOLVER, lookup)
    return list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos))


async def checked_addresses(target: targets.Target, allow_private: bool) -> list[targets.IPAddress]:
    """Resolve once and check; raises TargetRefused (or OSError when the name does not resolve)."""
    addresses = await resolve(target.host, target.port)
    if not addresses:
        raise TargetRefused(f"{target.host} has no address")
    reason = None if allow_private else targets.refusal_of_all(addresses)
    if reason is not None:
        raise TargetRefused(f"{target.host} refused: {reason}")
    return addresses


def scheme_refusal(target: targets.Target, https_only: bool, allow_private: bool) -> str | None:
    """Slack and Teams URLs are https; plain http is for local receivers, as the operator
    setting that allows private targets says."""
    if https_only and target.scheme != "https" and not allow_private:
        return "the URL must be https"
    return None


# ---- one attempt --------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttemptResult:
    status_code: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class WebhookRequest:
    url: str
    secret: str | None = field(repr=False)  # never in a log line; None: unsigned (Slack, Teams)
    delivery_id: Any
    attempt: int
    body: bytes
    https_only: bool = False
    ok_body: str | None = None  # the body a success must carry too (Slack answers "ok")


class WebhookSender:
    def __init__(
        self, allow_private: bool, client: httpx.AsyncClient | None = None, timeout_seconds: float = ATTEMPT_TIMEOUT_SECONDS
    ) -> None:
        self._allow_private = allow_private
        self._timeout = timeout_seconds
        # No proxies from the environment (they would connect elsewhere), no redirects followed.
        self._client = client or httpx.AsyncClient(timeout=timeout_seconds, follow_redirects=False, trust_env=False)

    async def close(self) -> None:
        await self._client.aclose()

    async def attempt(self, request: WebhookRequest, now: datetime) -> AttemptResult:
        """One attempt's outcome, its error as the delivery log (Postgres text) can hold it: a NUL
        there (a receiver's answer may hold one) would fail the log's write, and with it the
        attempt's record: the delivery left pending, unlogged, tried again at every sweep."""
        result = await self._attempt(request, now)
        if result.error is not None and "\x00" in result.error:
            return AttemptResult(result.status_code, result.error.replace("\x00", "\ufffd"))
        return result

    async def _attempt(self, request: WebhookRequest, now: datetime) -> AttemptResult:
        try:
            target = targets.parse_target(request.url)
            refused = scheme_refusal(target, request.https_only, self._allow_private)
            if refused is not None:
                raise TargetRefused(refused)
            async with asyncio.timeout(ATTEMPT_TIMEOUT_SECONDS):
                addresses = await checked_addresses(target, self._allow_private)
        except (targets.TargetError, TargetRefused) as exc:
            return AttemptResult(None, f"target refused: {exc}")
        except OSError as exc:
            # the host only: a Slack or Teams URL's path and query are its credential
            return AttemptResult(None, f"cannot resolve {target.host}: {exc}")
        headers = {
            "Host": target.host_header,
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "Tollgate-Delivery": str(request.delivery_id),
            "Tollgate-Attempt": str(request.attempt),
            "Accept-Encoding": "identity",  # only the head of the answer is read (_head_of): nothing to inflate
        }
        if request.secret is not None:
            headers[SIGNATURE_HEADER] = signature(request.secret, int(now.timestamp()), request.body)
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        # One deadline for the whole exchange: httpx's timeout bounds each read, so a receiver that
        # drips its answer a byte at a time would otherwise hold this attempt (its row lock, a pooled
        # connection and a dispatcher slot every account's alerts share) for as long as it liked.
        try:
            async with asyncio.timeout(self._timeout):
                return await self._post(request, target, addresses, headers, extensions)
        except TimeoutError:
            return AttemptResult(None, f"no complete answer within {self._timeout} s")
        except Exception as exc:
            # The receiver is the customer's: nothing it does may escape as an exception, which
            # would leave the delivery pending with no attempt logged, posted again at every sweep
            # (past its retry window, for ever). A failed attempt is logged and retried with backoff.
            log.exception("webhook attempt of delivery %s failed unexpectedly", request.delivery_id)
            return AttemptResult(None, f"the attempt failed: {type(exc).__name__}")

    async def _post(
        self,
        request: WebhookRequest,
        target: targets.Target,
        addresses: list[targets.IPAddress],
        headers: dict[str, str],
        extensions: dict[str, Any],
    ) -> AttemptResult:
        errors: list[str] = []
        for address in addresses:  # only checked ones; the next when one refuses the connection
            try:
                async with self._client.stream(
                    "POST", target.url_for(address), content=request.body, headers=headers, extensions=extensions
                ) as response:
                    # Only the head of the answer is read: an endless one must not fill memory.
                    answer = (await _head_of(response)).strip()[:200]  # Slack's errors name themselves
                break
            except httpx.ConnectError as exc:
                errors.append(f"cannot connect to {address}: {exc}")
            except httpx.HTTPError as exc:
                return AttemptResult(None, f"{type(exc).__name__} at {address}: {exc}"[:1000])
        else:
            return AttemptResult(None, "; ".join(errors)[:1000])
        if response.is_success and request.ok_body in (None, answer):
            return AttemptResult(response.status_code, None)
        error = f"receiver answered {response.status_code}" + (f": {answer}" if answer else "")
        return AttemptResult(response.status_code, error)


async def _head_of(response: httpx.Response) -> str:
    """The first ANSWER_READ_BYTES of the answer's body as it came, text-decoded (the rest is never
    read). Never inflated: a receiver that compresses anyway (we ask for `identity`) would turn the
    first read into ~1000 times its size (a gzip bomb), of which 4 KiB are kept."""
    head = b""
    async for chunk in response.aiter_raw():
        head += chunk
        if len(head) >= ANSWER_READ_BYTES:
            break
    return _text_of(head[:ANSWER_READ_BYTES], response.encoding)


def _text_of(head: bytes, charset: str | None) -> str:
    """The answer's head as text in the charset its receiver named, or UTF-8 when that is no text
    encoding (`zlib`, `hex`, `base64`... are codecs Python knows: bytes.decode raises LookupError)
    or cannot replace what it cannot decode (`idna`): an exception here would leave the delivery
    pending with no attempt logged, posted again at every sweep, past its retry window."""
    try:
        return head.decode(charset or "utf-8", errors="replace")
    except (LookupError, UnicodeError):
        return head.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Backoff:
    """Delays between attempts: initial, doubling, capped; attempts stop after `window_seconds`
    from the delivery's creation (24 h in production; the tests make it all fast)."""

    initial_seconds: float = 30.0
    max_seconds: float = 3600.0
    window_seconds: float = 24 * 3600.0

    def delay(self, attempt: int, jitter: float) -> float:
        """After the `attempt`-th failure; `jitter` in [0, 1) spreads retries of many deliveries."""
        base = min(self.max_seconds, self.initial_seconds * 2.0 ** max(0, attempt - 1))
        return float(base * (1 + 0.1 * jitter))


DEFAULT_BACKOFF = Backoff()


async def creation_refusal(url: str, allow_private: bool, https_only: bool = False) -> str | None:
    """Why a rule may not name `url` (plain http where https is needed, or its host resolves to a
    refused address), or None. A name that does not resolve now is accepted: its deliveries fail,
    and are logged, until it does."""
    target = targets.parse_target(url)
    scheme = scheme_refusal(target, https_only, allow_private)
    if scheme is not None or allow_private:
        return scheme
    try:
        async with asyncio.timeout(ATTEMPT_TIMEOUT_SECONDS):
            await checked_addresses(target, allow_private=False)
    except TargetRefused as exc:
        return str(exc)
    except (OSError, TimeoutError):
        return None
    return None
