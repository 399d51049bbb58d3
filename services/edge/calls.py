"""calls.v1: one event per API-key call, sent by a bounded, batched, asynchronous producer.

`record()` never waits and never fails: it appends to a bounded queue, or counts a drop when the
queue is full (Kafka away for long). A background task builds the events and sends them in
batches with aiokafka, so the response is never delayed by Kafka.
"""

import asyncio
import ipaddress
import logging
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID, uuid4

from aiokafka import AIOKafkaProducer
from prometheus_client import Counter

from contracts.events import CallEvent
from contracts.topics import CALLS
from services.runtime.settings import Settings

log = logging.getLogger(__name__)

DROPPED = Counter("tollgate_edge_call_events_dropped_total", "calls.v1 events dropped, by reason", ["reason"])
SENT = Counter("tollgate_edge_call_events_sent_total", "calls.v1 events acknowledged by Kafka")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(cidrs: list[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)


def client_ip(peer: str, forwarded_for: str, trusted: tuple[Network, ...]) -> str:
    """The caller's address: X-Forwarded-For is believed only hop by hop through trusted proxies,
    from the right, so a client cannot forge its own address by sending the header."""

    def is_trusted(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
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


@dataclass(frozen=True, slots=True)
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

    def event(self) -> CallEvent:
        return CallEvent(
            id=uuid4(),
            time=self.time,
            account_id=self.account_id,
            api_key_id=self.api_key_id,
            method=self.method[:16],
            path=self.path[:512],
            status=self.status,
            ip=self.ip[:64],
            user_agent=self.user_agent[:512],
            latency_ms=max(0.0, self.latency_ms),
        )


class CallRecorder:
    def __init__(self, settings: Settings, *, max_buffer: int = 10_000, batch: int = 500) -> None:
        self._settings = settings
        self._topic = settings.topic(CALLS.name)
        self._queue: asyncio.Queue[Call] = asyncio.Queue(max_buffer)
        self._batch = batch
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None

    def record(self, call: Call) -> None:
        try:
            self._queue.put_nowait(call)
        except asyncio.QueueFull:
            DROPPED.labels("buffer_full").inc()

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self._settings.kafka_bootstrap_servers, acks=1, linger_ms=20, request_timeout_ms=10_000
        )
        await self._producer.start()
        self._task = asyncio.create_task(self._run(self._producer), name="calls-producer")

    async def stop(self) -> None:
        if self._task is not None:
            try:  # give what is buffered a moment to leave
                await asyncio.wait_for(self._queue.join(), 2)
            except TimeoutError:
                pass
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._producer is not None:
            await self._producer.stop()

    async def _run(self, producer: AIOKafkaProducer) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                futures = []
                for call in batch:
                    event = call.event()
                    futures.append(
                        await producer.send(self._topic, event.model_dump_json().encode(), key=str(call.account_id).encode())
                    )
                results = await asyncio.gather(*futures, return_exceptions=True)
                failed = sum(1 for r in results if isinstance(r, BaseException))
                SENT.inc(len(results) - failed)
                if failed:
                    DROPPED.labels("kafka_error").inc(failed)
            except asyncio.CancelledError:
                raise
            except Exception:
                DROPPED.labels("kafka_error").inc(len(batch))
                log.warning("could not send %d call events", len(batch), exc_info=True)
            for _ in batch:
                self._queue.task_done()
