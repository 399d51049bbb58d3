"""The calls.v1 lanes (pure bookkeeping), the producer's retry, and what the edge puts in them
over HTTP: admitted calls on a reserved place (503 `overloaded` when there is none), refused
calls of a known key in their own lane with their error code, folded when that lane is full."""

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import pytest
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from contracts.common import Permission, Role
from contracts.credentials import hash_secret
from contracts.errors import ErrorCode
from contracts.events import KeyState
from services.edge.calls import Call, CallLanes, CallRecorder
from services.edge.edge import Edge
from services.edge.errors import ApiError, install_error_handlers
from services.edge.middleware import RequestMiddleware
from services.edge.principal import Principal
from services.runtime.platform.settings import Settings

T = datetime(2026, 11, 23, 9, 0, 0, tzinfo=UTC)


def settings() -> Settings:
    return Settings(kafka_bootstrap_servers="127.0.0.1:1", database_url="postgresql://u@h/d", session_secret="s")


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def call(key: uuid.UUID | None = None, *, at: datetime = T, code: str | None = None, status: int = 200) -> Call:
    return Call(at, uuid.uuid4(), key or uuid.uuid4(), "GET", "/api/x", status, "127.0.0.1", "ua", 1.0, code)


# ---- the lanes, pure -------------------------------------------------------------------------
def test_the_admitted_lane_refuses_a_reservation_when_full_and_frees_places_only_when_sent():
    lanes = CallLanes(admitted_capacity=3)
    assert [lanes.reserve() for _ in range(4)] == [True, True, True, False]
    held = [call() for _ in range(3)]
    for c in held:
        lanes.admit(c)
    taken = lanes.take(2)
    assert taken == held[:2] and not lanes.reserve()  # taken is not sent: still holds its place
    lanes.sent(taken)
    assert lanes.open == 1 and lanes.reserve() and lanes.reserve() and not lanes.reserve()
    lanes.release()  # a reserved call that was not recorded
    assert lanes.reserve() and not lanes.reserve()


def test_a_flood_of_refused_calls_never_takes_an_admitted_place_and_is_folded_with_every_count_kept():
    lanes = CallLanes(admitted_capacity=2, refused_capacity=5)
    folded_before = metric("tollgate_edge_refused_calls_folded_total")
    flooder, other = uuid.uuid4(), uuid.uuid4()
    refused = [call(flooder, at=T + timedelta(milliseconds=7 * n), code="rate_limited", status=429) for n in range(1000)]
    refused += [call(flooder, at=T, code="api_key_disabled", status=401) for _ in range(40)]
    refused += [call(other, at=T, code="permission_denied", status=403) for _ in range(3)]
    for c in refused:
        lanes.refuse(c)
    assert lanes.reserve() and lanes.reserve()  # the admitted lane is untouched by the flood
    admitted = [call(), call()]
    for c in admitted:
        lanes.admit(c)
    first = lanes.take(3)
    assert first[:2] == admitted  # admitted first
    rest = first[2:] + lanes.take(10_000)
    assert len(lanes) == 0
    assert len(rest) == 5 + len({(c.api_key_id, c.error_code, int(c.time.timestamp())) for c in refused[5:]})
    assert sum(c.count for c in rest) == len(refused)  # nothing lost in folding
    per_code = {code: sum(c.count for c in rest if c.error_code == code) for code in ("rate_limited", "api_key_disabled")}
    assert per_code == {"rate_limited": 1000, "api_key_disabled": 40}
    assert all(not c.admitted for c in rest)
    assert metric("tollgate_edge_refused_calls_folded_total") - folded_before == len(refused) - 5
    lanes.sent(first + rest)
    assert lanes.open == 0  # refused ones never held an admitted place


def test_the_refused_lane_carries_a_bounded_number_of_calls_each_second_and_folds_the_rest():
    clock = [T.timestamp()]
    lanes = CallLanes(refused_per_second=3, clock=lambda: clock[0])
    flooder, other = uuid.uuid4(), uuid.uuid4()
    first = [call(flooder, at=T + timedelta(milliseconds=n), code="rate_limited", status=429) for n in range(10)]
    first += [call(other, at=T + timedelta(milliseconds=500), code="permission_denied", status=403) for _ in range(2)]
    second = [call(flooder, at=T + timedelta(seconds=1, milliseconds=n), code="rate_limited", status=429) for n in range(4)]
    for c in first:
        lanes.refuse(c)
    clock[0] = T.timestamp() + 1.2
    for c in second:
        lanes.refuse(c)
    sent = lanes.take(100)  # T's folds are complete; T+1's second is not over yet
    assert len(lanes) == 1 and lanes.until_folds_close() == pytest.approx(0.8)
    clock[0] = T.timestamp() + 2.01
    sent += lanes.take(100)
    assert len(lanes) == 0
    by_second = {
        s: sorted((c.api_key_id == flooder, c.error_code, c.count) for c in sent if int(c.time.timestamp()) == s)
        for s in (int(T.timestamp()), int(T.timestamp()) + 1)
    }
    # T: the first three of the flood one by one, then the flood's rest and the other key's two
    # folded per (key, code, second); T+1: a fresh allowance (three, then a fold of one).
    assert by_second[int(T.timestamp())] == [
        (False, "permission_denied", 2),
        *[(True, "rate_limited", 1)] * 3,
        (True, "rate_limited", 7),
    ]
    assert by_second[int(T.timestamp()) + 1] == [(True, "rate_limited", 1)] * 4
    assert sent[:6] == first[:3] + second[:3]  # one by one, in their order, before any fold
    assert sum(c.count for c in sent) == 16  # every call kept in a count


def test_folds_past_their_bound_are_counted_as_dropped_not_silently():
    lanes = CallLanes(refused_capacity=1, fold_capacity=2)
    before = metric("tollgate_edge_call_events_dropped_total", reason="refused_fold_full")
    for n in range(5):  # five distinct seconds: 1 queued, 2 folds, 2 dropped
        lanes.refuse(call(at=T + timedelta(seconds=n), code="rate_limited", status=429))
    assert len(lanes.take(10)) == 3
    assert metric("tollgate_edge_call_events_dropped_total", reason="refused_fold_full") - before == 2


async def until(condition: Any, *, pause: float, tries: int = 5000) -> None:
    for _ in range(tries):
        if condition():
            return
        await asyncio.sleep(pause)
    raise AssertionError("never happened")


# ---- the producer retries what Kafka did not acknowledge ----------------------------------------
class FlakyRecorder(CallRecorder):
    """`send` fails its first `failures` attempts (Kafka away), then acknowledges everything."""

    def __init__(self, failures: int, **kwargs: Any) -> None:
        super().__init__(settings(), linger_s=0, retry_s=(0.001, 0.004), **kwargs)
        self.failures = failures
        self.attempts: list[list[uuid.UUID]] = []
        self.acked: list[uuid.UUID] = []

    async def send(self, producer: Any, calls: list[Call]) -> list[Call]:
        self.attempts.append([c.event().id for c in calls])
        if self.failures:
            self.failures -= 1
            if self.failures % 2:
                return calls  # wholly unacknowledged (the first time)
            self.acked.append(calls[0].event().id)
            return calls[1:]  # partly
        self.acked += [c.event().id for c in calls]
        return []


async def test_unacknowledged_events_are_sent_again_with_their_ids_and_meanwhile_the_lane_fills_to_503():
    recorder = FlakyRecorder(failures=6, max_buffer=4)
    dropped_before = metric("tollgate_edge_call_events_dropped_total", reason="kafka_error")
    task = asyncio.create_task(recorder._run(producer=None))  # type: ignore[arg-type]
    try:
        for _ in range(4):
            assert recorder.reserve()
            recorder.record(call())
        await until(lambda: bool(recorder.attempts), pause=0)
        assert not recorder.reserve()  # Kafka away: the place of every unsent call stays taken
        await until(lambda: recorder.lanes.open == 0, pause=0.001)
    finally:
        task.cancel()
    assert len(recorder.attempts) >= 7
    assert len(recorder.acked) == len(set(recorder.acked)) == 4  # each once
    assert set(recorder.acked) <= set(recorder.attempts[0])  # with the id of its first attempt
    assert metric("tollgate_edge_call_events_dropped_total", reason="kafka_error") == dropped_before
    assert recorder.reserve()


async def test_a_fold_leaves_once_its_second_is_over_without_waiting_for_another_call():
    recorder = FlakyRecorder(failures=0)
    recorder.lanes.refused_per_second = 1
    task = asyncio.create_task(recorder._run(producer=None))  # type: ignore[arg-type]
    try:
        key, now = uuid.uuid4(), datetime.now(UTC)
        calls = [call(key, at=now, code="rate_limited", status=429) for _ in range(5)]
        for c in calls:
            recorder.refuse(c)
        await until(lambda: len(recorder.acked) == 2, pause=0.01, tries=300)  # within ~1 s
    finally:
        task.cancel()
    assert recorder.acked[0] == calls[0].id  # one by one at once
    assert recorder.acked[1] == calls[1].id and calls[1].count == 4  # the rest, folded into the first of them
    assert recorder.attempts == [[calls[0].id], [calls[1].id]]  # the open fold was not sent early


# ---- over HTTP: what the edge puts in which lane --------------------------------------------
SECRET, DISABLED, DELETED, EXPIRED, UNKNOWN = ("sk-" + c * 40 for c in "abcde")


def _app(max_buffer: int = 10_000) -> tuple[TestClient, Edge, uuid.UUID, dict[str, uuid.UUID]]:
    edge = Edge(settings())
    edge.assume_caught_up()
    edge.calls = CallRecorder(edge.settings, max_buffer=max_buffer)  # not started: nothing leaves the lanes
    account = uuid.uuid4()
    keys = {s: uuid.uuid4() for s in (SECRET, DISABLED, DELETED, EXPIRED)}
    for secret, key in keys.items():
        edge.keys.apply(
            KeyState(
                time=T,
                account_id=account,
                key_id=key,
                hash=hash_secret(secret),
                status="disabled" if secret == DISABLED else "enabled",
                expires_at=T if secret == EXPIRED else None,
                roles=[Role.VIEWER],
            )
        )
    edge.keys.remove(keys[DELETED])  # its tombstone
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(RequestMiddleware)

    @app.get("/read")
    async def read(principal: Annotated[Principal, Depends(edge.requires(Permission.PROJECTS_READ))]) -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/write")
    async def write(principal: Annotated[Principal, Depends(edge.requires(Permission.PROJECTS_WRITE))]) -> None:
        return None

    @app.get("/handler-refuses")
    async def handler_refuses(principal: Annotated[Principal, Depends(edge.requires())]) -> None:
        raise ApiError(403, ErrorCode.PERMISSION_DENIED, "No.")

    return TestClient(app), edge, account, keys


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def test_a_full_admitted_lane_answers_503_overloaded_with_the_contract_body_and_retry_after():
    client, edge, _account, _keys = _app(max_buffer=2)
    before = metric("tollgate_edge_overloaded_total")
    assert [client.get("/read", headers=_bearer(SECRET)).status_code for _ in range(2)] == [200, 200]
    r = client.get("/read", headers=_bearer(SECRET))
    assert r.status_code == 503
    assert r.headers["Retry-After"] == "1" and r.headers["X-RateLimit-Limit"]
    error = r.json()["error"]
    assert error["code"] == "overloaded" and error["message"] and error["request_id"] == r.headers["X-Request-ID"]
    assert metric("tollgate_edge_overloaded_total") - before == 1
    # the refused 503 is not recorded and holds no place; the two admitted calls are queued
    assert [c.status for c in edge.calls.lanes.take(10)] == [200, 200] and edge.calls.lanes.open == 2
    # refusals still pass and are logged while the admitted lane is full
    assert client.get("/read", headers=_bearer(DISABLED)).status_code == 401
    assert [c.error_code for c in edge.calls.lanes.take(10)] == ["api_key_disabled"]


def test_refusals_of_the_accounts_keys_are_logged_with_their_code_and_unknown_keys_are_not():
    client, edge, account, keys = _app()
    statuses = [
        client.get("/read", headers=_bearer(DISABLED)).status_code,
        client.get("/read", headers=_bearer(DELETED)).status_code,
        client.get("/read", headers=_bearer(EXPIRED)).status_code,
        client.get("/read", headers=_bearer(UNKNOWN)).status_code,
        client.get("/write", headers=_bearer(SECRET)).status_code,  # a viewer's key
        client.get("/read", headers=_bearer(SECRET)).status_code,
        client.get("/handler-refuses", headers=_bearer(SECRET)).status_code,
    ]
    assert statuses == [401, 401, 401, 401, 403, 200, 403]
    calls = edge.calls.lanes.take(100)
    got = {(c.api_key_id, c.status, c.error_code, c.admitted) for c in calls}
    assert got == {
        (keys[DISABLED], 401, "api_key_disabled", False),
        (keys[DELETED], 401, "invalid_api_key", False),
        (keys[EXPIRED], 401, "api_key_expired", False),
        (keys[SECRET], 403, "permission_denied", False),
        (keys[SECRET], 200, None, True),
        (keys[SECRET], 403, "permission_denied", True),  # refused by the handler after admission
    }
    assert len(calls) == 6 and {c.account_id for c in calls} == {account}
    codes = {c.event().error_code for c in calls if c.status != 200}
    assert codes == {"api_key_disabled", "invalid_api_key", "api_key_expired", "permission_denied"}
    edge.calls.lanes.sent(calls)
    assert edge.calls.lanes.open == 0  # every reservation was used exactly once


async def test_a_second_edge_dependency_of_one_request_does_not_leak_its_first_place():
    _client, edge, _account, _keys = _app(max_buffer=1)
    from starlette.requests import Request

    scope = {
        "type": "http", "method": "GET", "path": "/read", "raw_path": b"/read", "query_string": b"", "root_path": "",
        "scheme": "http", "server": ("t", 80), "client": ("10.0.0.5", 5000), "state": {},
        "headers": [(b"authorization", f"Bearer {SECRET}".encode())],
    }  # fmt: skip
    request = Request(scope)
    await edge.requires()(request)
    await edge.requires(Permission.PROJECTS_READ)(request)  # the same request, one place
    assert edge.calls.lanes.open == 1


# ---- under load a batch gathers longer: fewer, fuller produce requests -------------------------
def test_while_calls_keep_coming_a_batch_leaves_no_sooner_than_the_busy_linger_after_the_last():
    recorder = CallRecorder(settings(), linger_s=0.02, busy_linger_s=0.1)
    assert recorder.linger_for(5.0) == 0.02  # after a pause (a trickle): the linger alone
    assert recorder.linger_for(0.1) == 0.02
    assert recorder.linger_for(0.05) == pytest.approx(0.05)  # busy: until 100 ms after the last batch
    assert recorder.linger_for(0.0) == pytest.approx(0.1)


class CountingRecorder(CallRecorder):
    """Acknowledges everything at once and keeps each batch it was handed."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(settings(), **kwargs)
        self.batches: list[int] = []

    async def send(self, producer: Any, calls: list[Call]) -> list[Call]:
        self.batches.append(len(calls))
        return []


async def test_calls_arriving_fast_travel_in_fewer_batches_and_a_lonely_call_is_not_held_longer():
    recorder = CountingRecorder(linger_s=0.01, busy_linger_s=0.2)
    task = asyncio.create_task(recorder._run(producer=None))  # type: ignore[arg-type]
    try:
        started = time.monotonic()
        assert recorder.reserve()
        recorder.record(call())
        await until(lambda: recorder.batches == [1], pause=0.005, tries=200)
        assert time.monotonic() - started < 0.15  # the linger, not the busy one
        for _ in range(40):  # 40 calls over ~160 ms: one every 4 ms
            assert recorder.reserve()
            recorder.record(call())
            await asyncio.sleep(0.004)
        await until(lambda: sum(recorder.batches) == 41, pause=0.01, tries=300)
    finally:
        task.cancel()
    assert len(recorder.batches) - 1 <= 2  # gathered by the busy linger (a batch per ~10 ms linger without it)
    assert recorder.lanes.open == 0
