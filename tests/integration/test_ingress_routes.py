"""The ingress routes every route: real nginx runs deploy/ingress.conf in front of one stub upstream
per service, and every path of every target's route table, sent through it, must reach a service
that serves that path. A route added to a service but not to the ingress answers 404 in the split
shape and in docker-compose; this is the test that says so."""

import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from services.runtime.host import split
from services.runtime.host.app import SERVICES, create_app
from tests.support.apps import free_port

pytestmark = pytest.mark.skipif(split.shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(), reason="no nginx")

# Served by every process (the console calls only the public API): any upstream will do.
EVERY_PROCESS = ("/console/",)


def _served_paths() -> dict[str, set[str]]:
    """path template -> the services whose `--target` serves it (from each target's OpenAPI)."""
    served: dict[str, set[str]] = {}
    for service in SERVICES:
        for path in create_app([service], consumers=False).openapi()["paths"]:
            served.setdefault(path, set()).add(service)
    for path in EVERY_PROCESS:
        served[path] = set(SERVICES)
    return served


def _concrete(template: str) -> str:
    """A request path for a route template: each `{parameter}` becomes a plausible id."""
    return re.sub(r"\{[^}]+\}", "0b0e9a3c-2f6e-4a4f-9c57-1f3c1d0e7a11", template)


def _stub(service: str) -> ThreadingHTTPServer:
    """An upstream that names itself in every answer, whatever the method or path."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = service.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def ingress(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """nginx with the shipped routes, each service's upstream a stub that names the service."""
    stubs = {service: _stub(service) for service in SERVICES}
    run_dir = tmp_path_factory.mktemp("ingress")
    replicas = tuple(split.Replica(s, 1, stub.server_address[1]) for s, stub in stubs.items())
    shape = split.SplitShape(run_dir.resolve(), free_port(), replicas)
    try:
        split.start_ingress(shape)
        deadline = time.monotonic() + 10
        while True:
            try:
                httpx.get(f"{shape.ingress_url}/", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield shape.ingress_url
    finally:
        split.stop(run_dir)
        for stub in stubs.values():
            stub.shutdown()


def test_every_route_of_every_target_reaches_a_service_that_serves_it(ingress: str) -> None:
    served = _served_paths()
    assert len(served) > 30, "the route tables were not read"
    misrouted = {}
    with httpx.Client(base_url=ingress, timeout=5) as client:
        for template, services in sorted(served.items()):
            answer = client.get(_concrete(template))
            reached = answer.text if answer.status_code == 200 else f"{answer.status_code} from nginx"
            if reached not in services:
                misrouted[template] = f"reached {reached}, served by {sorted(services)}"
    assert misrouted == {}


def test_an_unknown_path_is_the_contracts_404(ingress: str) -> None:
    answer = httpx.get(f"{ingress}/api/nothing-here", timeout=5)
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "not_found"
