"""Real receivers and drivers for the alerts tests: an aiosmtpd SMTP server, a recording HTTP
SMS gateway, session tokens through accounts.v1, and Kafka publishing of quota events.
(No tests here; the other test_alerts_* modules import it.)"""

import asyncio
import email
import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
import pytest
from aiosmtpd.controller import Controller
from fastapi import FastAPI
from faststream.kafka import KafkaBroker
from psycopg.rows import dict_row
from pydantic import SecretStr

from contracts.common import Resource, Role, UserType
from contracts.events import AccountState, QuotaState, QuotaThresholdCrossed
from contracts.period import period_of
from contracts.topics import ACCOUNTS, QUOTA, QUOTA_THRESHOLDS
from services.edge.edge import Edge
from services.runtime.platform.settings import Settings
from tests.support.apps import free_port

CONSOLE_URL = "https://console.example.test"


async def eventually(check: Callable[[], Awaitable[bool]] | Callable[[], bool], within: float = 20.0) -> None:
    """Poll `check` until it holds (no fixed sleeps), or fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.05)


def this_period() -> str:
    return period_of(datetime.now(UTC), UTC)  # the tests' settings keep the default UTC zone


def next_period(period: str) -> str:
    year, month = (int(p) for p in period.split("-"))
    return f"{year + month // 12:04d}-{month % 12 + 1:02d}"


# ---- SMTP -------------------------------------------------------------------------------------
class _Recorder:
    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.lock = threading.Lock()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self.lock:
            self.messages.append(email.message_from_bytes(envelope.content))
        return "250 Message accepted for delivery"


@dataclass
class SmtpServer:
    port: int
    recorder: _Recorder

    @property
    def messages(self) -> list[Message]:
        with self.recorder.lock:
            return list(self.recorder.messages)

    def to(self, address: str) -> list[Message]:
        return [m for m in self.messages if m["To"] == address]


@pytest.fixture(name="smtp_server")
def smtp_server_fixture() -> Iterator[SmtpServer]:
    recorder = _Recorder()
    port = free_port()
    controller = Controller(recorder, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield SmtpServer(port, recorder)
    finally:
        controller.stop()


# ---- SMS gateway ------------------------------------------------------------------------------
@dataclass
class SmsGateway:
    """A local HTTP server that records every request; `statuses` scripts the answers (then 200),
    and while `hold` is clear, a request waits (like a gateway that accepted and went quiet)."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    always: int = 200
    hold: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.hold.set()

    def received(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.requests)

    def by_key(self) -> dict[str, list[dict[str, Any]]]:
        """Requests grouped by Idempotency-Key: what a deduplicating provider would deliver."""
        groups: dict[str, list[dict[str, Any]]] = {}
        for request in self.received():
            groups.setdefault(request["headers"]["idempotency-key"], []).append(request)
        return groups


@pytest.fixture(name="sms_gateway")
def sms_gateway_fixture() -> Iterator[SmsGateway]:
    gateway = SmsGateway()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with gateway.lock:
                gateway.requests.append({"headers": {k.lower(): v for k, v in self.headers.items()}, "json": body})
                status = gateway.statuses.pop(0) if gateway.statuses else gateway.always
            gateway.hold.wait(30)
            payload = json.dumps({"id": str(uuid.uuid4())}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    gateway.url = f"http://127.0.0.1:{server.server_address[1]}/v1/messages"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield gateway
    finally:
        gateway.hold.set()
        server.shutdown()
        server.server_close()


def alert_settings(settings: Settings, smtp: SmtpServer, sms: SmsGateway) -> Settings:
    return settings.model_copy(
        update={
            "smtp_host": "127.0.0.1",
            "smtp_port": smtp.port,
            "sms_gateway_url": sms.url,
            "sms_gateway_token": SecretStr("gateway-token"),
            "console_url": CONSOLE_URL,
        }
    )


# ---- Kafka and auth ---------------------------------------------------------------------------
async def publish_account(broker: KafkaBroker, settings: Settings, account_id: uuid.UUID, roles: list[Role]) -> None:
    state = AccountState(time=datetime.now(UTC), account_id=account_id, roles=roles, user_type=UserType.INDIVIDUAL)
    await broker.publish(state, settings.topic(ACCOUNTS.name), key=str(account_id).encode())


async def login(app: FastAPI, account_id: uuid.UUID, roles: list[Role] | None = None) -> dict[str, str]:
    """A console session for a fresh account, known to this process's edge."""
    runtime = app.state.runtime
    await publish_account(runtime.broker, runtime.settings, account_id, roles or [Role.OWNER])
    await eventually(lambda: runtime.edge.accounts.get(account_id) is not None)
    token = runtime.edge.issue_session(account_id, "sid", datetime.now(UTC))
    return {"Authorization": f"Bearer {token}"}


def session_headers(settings: Settings, account_id: uuid.UUID) -> dict[str, str]:
    """A session token for a process started elsewhere with the same settings (same secret)."""
    token = Edge(settings).issue_session(account_id, "sid", datetime.now(UTC))
    return {"Authorization": f"Bearer {token}"}


async def publish_crossing(
    broker: KafkaBroker,
    settings: Settings,
    account_id: uuid.UUID,
    pct: int,
    *,
    period: str,
    resource: Resource = Resource.AI_TOKENS,
    total: int = 100_000,
    event_id: uuid.UUID | None = None,
) -> QuotaThresholdCrossed:
    event = QuotaThresholdCrossed(
        id=event_id or uuid.uuid4(),
        time=datetime.now(UTC),
        account_id=account_id,
        resource=resource,
        period=period,
        threshold_pct=pct,
        used=total * pct // 100,
        total=total,
    )
    await broker.publish(event, settings.topic(QUOTA_THRESHOLDS.name), key=str(account_id).encode())
    return event


async def publish_quota_state(
    broker: KafkaBroker, settings: Settings, account_id: uuid.UUID, resource: Resource, used: int, total: int, period: str
) -> None:
    state = QuotaState(
        time=datetime.now(UTC), account_id=account_id, resource=resource, period=period, total=total, used=used, blocked=False
    )
    await broker.publish(state, settings.topic(QUOTA.name), key=f"{account_id}:{resource.value}".encode())


# ---- Postgres ---------------------------------------------------------------------------------
def query(settings: Settings, sql: str, *params: Any) -> list[dict[str, Any]]:
    with psycopg.connect(settings.database_url, row_factory=dict_row, autocommit=True) as conn:
        return list(conn.execute(sql, params).fetchall())  # type: ignore[arg-type]


def firing_count(settings: Settings, account_id: uuid.UUID) -> int:
    return int(query(settings, "SELECT count(*) AS n FROM alerts.firings WHERE account_id = %s", account_id)[0]["n"])


def delivery_statuses(settings: Settings, account_id: uuid.UUID) -> dict[str, int]:
    rows = query(
        settings,
        """SELECT d.status, count(*) AS n FROM alerts.deliveries d JOIN alerts.firings f ON f.id = d.firing_id
            WHERE f.account_id = %s GROUP BY d.status""",
        account_id,
    )
    return {r["status"]: int(r["n"]) for r in rows}


def all_settled(settings: Settings, account_id: uuid.UUID) -> bool:
    statuses = delivery_statuses(settings, account_id)
    return bool(statuses) and statuses.get("pending", 0) == 0
