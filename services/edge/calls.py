"""calls.v1: one event per API-key call, sent by a bounded, batched, asynchronous producer.

Two lanes (`CallLanes`, pure bookkeeping). Admitted calls travel in a lane that never drops: the
edge reserves a place in it before it admits a call (`reserve`; full -> 503 `overloaded`), so
every admitted call has its place before its handler runs, and the place is freed only when Kafka
has acknowledged the event (a failed send is retried, not dropped). Refused calls (401 of a known
key, 403, 429) travel in their own bounded lane, so a flood of them cannot crowd out admitted
ones; when it is full they are folded into one event per (key, error_code, second) with `count`.
The refused lane is bounded twice: by what it holds (Kafka away) and by what it carries one by one
each second (`refused_per_second`). A flood's events past that rate would each cost the whole
pipeline (this producer, Kafka, the consumers, ClickHouse) for a call that was not served: about
a third of a 429's cost to the stack (BENCHMARKS.md, http_load round 10). Folded, a flood costs
one event per key, code and second.
A background task takes both lanes in batches and sends them in record batches with aiokafka, so
the response is never delayed by Kafka.
"""

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import msgspec
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder
from prometheus_client import Counter
from starlette.datastructures import Headers

from contracts.events import CallEvent
from contracts.fast_events import FastCall
from contracts.topics import CALLS
from services.runtime.platform.kafka import PRODUCER_CONFIG, STALE_PRODUCER_ERRORS, retire
from services.runtime.platform.logs import Throttled
from services.runtime.platform.settings import Settings

log = logging.getLogger(__name__)

DROPPED = Counter("tollgate_edge_call_events_dropped_total", "calls.v1 events dropped, by reason (unit: events)", ["reason"])
for _reason in ("refused_fold_full", "shutdown"):  # on /metrics at 0 from the start, so an alert can watch them
    DROPPED.labels(_reason)
SENT = Counter("tollgate_edge_call_events_sent_total", "calls.v1 events acknowledged by Kafka (unit: events)")
RETRIED = Counter(
    "tollgate_edge_call_events_retried_total", "calls.v1 events Kafka did not acknowledge, sent again (unit: events)"
)
OVERLOADED = Counter(
    "tollgate_edge_overloaded_total", "API-key calls refused with 503 overloaded: the admitted lane was full (unit: calls)"
)
FOLDED = Counter(
    "tollgate_edge_refused_calls_folded_total", "Refused calls folded into one event per key, code and second (unit: calls)"
)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_ENCODE = msgspec.json.Encoder().encode
# Where msgspec writes a latency exactly as pydantic does (from 1e16 it writes `1e16`, pydantic `1e+16`).
_PLAIN_FLOATS = 1e15


def parse_networks(cidrs: list[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)


def forwarded_for(headers: Headers) -> str:
    """X-Forwarded-For as one list: a proxy may add its hop as a line of its own (HAProxy's
    `option forwardfor`), and the lines are one comma-separated list (RFC 9110, 5.3). The first
    line alone may be the one the caller wrote."""
    return ", ".join(headers.getlist("x-forwarded-for"))


def client_ip(peer: str, forwarded_for: str, trusted: tuple[Network, ...]) -> str:
    """The caller's address: X-Forwarded-For is believed only hop by hop through trusted proxies,
    from the right, so a client cannot forge its own address by sending the header."""

    def is_trusted(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # a dual-stack listener sees an IPv4 proxy as ::ffff:a.b.c.d
        return any(ip in net for net in trusted)

    if not trusted or not is_trusted(peer):
        return peer
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    for hop in reversed(hops):
        if not is_trusted(hop):
            try:
                return str(ipaddress.ip_address(hop))
            except ValueError:
                return peer  # garbage from the client side of the chain
    return hops[0] if hops else peer


@dataclass(slots=True)  # not frozen: built once per call, and frozen __init__ is slower
class Call:
    """What the request path hands over (cheap); the event is built off the path."""

    time: datetime
    account_id: UUID
    api_key_id: UUID
    method: str
    path: str
    status: int
    ip: str
    user_agent: str
    latency_ms: float
    error_code: str | None = None  # set exactly on refused calls
    admitted: bool = True  # travels in the admitted lane (holds a reserved place)
    count: int = 1  # > 1 once refused calls were folded into this one
    id: UUID | None = None  # given at the first serialisation, kept for every retry (idempotency)
    service: str | None = None  # (v3) the platform service that verified this call, if one did

    def event(self) -> CallEvent:
        if self.id is None:
            self.id = uuid4()
        return CallEvent(
            id=self.id,
            time=self.time,
            account_id=self.account_id,
            api_key_id=self.api_key_id,
            method=self.method[:16],
            path=self.path[:512],
            status=self.status,
            ip=self.ip[:64],
            user_agent=self.user_agent[:512],
            latency_ms=max(0.0, self.latency_ms),
            error_code=self.error_code,
            count=self.count,
            service=self.service,
        )

    def event_json(self) -> bytes:
        """`event().model_dump_json()`'s very bytes, written by msgspec (the contract's mirror,
        `FastCall`: the same fields in the same order) without building and validating the model:
        a third of this producer's work per call went there (BENCHMARKS.md, "verify", issue 38).
        A call msgspec could write differently, or that the model would refuse, takes the model's
        path, which writes it or raises as before (tests/unit/test_edge_call_json.py proves both)."""
        if self.id is None:
            self.id = uuid4()
        latency = max(0.0, self.latency_ms)
        error_code, service = self.error_code, self.service
        if (
            self.time.tzinfo is UTC  # (an offset of seconds: pydantic writes it rounded to the minute)
            and latency < _PLAIN_FLOATS
            and 100 <= self.status <= 599
            and 1 <= self.count <= 2**31 - 1
            and (error_code is None or len(error_code) <= 64)
            and (service is None or len(service) <= 200)
        ):
            try:
                return _ENCODE(
                    FastCall(
                        id=self.id,
                        time=self.time,
                        account_id=self.account_id,
                        api_key_id=self.api_key_id,
                        method=self.method[:16],
                        path=self.path[:512],
                        status=self.status,
                        ip=self.ip[:64],
                        user_agent=self.user_agent[:512],
                        latency_ms=latency,
                        error_code=error_code,
                        count=self.count,
                        service=service,
                    )
                )
            except (msgspec.EncodeError, UnicodeEncodeError):  # e.g. a lone surrogate in a text: the model judges
                pass
        return self.event().model_dump_json().encode()


class CallLanes:
    """The two lanes' bookkeeping (no I/O, no event loop: the request path and the producer call it).

    Admitted lane: `open` counts the places taken (reserved, queued, or being sent); `reserve`
    takes one, or says no when all `admitted_capacity` are taken; `admit` queues the call on its
    reserved place; `release` frees a place whose call was not recorded; `sent` frees the places
    of the acknowledged calls. So the queue can never hold more than its capacity and nothing
    admitted is ever turned away. Refused lane: up to `refused_capacity` queued calls and
    `refused_per_second` calls taken in each second of `clock` (the wall clock), then folding into
    one event per (key, error_code, second of the call), held until that second is over so that
    it is one event, not one per batch; at most `fold_capacity` of them. Past that (Kafka away for
    long under a flood) a refused call is counted as dropped (metric and log), never silently.
    """

    def __init__(
        self,
        admitted_capacity: int = 10_000,
        refused_capacity: int = 10_000,
        fold_capacity: int = 100_000,
        refused_per_second: int = 200,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.admitted_capacity = admitted_capacity
        self.refused_capacity = refused_capacity
        self.fold_capacity = fold_capacity
        self.refused_per_second = refused_per_second
        self.open = 0
        self.admitted: deque[Call] = deque()
        self.refused: deque[Call] = deque()
        self.folded: dict[tuple[UUID, str | None, int], Call] = {}
        self._clock = clock
        # The second of `clock` whose refused calls `_carried` counts (not the calls' own: calls
        # finish out of the order they started in, and the lane's rate is about what it takes).
        self._second = 0
        self._carried = 0

    def reserve(self) -> bool:
        if self.open >= self.admitted_capacity:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1

    def admit(self, call: Call) -> None:
        """Queue an admitted call on the place reserved for it."""
        self.admitted.append(call)

    def refuse(self, call: Call) -> bool:
        """Queue or fold a refused call; True when the lanes hold one more event than before."""
        call.admitted = False
        second = int(self._clock())
        if second != self._second:
            self._second, self._carried = second, 0
        if self._carried < self.refused_per_second and len(self.refused) < self.refused_capacity:
            self._carried += 1
            self.refused.append(call)
            return True
        key = (call.api_key_id, call.error_code, int(call.time.timestamp()))
        folded = self.folded.get(key)
        if folded is not None:
            folded.count += call.count
        elif len(self.folded) < self.fold_capacity:
            self.folded[key] = call
        else:
            DROPPED.labels("refused_fold_full").inc(call.count)
            _FOLD_FULL_LOG.warning(
                "refused-call lane and its folds are full: refused calls dropped (tollgate_edge_call_events_dropped_total)"
            )
            return False
        return folded is None

    def __len__(self) -> int:
        return len(self.admitted) + len(self.refused) + len(self.folded)

    def take(self, limit: int) -> list[Call]:
        """Up to `limit` calls, admitted first; refused ones only with what room is left, folds
        only once their second is over."""
        calls: list[Call] = []
        while self.admitted and len(calls) < limit:
            calls.append(self.admitted.popleft())
        while self.refused and len(calls) < limit:
            calls.append(self.refused.popleft())
        if self.folded and len(calls) < limit:
            now = int(self._clock())
            closed = [key for key in self.folded if key[2] < now][: limit - len(calls)]
            folds = [self.folded.pop(key) for key in closed]
            FOLDED.inc(sum(fold.count for fold in folds))  # once per batch, not per folded call: a flood's path
            calls += folds
        return calls

    def until_folds_close(self) -> float:
        """Seconds until the first fold's second is over (the lanes hold nothing else to take)."""
        return max(0.001, min(key[2] for key in self.folded) + 1 - self._clock())

    def sent(self, calls: list[Call]) -> None:
        """Kafka acknowledged these: the admitted ones' places are free again."""
        self.open -= sum(1 for call in calls if call.admitted)


_FOLD_FULL_LOG = Throttled(log)  # a flood would otherwise flood the log too


class PartitionMap:
    """account id -> the partition aiokafka's default partitioner picks for its key (murmur2 of
    the account id's text), so batches keep each account's calls in order on one partition like
    per-message `send` did. Memoised: murmur2 is pure Python and accounts repeat."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self._partitions: list[int] = []
        self._by_account: dict[UUID, int] = {}
        self._max = max_entries

    def set_partitions(self, partitions: set[int]) -> None:
        ordered = sorted(partitions)
        if ordered != self._partitions:
            self._partitions = ordered
            self._by_account.clear()

    def of(self, account_id: UUID) -> int:
        partition = self._by_account.get(account_id)
        if partition is None:
            if len(self._by_account) >= self._max:
                self._by_account.clear()
            key = str(account_id).encode()
            partition = self._by_account[account_id] = DefaultPartitioner()(key, self._partitions, self._partitions)
        return partition


class CallRecorder:
    """Calls are taken off the lanes in batches (what arrived during `linger_s` after the first,
    up to `batch`), serialised, grouped by partition into aiokafka record batches and sent with
    one `send_batch` per partition batch: no per-message future, partitioner call or task switch.
    The linger is what the old producer's `linger_ms=20` already added to an event's way to Kafka;
    a shorter one makes more, smaller produce requests whose cost shows in the edge's latency
    (BENCHMARKS.md, "edge"). While calls keep coming, a batch is taken no sooner than
    `busy_linger_s` after the one before (`linger_for`): a produce request costs the broker and
    this process milliseconds of CPU whatever it carries, and at saturation they were the part of
    Kafka's share of a call that grows with the call rate (issue 38; BENCHMARKS.md, http_load
    round 23, kafkacost), so this process
    sends at most ~1/`busy_linger_s` of them a second. Nothing waits on calls.v1 within that:
    api_calls are blocked by the edges' own admissions and quota gathers calls.v1 for a second;
    a call that comes after a pause (a trickle) still leaves after `linger_s`. What Kafka did not
    acknowledge is sent again (same event ids: consumers drop a copy) after a growing pause,
    before anything new."""

    def __init__(
        self,
        settings: Settings,
        *,
        max_buffer: int = 10_000,
        refused_buffer: int = 10_000,
        batch: int = 1000,
        linger_s: float = 0.02,
        busy_linger_s: float = 0.05,
        retry_s: tuple[float, float] = (0.1, 5.0),
    ) -> None:
        self._settings = settings
        self._topic = settings.topic(CALLS.name)
        self.lanes = CallLanes(max_buffer, refused_buffer)
        self._wake = asyncio.Event()
        self._batch = batch
        self._linger = linger_s
        self._busy_linger = busy_linger_s
        self._taken_at = -busy_linger_s  # (monotonic) when the last batch was taken
        self._retry = retry_s
        self._partitions = PartitionMap()
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None
        self._busy = False  # a batch is taken and not yet acknowledged
        self._in_flight: list[Call] = []
        self._stale = False  # Kafka refused the producer: replace it before sending again

    def reserve(self) -> bool:
        """A place for one admitted call's event; False when the lane is full (answer 503)."""
        return self.lanes.reserve()

    def release(self) -> None:
        self.lanes.release()

    def record(self, call: Call) -> None:
        """An admitted call, on the place reserved for it (never dropped)."""
        self.lanes.admit(call)
        if not self._wake.is_set():
            self._wake.set()

    def refuse(self, call: Call) -> None:
        """A refused call: queued, or folded when its lane is full."""
        if self.lanes.refuse(call) and not self._wake.is_set():
            self._wake.set()

    async def start(self) -> None:
        # linger 0: the batches are made here. acks=all like every producer: a call counts
        # against api_calls, and acks=1 can lose an acknowledged one when a leader fails over.
        self._producer = await self._new_producer()
        self._task = asyncio.create_task(self._run(self._producer), name="calls-producer")

    async def _new_producer(self) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(
            bootstrap_servers=self._settings.kafka_bootstrap_servers, linger_ms=0, request_timeout_ms=10_000, **PRODUCER_CONFIG
        )
        await producer.start()
        return producer

    async def _replaced(self, producer: AIOKafkaProducer) -> AIOKafkaProducer:
        """A new producer for one Kafka refused (sequence numbers); the old one if none starts."""
        log.warning("Kafka refused the call events' producer (sequence numbers); replacing it")
        try:
            fresh = await self._new_producer()
        except Exception:  # Kafka away: the next refused send tries again
            log.warning("could not start a new producer", exc_info=True)
            return producer
        retire(producer)
        self._producer = fresh
        return fresh

    async def stop(self) -> None:
        if self._task is not None:
            deadline = time.monotonic() + 2  # give what is queued or being sent a moment to leave
            # polled: an event the request path would have to set per call is dearer than this
            while (len(self.lanes) or self._busy) and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            left = len(self.lanes) + len(self._in_flight)
            if left:
                DROPPED.labels("shutdown").inc(left)
                log.error("stopped with %d call events not acknowledged by Kafka", left)
        if self._producer is not None:
            await self._producer.stop()

    async def _take(self) -> list[Call]:
        while True:
            while not len(self.lanes):
                self._wake.clear()
                await self._wake.wait()
            if self._linger > 0:  # one timer per batch, not one per call
                await asyncio.sleep(self.linger_for(time.monotonic() - self._taken_at))
            calls = self.lanes.take(self._batch)
            if calls:
                self._taken_at = time.monotonic()
                return calls
            # Only folds whose second is not over: until it is, or until a new call comes.
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.lanes.until_folds_close())

    def linger_for(self, since_last_batch: float) -> float:
        """How long the first call of a batch waits for others: `linger_s`, or while calls keep
        coming, until `busy_linger_s` after the last batch was taken."""
        return max(self._linger, self._busy_linger - since_last_batch)

    async def _run(self, producer: AIOKafkaProducer) -> None:
        while True:
            self._busy = False
            calls = await self._take()
            self._busy = True
            pause = self._retry[0]
            while calls:
                self._in_flight = calls
                try:
                    failed = await self.send(producer, calls)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.warning("could not send %d call events", len(calls), exc_info=True)
                    failed = calls
                if self._stale:
                    self._stale = False
                    producer = await self._replaced(producer)
                done = len(calls) - len(failed)
                if done:
                    SENT.inc(done)
                    lost = {id(call) for call in failed}
                    self.lanes.sent([call for call in calls if id(call) not in lost] if failed else calls)
                if failed:
                    # Never dropped: the admitted lane fills meanwhile and the edge answers 503
                    # `overloaded`; the refused lane folds.
                    RETRIED.inc(len(failed))
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, self._retry[1])
                calls = failed
            self._in_flight = []

    async def send(self, producer: AIOKafkaProducer, calls: list[Call]) -> list[Call]:
        """Send `calls` as record batches, one partition each; the calls Kafka did not acknowledge.
        A batch that cannot even be queued (e.g. Kafka away past the timeout) does not stop the
        others, so what is returned is exactly what must be sent again."""
        self._partitions.set_partitions(await producer.partitions_for(self._topic))
        failed: list[Call] = []
        pending: list[tuple[asyncio.Future[Any], list[Call]]] = []
        for partition, batch, members in self._batches(producer, calls):
            try:
                pending.append((await producer.send_batch(batch, self._topic, partition=partition), members))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("could not queue %d call events for partition %d", len(members), partition, exc_info=True)
                failed += members
        results = await asyncio.gather(*(future for future, _ in pending), return_exceptions=True)
        for (_, members), result in zip(pending, results, strict=True):
            if isinstance(result, BaseException):
                failed += members
                self._stale |= isinstance(result, STALE_PRODUCER_ERRORS)
        return failed

    def _batches(self, producer: AIOKafkaProducer, calls: list[Call]) -> list[tuple[int, BatchBuilder, list[Call]]]:
        """The calls' events in record batches per partition (each as full as aiokafka allows)."""
        done: list[tuple[int, BatchBuilder, list[Call]]] = []
        filling: dict[int, tuple[BatchBuilder, list[Call]]] = {}
        for call in calls:
            partition = self._partitions.of(call.account_id)
            key, value = str(call.account_id).encode(), call.event_json()
            batch, members = filling.get(partition) or (producer.create_batch(), [])
            if batch.append(key=key, value=value, timestamp=None) is None:  # full: start another
                done.append((partition, batch, members))
                batch, members = producer.create_batch(), []
                batch.append(key=key, value=value, timestamp=None)  # an empty batch takes any record
            members.append(call)
            filling[partition] = (batch, members)
        return done + [(partition, batch, members) for partition, (batch, members) in filling.items()]
