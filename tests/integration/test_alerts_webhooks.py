"""The webhook channel (v2) on real Kafka and Postgres with a real local HTTP receiver: signed
deliveries retried with backoff, the per-attempt delivery log, and the SSRF guard at creation
and at delivery."""

import asyncio
import gzip
import itertools
import json
import socket
import ssl
import threading
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from contracts.alerts_api import Channel, WebhookRecipient
from contracts.common import AlertMetric
from services.alerts import store
from services.alerts.dispatcher import Dispatcher
from services.alerts.webhook import AttemptResult, Backoff, WebhookRequest, WebhookSender, verify
from services.runtime.platform.settings import Settings
from tests.integration.quota_helpers import bearer, new_api_key
from tests.integration.test_alerts_helpers import CONSOLE_URL, eventually, login, publish_crossing, query, this_period
from tests.support.apps import running_app

pytestmark = pytest.mark.integration


@dataclass
class Receiver:
    """A local HTTP server that answers `statuses` in turn (then 200) and records every request
    with the status it answered and when it arrived."""

    port: int = 0
    statuses: list[int] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    content_type: str | None = None  # of its answers, which then carry `answer`
    answer: bytes = b"not today"
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.requests)

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/hooks/tollgate?team=ops"


def _handler(rec: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            with rec.lock:
                status = rec.statuses.pop(0) if rec.statuses else 200
                rec.requests.append(
                    {
                        "at": time.time(),
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                        "answered": status,
                    }
                )
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", f"{self.path}/elsewhere")
            answer = b"" if rec.content_type is None else rec.answer
            if rec.content_type is not None:
                self.send_header("Content-Type", rec.content_type)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def _serving(tls: ssl.SSLContext | None = None) -> Iterator[Receiver]:
    rec = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(rec))
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    rec.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with _serving() as rec:
        yield rec


def _fast(settings: Settings, *, allow_private: bool) -> Settings:
    return settings.model_copy(
        update={
            "console_url": CONSOLE_URL,
            "webhook_allow_private_targets": allow_private,
            "webhook_retry_initial_seconds": 0.3,
            "webhook_retry_max_seconds": 1.0,
        }
    )


def _hook_rule(url: str, threshold: int = 80) -> dict[str, Any]:
    return {"metric": "total_tokens", "threshold_pct": threshold, "channels": ["webhook"], "recipients": [{"url": url}]}


def _ts(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


async def test_a_webhook_failing_twice_is_retried_with_backoff_signed_and_logged_per_attempt(settings, receiver: Receiver):
    settings = _fast(settings, allow_private=True)
    receiver.statuses = [500, 500]
    account = uuid.uuid4()
    async with running_app(settings, targets=("alerts",)) as (app, client):
        session = await login(app, account)
        other = await login(app, uuid.uuid4())
        key = bearer(await new_api_key(app, settings, account))  # alerts:write is not money: a key may

        # "localhost" goes through the resolver; the request goes to the checked address with the name as Host.
        created = await client.post("/api/ai/usage/alert", json=_hook_rule(receiver.url("localhost")), headers=key)
        assert created.status_code == 201, created.text
        rule = created.json()
        secret = rule["webhook_secret"]
        assert secret.startswith("whsec_") and len(secret) > 40
        assert rule["channels"] == ["webhook"] and rule["recipients"] == [{"url": receiver.url("localhost")}]
        # The secret is returned this once: not in the listing, not in the rule's log.
        listing = (await client.get("/api/ai/usage/alert", headers=session)).json()
        assert secret not in json.dumps(listing) and "webhook_secret" not in listing["rules"][0]

        await publish_crossing(app.state.runtime.broker, settings, account, 85, period=this_period())

        def delivered() -> bool:
            return any(r["answered"] == 200 for r in receiver.received())

        await eventually(delivered, within=30)
        requests = receiver.received()
        assert [r["answered"] for r in requests] == [500, 500, 200]  # arrived once at the receiver's success
        for number, request in enumerate(requests, start=1):
            headers = request["headers"]
            assert verify(secret, headers["tollgate-signature"], request["body"]), headers
            assert not verify("whsec_wrong", headers["tollgate-signature"], request["body"])
            assert headers["host"] == f"localhost:{receiver.port}"
            assert headers["content-type"] == "application/json"
            assert headers["tollgate-attempt"] == str(number)
            assert request["path"] == "/hooks/tollgate?team=ops"
        assert len({r["body"] for r in requests}) == 1 and len({r["headers"]["tollgate-delivery"] for r in requests}) == 1
        alert = json.loads(requests[0]["body"])
        assert alert["id"] == requests[0]["headers"]["tollgate-delivery"]
        assert (alert["type"], alert["rule_id"], alert["account_id"]) == ("usage.alert", rule["id"], str(account))
        assert (alert["metric"], alert["resource"], alert["threshold_pct"]) == ("total_tokens", "ai_tokens", 80)
        assert (alert["used"], alert["total"], alert["period"]) == (85_000, 100_000, this_period())
        assert alert["links"]["upgrade_plan"] == f"{CONSOLE_URL}/plan"

        async def logged() -> list[dict[str, Any]] | None:
            response = await client.get(f"/api/ai/usage/alert/{rule['id']}/deliveries", headers=key)
            items = response.json()["items"]
            return items if len(items) == 3 and items[-1]["status"] == "sent" else None

        await eventually(logged)
        items = await logged()
        assert items is not None
        assert [(i["attempt"], i["status_code"]) for i in items] == [(1, 500), (2, 500), (3, 200)]
        assert [i["error"] is None for i in items] == [False, False, True] and "500" in items[0]["error"]
        assert {i["channel"] for i in items} == {"webhook"} and len({i["delivery_id"] for i in items}) == 1
        assert len({i["id"] for i in items}) == 3
        assert items[2]["next_attempt_at"] is None
        for failed, following in itertools.pairwise(items):
            # Backoff: the next attempt was due at least the initial delay later, and did not come early.
            assert _ts(failed["next_attempt_at"]) - _ts(failed["time"]) >= 0.3
            assert _ts(following["time"]) >= _ts(failed["next_attempt_at"]) - 0.05
        assert requests[1]["at"] - requests[0]["at"] >= 0.3
        assert _ts(items[1]["next_attempt_at"]) - _ts(items[1]["time"]) >= 0.6  # doubled

        # The rule is the account's: another account (and a rule that does not exist) is 404.
        for path in (f"/api/ai/usage/alert/{rule['id']}/deliveries", f"/api/ai/usage/alert/{uuid.uuid4()}/deliveries"):
            missing = await client.get(path, headers=other)
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        bad_id = await client.get("/api/ai/usage/alert/not-a-uuid/deliveries", headers=key)
        assert bad_id.status_code == 422 and bad_id.json()["error"]["code"] == "validation_error"
        assert len(receiver.received()) == 3  # nothing more was sent


async def test_an_answer_in_a_charset_that_is_no_text_is_logged_and_retried_like_any(settings, receiver: Receiver):
    """The receiver names the charset of its answer: `zlib` is a codec Python knows but no text
    encoding. The attempt is still an attempt (logged, retried with backoff, then sent), not an
    exception that left the delivery pending unlogged, posted again at every sweep for ever."""
    settings = _fast(settings, allow_private=True)
    receiver.statuses = [500]
    receiver.content_type = "text/plain; charset=zlib"
    account = uuid.uuid4()
    async with running_app(settings, targets=("alerts",)) as (app, client):
        session = await login(app, account)
        created = await client.post("/api/ai/usage/alert", json=_hook_rule(receiver.url()), headers=session)
        assert created.status_code == 201, created.text
        await publish_crossing(app.state.runtime.broker, settings, account, 85, period=this_period())

        async def logged() -> list[dict[str, Any]] | None:
            response = await client.get(f"/api/ai/usage/alert/{created.json()['id']}/deliveries", headers=session)
            items = response.json()["items"]
            return items if items and items[-1]["status"] == "sent" else None

        await eventually(logged, within=30)
        items = await logged()
        assert items is not None
        assert [(i["attempt"], i["status_code"]) for i in items] == [(1, 500), (2, 200)]
        assert items[0]["error"] == "receiver answered 500: not today" and items[0]["next_attempt_at"] is not None
        assert [r["answered"] for r in receiver.received()] == [500, 200]


async def test_an_answer_with_a_nul_character_is_logged_without_it(settings, receiver: Receiver):
    """The head of the answer goes into the delivery log (Postgres text), which cannot hold a NUL:
    the error is logged without it instead of failing the log's write (which left the delivery
    pending, unlogged, tried again at every sweep for ever)."""
    settings = _fast(settings, allow_private=True)
    receiver.statuses = [500]
    receiver.content_type = "text/plain; charset=utf-8"
    receiver.answer = b"not\x00today"
    account = uuid.uuid4()
    async with running_app(settings, targets=("alerts",)) as (app, client):
        session = await login(app, account)
        created = await client.post("/api/ai/usage/alert", json=_hook_rule(receiver.url()), headers=session)
        assert created.status_code == 201, created.text
        await publish_crossing(app.state.runtime.broker, settings, account, 85, period=this_period())

        async def logged() -> list[dict[str, Any]] | None:
            response = await client.get(f"/api/ai/usage/alert/{created.json()['id']}/deliveries", headers=session)
            items = response.json()["items"]
            return items if items and items[-1]["status"] == "sent" else None

        await eventually(logged, within=30)
        items = await logged()
        assert items is not None
        assert [(i["attempt"], i["status_code"]) for i in items] == [(1, 500), (2, 200)]
        assert items[0]["error"] == "receiver answered 500: not\ufffdtoday"


async def test_targets_that_are_private_or_not_http_are_refused_with_422(settings, receiver: Receiver):
    settings = _fast(settings, allow_private=False)
    account = uuid.uuid4()
    async with running_app(settings, targets=("alerts",)) as (app, client):
        key = bearer(await new_api_key(app, settings, account))
        refused = [
            receiver.url(),
            receiver.url("localhost"),
            "http://169.254.169.254/latest/meta-data/",
            "http://10.0.0.7:8080/hook",
            "http://[::1]:8080/hook",
            "http://[::ffff:127.0.0.1]/hook",
            "http://[fe80::1]/hook",
            "http://2130706433/hook",  # decimal 127.0.0.1, as the resolver reads it
            "http://0177.0.0.1/hook",  # octal
            "http://0.0.0.0/hook",
        ]
        for url in refused:
            response = await client.post("/api/ai/usage/alert", json=_hook_rule(url), headers=key)
            assert response.status_code == 422, (url, response.text)
            error = response.json()["error"]
            assert error["code"] == "validation_error" and error["request_id"]
            assert [d["field"] for d in error["details"]] == ["recipients.0.url"], url
        # Names no resolver takes (a label over 63 characters, an empty label): 422, not a 500 from
        # the resolver's own encoding of the name.
        for url in ("https://" + "a" * 64 + ".example/hook", "https://a..example/hook", "https://" + "ü" * 64 + ".example/x"):
            response = await client.post("/api/ai/usage/alert", json=_hook_rule(url), headers=key)
            assert response.status_code == 422, (url, response.text)
            assert [d["field"] for d in response.json()["error"]["details"]] == ["recipients.0.url"], url
        for url in ("ftp://example.com/hook", "file:///etc/passwd", "javascript:alert(1)", "//example.com/hook"):
            response = await client.post("/api/ai/usage/alert", json=_hook_rule(url), headers=key)
            assert response.status_code == 422, (url, response.text)
            assert "http" in json.dumps(response.json()["error"]["details"])
        # Channel and recipient must fit each other.
        no_url = {"metric": "api_calls", "threshold_pct": 50, "channels": ["webhook"], "recipients": []}
        assert (await client.post("/api/ai/usage/alert", json=no_url, headers=key)).status_code == 422
        # A name that does not resolve now is accepted; its deliveries fail (logged) until it does.
        unresolved = await client.post("/api/ai/usage/alert", json=_hook_rule("https://no-such-host.invalid/x"), headers=key)
        assert unresolved.status_code == 201 and unresolved.json()["webhook_secret"]
        assert (await client.get("/api/ai/usage/alert", headers=key)).json()["rules"][0]["id"] == unresolved.json()["id"]
    assert receiver.received() == []


@pytest.fixture
async def pool(settings) -> AsyncIterator[AsyncConnectionPool]:
    async with AsyncConnectionPool(
        settings.database_url, min_size=1, max_size=4, kwargs={"row_factory": dict_row, "autocommit": False}
    ) as opened:
        yield opened


async def _webhook_delivery(pool, url: str, secret: str) -> uuid.UUID:
    """A webhook rule's firing, straight in the store: its one pending delivery."""
    async with pool.connection() as conn, conn.transaction():
        rule = await store.insert_rule(
            conn,
            uuid.uuid4(),
            AlertMetric.API_CALLS,
            90,
            [Channel.WEBHOOK],
            [WebhookRecipient(url=url)],
            datetime.now(UTC),
            secret,
        )
        (delivery_id,) = await store.record_firing(conn, store.Firing(rule, "2026-11", 950, 1000, "crossing"))
    return delivery_id


async def test_the_address_is_checked_again_at_delivery_and_a_refused_target_fails_logged(settings, pool, receiver: Receiver):
    """A rule whose URL passed at creation (here: written straight to the table) but now resolves to a
    private address is never connected to; each attempt is logged, and after the window it fails."""
    settings = _fast(settings, allow_private=False)
    # Migrations of the alerts schema, as the service applies them.
    async with running_app(settings, targets=("alerts",)):
        pass
    delivery_id = await _webhook_delivery(pool, receiver.url(), "whsec_x")
    sender = WebhookSender(allow_private=False)
    dispatcher = Dispatcher(pool, [], CONSOLE_URL, webhooks=sender, webhook_backoff=Backoff(0.1, 0.2, window_seconds=0.5))
    await dispatcher.deliver(delivery_id)

    def settled() -> bool:
        return query(settings, "SELECT status FROM alerts.deliveries WHERE id = %s", delivery_id)[0]["status"] != "pending"

    await eventually(settled, within=15)
    await dispatcher.stop()
    await sender.close()
    row = query(settings, "SELECT * FROM alerts.deliveries WHERE id = %s", delivery_id)[0]
    attempts = query(settings, "SELECT * FROM alerts.delivery_attempts WHERE delivery_id = %s ORDER BY attempt", delivery_id)
    assert row["status"] == "failed" and "target refused" in row["last_error"] and "127.0.0.1" in row["last_error"]
    assert len(attempts) >= 2 and row["attempts"] == len(attempts)
    assert all(a["status_code"] is None and "target refused" in a["error"] for a in attempts)
    assert attempts[-1]["next_attempt_at"] is None and all(a["next_attempt_at"] for a in attempts[:-1])
    assert receiver.received() == []  # never connected


# ---- TLS to the checked address, and no redirects ---------------------------------------------
def _certificate(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for `name` (its own CA), written as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture
def tls_receiver(tmp_path: Path) -> Iterator[tuple[Receiver, Path]]:
    """The receiver behind TLS, with a certificate for "localhost" only."""
    cert, key = _certificate(tmp_path, "localhost")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with _serving(context) as rec:
        yield rec, cert


async def test_https_goes_to_the_checked_ip_with_the_name_as_sni_and_redirects_are_not_followed(
    tls_receiver: tuple[Receiver, Path],
) -> None:
    tls, cert = tls_receiver
    client = httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(cert)), follow_redirects=False, trust_env=False)
    sender = WebhookSender(allow_private=True, client=client)
    now = datetime.now(UTC)

    def request(url: str, attempt: int = 1) -> WebhookRequest:
        return WebhookRequest(url, "whsec_tls", uuid.uuid4(), attempt, b'{"ok":true}')

    try:
        # Connected to 127.0.0.1 (or ::1 first, refused, then 127.0.0.1); the certificate is checked against "localhost".
        ok = await sender.attempt(request(f"https://localhost:{tls.port}/hook"), now)
        assert (ok.status_code, ok.error) == (200, None)
        (first,) = tls.received()
        assert first["headers"]["host"] == f"localhost:{tls.port}"
        assert verify("whsec_tls", first["headers"]["tollgate-signature"], first["body"])
        # The same server by its address: the certificate does not name 127.0.0.1, so TLS fails.
        by_ip = await sender.attempt(request(f"https://127.0.0.1:{tls.port}/hook"), now)
        assert by_ip.status_code is None and by_ip.error and "certificate" in by_ip.error.lower()
        # A redirect is a failed attempt, and its Location is not visited.
        tls.statuses.append(302)
        moved = await sender.attempt(request(f"https://localhost:{tls.port}/hook", 2), now)
        assert moved.status_code == 302 and moved.error == "receiver answered 302"
        assert [r["answered"] for r in tls.received()] == [200, 302]
        # The setting off: the same name is refused before any connection.
        strict = await WebhookSender(allow_private=False, client=client).attempt(request(f"https://localhost:{tls.port}/"), now)
        assert strict.status_code is None and strict.error and strict.error.startswith("target refused")
        assert len(tls.received()) == 2
    finally:
        await sender.close()


async def test_a_postponed_webhook_is_not_swept_early_and_another_process_resumes_it_when_due(settings, pool, receiver: Receiver):
    """The wait between attempts lives in Postgres (next_attempt_at), not in a held lock: a process
    that dies after a failed attempt loses nothing, and no sweep sends before the delivery is due."""
    settings = _fast(settings, allow_private=True)
    async with running_app(settings, targets=("alerts",)):
        pass  # the alerts schema, migrated as the service does it
    receiver.statuses = [503]
    delivery_id = await _webhook_delivery(pool, receiver.url(), "whsec_y")
    backoff = Backoff(initial_seconds=3.0, max_seconds=6.0)  # ample: the "not yet" checks take milliseconds
    first = Dispatcher(pool, [], CONSOLE_URL, webhooks=WebhookSender(allow_private=True), webhook_backoff=backoff)
    await first.deliver(delivery_id)
    await first.stop()  # "dies": its wake-up timer is gone
    row = query(settings, "SELECT status, attempts, next_attempt_at FROM alerts.deliveries WHERE id = %s", delivery_id)[0]
    assert (row["status"], row["attempts"]) == ("pending", 1) and row["next_attempt_at"] is not None

    second = Dispatcher(pool, [], CONSOLE_URL, webhooks=WebhookSender(allow_private=True), webhook_backoff=backoff)
    assert await second.sweep() == 0  # not due yet
    await second.deliver(delivery_id)  # an explicit submit before it is due sends nothing either
    assert len(receiver.received()) == 1

    async def resumed() -> bool:
        await second.sweep()
        await second.idle()
        return len(receiver.received()) == 2

    await eventually(resumed, within=15)
    await second.stop()
    row = query(settings, "SELECT status, attempts FROM alerts.deliveries WHERE id = %s", delivery_id)[0]
    assert (row["status"], row["attempts"]) == ("sent", 2)
    assert receiver.received()[1]["at"] >= row_due(settings, delivery_id) - 0.05
    assert [r["answered"] for r in receiver.received()] == [503, 200]


def row_due(settings: Settings, delivery_id: uuid.UUID) -> float:
    """When the first attempt said the second was due."""
    rows = query(
        settings, "SELECT next_attempt_at FROM alerts.delivery_attempts WHERE delivery_id = %s AND attempt = 1", delivery_id
    )
    return float(rows[0]["next_attempt_at"].timestamp())


# ---- a receiver cannot hold a sender: one deadline per attempt, a bounded answer ---------------
@contextmanager
def _raw_receiver(body: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP server on 127.0.0.1 that reads a request, then lets `body` write the answer; its port."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                with suppress(OSError):
                    body(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        server.close()


async def test_a_receiver_that_drips_or_never_ends_its_answer_cannot_hold_the_sender() -> None:
    """httpx's timeout bounds each read, not the request: a receiver that sends a byte now and then
    held the attempt (its delivery's row lock, a pooled connection and one of the dispatcher's four
    slots, shared by every account's alerts) for as long as it liked, and one that streams an endless
    answer filled the process's memory. An attempt has one deadline and reads a bounded answer."""

    def drip(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        for _ in range(100000):
            if stop_dripping.is_set():
                return
            conn.sendall(b"x")
            time.sleep(0.2)

    def endless(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (65536, b"y" * 65536)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not stop_dripping.is_set():
            conn.sendall(chunk)

    stop_dripping = threading.Event()
    sender = WebhookSender(allow_private=True, timeout_seconds=1.0)

    async def attempt(port: int) -> AttemptResult:
        request = WebhookRequest(f"http://127.0.0.1:{port}/", "whsec_x", uuid.uuid4(), 1, b"{}")
        return await asyncio.wait_for(sender.attempt(request, datetime.now(UTC)), 10)

    try:
        with _raw_receiver(drip) as port:
            started = time.monotonic()
            dripped = await attempt(port)
            assert time.monotonic() - started < 3
            assert dripped.status_code is None and dripped.error and "1.0 s" in dripped.error
        with _raw_receiver(endless) as port:
            started = time.monotonic()
            flood = await attempt(port)
            assert time.monotonic() - started < 3
            assert (flood.status_code, flood.error) == (200, None)  # the status is the answer; the rest is not read
    finally:
        stop_dripping.set()
        await sender.close()


async def test_a_compressed_answer_is_not_inflated_past_its_head() -> None:
    """(review) The sender asks for an uncompressed answer, but a receiver may send gzip anyway:
    inflating the first 64 KiB read of it made up to 64 MiB (a gzip bomb, ~1000:1) of an answer of
    which 4 KiB are read, per attempt and slot. The answer's head is read as it came, never inflated."""
    bomb = gzip.compress(b"\0" * (48 << 20), compresslevel=9)

    def gzipped(conn: socket.socket) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb)
        conn.sendall(head + bomb)

    sender = WebhookSender(allow_private=True, timeout_seconds=5.0)
    try:
        with _raw_receiver(gzipped) as port:
            request = WebhookRequest(f"http://127.0.0.1:{port}/", "whsec_x", uuid.uuid4(), 1, b"{}")
            tracemalloc.start()
            try:
                result = await sender.attempt(request, datetime.now(UTC))
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        assert (result.status_code, result.error) == (200, None)
        assert peak < 4 << 20, f"{peak / (1 << 20):.1f} MiB held for a 4 KiB head"
    finally:
        await sender.close()
