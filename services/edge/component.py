"""What a service hands the host: routes, subscribers, migrations, start/stop hooks, checks."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fastapi import APIRouter
from faststream.kafka import KafkaBroker, KafkaRouter
from psycopg_pool import AsyncConnectionPool

from contracts.clock import Clock
from services.edge.edge import Edge
from services.edge.fast_routes import FastRoute
from services.runtime.platform.clock import system_clock
from services.runtime.platform.settings import Settings

Hook = Callable[[], Awaitable[None]]
Check = Callable[[], Awaitable[bool]]


@dataclass(frozen=True)
class Overrides:
    """What a test or a benchmark may replace when it builds an app (cosmicpython's bootstrap):
    the clock every use case reads, and billing's payment provider (None: billing's own default)."""

    clock: Clock = system_clock
    payment_provider: Any = None


@dataclass(eq=False)  # an identity object: hashable, compared by identity
class Runtime:
    """The process-wide resources a service builds itself from."""

    settings: Settings
    broker: KafkaBroker
    pool: AsyncConnectionPool
    edge: Edge
    overrides: Overrides = field(default_factory=Overrides)

    @property
    def clock(self) -> Clock:
        return self.overrides.clock


class ConsumerLoop(Protocol):
    """A consumer group's own loop (not a FastStream subscriber), run where the host runs consumers."""

    async def start(self) -> None: ...

    # At shutdown, while the loop still holds its partitions: commit the work in flight.
    async def close(self) -> None: ...


@dataclass
class Component:
    name: str
    router: APIRouter | None = None
    # Documented routes of `router` also answered before the router (services/edge/fast_routes.py).
    fast_routes: list[FastRoute] = field(default_factory=list)
    # Consumer-group work: FastStream subscribers, and loops of their own. Only a process that runs
    # consumers starts them (`serve --workers N` keeps them out of the processes serving requests).
    subscribers: KafkaRouter | None = None
    consumers: list[ConsumerLoop] = field(default_factory=list)
    # Postgres migrations of the schema this service owns, applied at start.
    migrations: Path | None = None
    on_start: list[Hook] = field(default_factory=list)
    on_stop: list[Hook] = field(default_factory=list)
    # Extra readiness checks by name (Kafka, Postgres and the edge are checked by the host).
    checks: dict[str, Check] = field(default_factory=dict)
