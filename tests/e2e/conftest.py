"""The console stories' fixtures: a real `tollgate serve` and a client of its API, the machine's
Chromium, a webhook receiver."""

import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, sync_playwright

from services.runtime.platform.settings import Settings
from tests.support.apps import ServeProcess

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def server(settings: Settings) -> Iterator[ServeProcess]:
    # On the test's own ClickHouse database of the test server. The stories' webhook receivers run
    # on 127.0.0.1: the operator setting lets the server reach them.
    proc = ServeProcess(settings.model_copy(update={"webhook_allow_private_targets": True}))
    try:
        proc.wait_ready(90)
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def api(server: ServeProcess) -> Iterator[httpx.Client]:
    """The server's API, as a program calls it (the activity log shows its user agent)."""
    with httpx.Client(base_url=server.base_url, timeout=10, headers={"User-Agent": "console-e2e/1.0"}) as client:
        yield client


@pytest.fixture
def browser() -> Iterator[Browser]:
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("Chromium is missing: `make test-prereqs` (deploy/local/prereqs.sh --test) installs it")
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def webhook_receiver() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    """A local HTTP receiver that answers 200 and records (headers, body) of every POST."""
    received: list[tuple[dict[str, str], bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/tollgate-hook", received
    finally:
        server.shutdown()
        server.server_close()
