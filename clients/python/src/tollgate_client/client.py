"""Tollgate for a platform service, sync (`Tollgate`) and async (`AsyncTollgate`), on httpx.

Both take the service's token (`st-...`: scope `keys:verify` to verify, `usage:write` to report and
reserve) and expose the same four calls: verify, report, reserve, release. The request each call
makes and how its answer is read are written once, below; the two classes only send."""

import asyncio
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Self
from uuid import UUID

import httpx

from tollgate_client.errors import TollgateError, TollgateUnavailable, error_of
from tollgate_client.retry import Retry, retryable_error, retryable_status
from tollgate_client.types import ReportResult, Usage, UsageEvent, Verdict

log = logging.getLogger("tollgate_client")
MAX_BATCH = 1000  # POST /api/usage/events takes 1..1000 events


@dataclass(frozen=True)
class _Call:
    method: str
    path: str
    json: dict[str, Any] | None
    idempotent: bool  # may be repeated after a lost answer without counting twice
    missing_ok: bool = False  # a 404 is an answer, not an error (a release)


def _verify_call(
    key: str,
    method: str,
    path: str,
    ip: str,
    user_agent: str,
    resource: str | None,
    cost: int,
    permission: str | None,
    model: str | None,
) -> _Call:
    body: dict[str, Any] = {"key": key, "method": method, "path": path, "ip": ip, "user_agent": user_agent[:512]}
    optional = {"resource": resource, "cost": cost or None, "permission": permission, "model": model}
    body.update({name: value for name, value in optional.items() if value is not None})
    return _Call("POST", "/api/edge/verify", body, idempotent=False)


def _report_call(batch: Sequence[UsageEvent], source: str) -> _Call:
    return _Call("POST", "/api/usage/events", {"events": [event.to_json(source) for event in batch]}, idempotent=True)


def _reserve_call(hold: "_Hold") -> _Call:
    body: dict[str, Any] = {
        "account_id": str(hold.account_id),
        "resource": hold.resource,
        "amount": hold.amount,
        "ttl_seconds": hold.ttl,
    }
    if hold.api_key_id is not None:  # the hold must also fit the key's own limits (v4)
        body["api_key_id"] = str(hold.api_key_id)
    return _Call("POST", "/api/quota/reservations", body, idempotent=False)


def _release_call(reservation_id: UUID) -> _Call:
    return _Call("DELETE", f"/api/quota/reservations/{reservation_id}", None, idempotent=True, missing_ok=True)


def _batches(events: Iterable[UsageEvent], size: int) -> Iterator[list[UsageEvent]]:
    batch: list[UsageEvent] = []
    for event in events:
        batch.append(event)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _body(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _outcome(call: _Call, response: httpx.Response) -> httpx.Response:
    """The answer, or the contract's error raised."""
    if response.is_success or (call.missing_ok and response.status_code == 404):
        return response
    raise error_of(response.status_code, _body(response), dict(response.headers))


class _Settings:
    def __init__(self, base_url: str, token: str, source: str, timeout: float, retry: Retry, batch_size: int) -> None:
        if not 1 <= batch_size <= MAX_BATCH:
            raise ValueError(f"batch_size must be 1..{MAX_BATCH}")
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}", "User-Agent": "tollgate-client/0.1"}
        self.source = source
        self.timeout = timeout
        self.retry = retry
        self.batch_size = batch_size


class AsyncTollgate:
    """`async with AsyncTollgate(url, token, source="ai-gateway") as tollgate: ...`"""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        source: str = "platform-service",
        timeout: float = 10.0,
        retry: Retry | None = None,
        batch_size: int = MAX_BATCH,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._settings = _Settings(base_url, token, source, timeout, retry or Retry(), batch_size)
        self._http = httpx.AsyncClient(
            base_url=self._settings.base_url, headers=self._settings.headers, timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def verify(
        self,
        key: str,
        *,
        method: str,
        path: str,
        ip: str,
        user_agent: str = "",
        resource: str | None = None,
        cost: int = 0,
        permission: str | None = None,
        model: str | None = None,
    ) -> Verdict:
        """Tollgate's decision for a call this service received (`valid` or the refusal to pass on).
        A valid verdict is an admitted, metered call. `path` is the route template."""
        call = _verify_call(key, method, path, ip, user_agent, resource, cost, permission, model)
        return Verdict.from_json((await self._send(call)).json())

    async def report(self, events: Iterable[UsageEvent]) -> ReportResult:
        """Reports usage in batches of `batch_size`, each retried with the same event ids.
        Raises on a batch refused for good; re-sending the same events then counts none twice."""
        accepted = duplicates = 0
        for batch in _batches(events, self._settings.batch_size):
            answer = (await self._send(_report_call(batch, self._settings.source))).json()
            accepted += int(answer["accepted"])
            duplicates += int(answer["duplicates"])
        return ReportResult(accepted, duplicates)

    def reserve(
        self, account_id: UUID, resource: str, amount: int, ttl: int = 300, *, api_key_id: UUID | None = None
    ) -> "AsyncReservation":
        """`async with tollgate.reserve(...) as hold: ...; hold.settle(actual)`: holds `amount` for
        `ttl` seconds; settles with what `settle` said, or releases the hold if nothing was settled
        (an exception before `settle`, or nothing used). Refused: `InsufficientQuota`. With
        `api_key_id` (the verdict's) the hold must fit the key's own limits as well as the
        account's quota, and its settlement is counted against the key."""
        return AsyncReservation(self, account_id, resource, amount, ttl, api_key_id)

    async def release(self, reservation_id: UUID) -> bool:
        """Releases a hold early; False: it was no longer open (settled, expired or unknown)."""
        return (await self._send(_release_call(reservation_id))).status_code == 204

    async def _open(self, hold: "_Hold") -> tuple[UUID, datetime]:
        made = (await self._send(_reserve_call(hold))).json()
        return UUID(made["id"]), datetime.fromisoformat(made["expires_at"])

    async def _send(self, call: _Call) -> httpx.Response:
        retry = self._settings.retry
        for attempt in range(retry.attempts):
            last = attempt == retry.attempts - 1
            try:
                response = await self._http.request(call.method, call.path, json=call.json)
            except httpx.TransportError as error:
                if last or not retryable_error(error, call.idempotent):
                    raise TollgateUnavailable(f"{call.method} {call.path}: {error!r}") from error
                await asyncio.sleep(retry.delay(attempt, None))
                continue
            if last or not retryable_status(response.status_code, call.idempotent):
                return _outcome(call, response)
            await asyncio.sleep(retry.delay(attempt, response))
        raise AssertionError("unreachable: the last attempt returns or raises")


class Tollgate:
    """The same calls as `AsyncTollgate`, blocking: `with Tollgate(url, token) as tollgate: ...`"""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        source: str = "platform-service",
        timeout: float = 10.0,
        retry: Retry | None = None,
        batch_size: int = MAX_BATCH,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._settings = _Settings(base_url, token, source, timeout, retry or Retry(), batch_size)
        self._http = httpx.Client(
            base_url=self._settings.base_url, headers=self._settings.headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def verify(
        self,
        key: str,
        *,
        method: str,
        path: str,
        ip: str,
        user_agent: str = "",
        resource: str | None = None,
        cost: int = 0,
        permission: str | None = None,
        model: str | None = None,
    ) -> Verdict:
        call = _verify_call(key, method, path, ip, user_agent, resource, cost, permission, model)
        return Verdict.from_json(self._send(call).json())

    def report(self, events: Iterable[UsageEvent]) -> ReportResult:
        accepted = duplicates = 0
        for batch in _batches(events, self._settings.batch_size):
            answer = self._send(_report_call(batch, self._settings.source)).json()
            accepted += int(answer["accepted"])
            duplicates += int(answer["duplicates"])
        return ReportResult(accepted, duplicates)

    def reserve(
        self, account_id: UUID, resource: str, amount: int, ttl: int = 300, *, api_key_id: UUID | None = None
    ) -> "Reservation":
        return Reservation(self, account_id, resource, amount, ttl, api_key_id)

    def release(self, reservation_id: UUID) -> bool:
        return self._send(_release_call(reservation_id)).status_code == 204

    def _open(self, hold: "_Hold") -> tuple[UUID, datetime]:
        made = self._send(_reserve_call(hold)).json()
        return UUID(made["id"]), datetime.fromisoformat(made["expires_at"])

    def _send(self, call: _Call) -> httpx.Response:
        retry = self._settings.retry
        for attempt in range(retry.attempts):
            last = attempt == retry.attempts - 1
            try:
                response = self._http.request(call.method, call.path, json=call.json)
            except httpx.TransportError as error:
                if last or not retryable_error(error, call.idempotent):
                    raise TollgateUnavailable(f"{call.method} {call.path}: {error!r}") from error
                time.sleep(retry.delay(attempt, None))
                continue
            if last or not retryable_status(response.status_code, call.idempotent):
                return _outcome(call, response)
            time.sleep(retry.delay(attempt, response))
        raise AssertionError("unreachable: the last attempt returns or raises")


class _Hold:
    """What both reservations share: the hold's identity and what it settles with."""

    def __init__(self, account_id: UUID, resource: str, amount: int, ttl: int, api_key_id: UUID | None) -> None:
        self.account_id, self.resource, self.amount, self.ttl = account_id, resource, amount, ttl
        self.api_key_id = api_key_id  # the key whose call this is: its limits are judged and counted too
        self._id: UUID | None = None
        self.expires_at: datetime | None = None
        self._usage: Usage | None = None

    @property
    def id(self) -> UUID:
        if self._id is None:
            raise RuntimeError("the reservation is made on entering its `with` block")
        return self._id

    def settle(
        self,
        quantity: int,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        provider: str | None = None,
        model: str | None = None,
        api_key_id: UUID | None = None,
    ) -> None:
        """What was actually used; reported, carrying this reservation's id, when the block ends
        (even by an exception: it was used). Called again, the last call wins. `api_key_id`
        defaults to the reservation's: the usage is counted against the key it was held for."""
        key = api_key_id or self.api_key_id
        self._usage = Usage(quantity, provider, model, input_tokens, output_tokens, key)

    def _settling_event(self) -> UsageEvent | None:
        usage = self._usage
        if usage is None:
            return None
        return UsageEvent(
            account_id=self.account_id,
            resource=self.resource,
            quantity=usage.quantity,
            provider=usage.provider,
            model=usage.model,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            api_key_id=usage.api_key_id,
            reservation_id=self.id,
        )


def _log_unreleased(hold: _Hold, error: TollgateError) -> None:
    log.warning("reservation %s not released (%s); Tollgate releases it at %s", hold.id, error, hold.expires_at)


class AsyncReservation(_Hold):
    def __init__(
        self, tollgate: AsyncTollgate, account_id: UUID, resource: str, amount: int, ttl: int, api_key_id: UUID | None = None
    ) -> None:
        super().__init__(account_id, resource, amount, ttl, api_key_id)
        self._tollgate = tollgate

    async def __aenter__(self) -> Self:
        self._id, self.expires_at = await self._tollgate._open(self)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        # Shielded: a cancelled task (a client that hung up mid-stream) still settles or releases.
        event = self._settling_event()
        if event is not None:
            try:
                await asyncio.shield(self._tollgate.report([event]))
                return
            except TollgateError:
                # Refused (e.g. token counts that do not add up), or not known to be taken: the hold
                # would stay until its ttl. Released; a settlement that did land makes this a no-op.
                await asyncio.shield(self._release_quietly())
                raise
        try:
            await asyncio.shield(self._tollgate.release(self.id))
        except TollgateError as error:
            if exc is None:
                raise
            _log_unreleased(self, error)  # the block's own exception is the one to see

    async def _release_quietly(self) -> None:
        try:
            await self._tollgate.release(self.id)
        except TollgateError as error:
            _log_unreleased(self, error)


class Reservation(_Hold):
    def __init__(
        self, tollgate: Tollgate, account_id: UUID, resource: str, amount: int, ttl: int, api_key_id: UUID | None = None
    ) -> None:
        super().__init__(account_id, resource, amount, ttl, api_key_id)
        self._tollgate = tollgate

    def __enter__(self) -> Self:
        self._id, self.expires_at = self._tollgate._open(self)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        event = self._settling_event()
        if event is not None:
            try:
                self._tollgate.report([event])
                return
            except TollgateError:
                self._release_quietly()  # as AsyncReservation's
                raise
        try:
            self._tollgate.release(self.id)
        except TollgateError as error:
            if exc is None:
                raise
            _log_unreleased(self, error)

    def _release_quietly(self) -> None:
        try:
            self._tollgate.release(self.id)
        except TollgateError as error:
            _log_unreleased(self, error)
