"""(v3) The shipped ingress snippets, run as they are by real nginx (auth_request) and real Caddy
(forward_auth) in front of a small upstream, against Tollgate served over HTTP on the real stack.
For every outcome the caller sees the contract's status, body and headers, and the upstream
receives the caller's identity in X-Tollgate-* headers, never one the caller forged."""

import asyncio
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import uvicorn

from services.runtime.host import split
from tests.integration.test_edge_verify import service_token
from tests.integration.test_keys_api import bearer, new_key, signup
from tests.support.apps import REPO, free_port, running_app
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration
INGRESS = REPO / "deploy" / "ingress"
IDENTITY = ("X-Tollgate-Account", "X-Tollgate-Key", "X-Tollgate-User", "X-Tollgate-Role", "X-Tollgate-Plan")
FORGED = {name: "forged" for name in IDENTITY}


def _upstream() -> ThreadingHTTPServer:
    """The protected service: answers 200 with the X-Tollgate-* headers it received, as JSON."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            seen = {k: v for k, v in self.headers.items() if k.lower().startswith("x-tollgate-")}
            body = json.dumps({"received": seen}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass
class Stage:
    tollgate: str  # host:port of Tollgate over real HTTP
    upstream: str
    token: str  # a keys:verify service token
    client: httpx.AsyncClient  # Tollgate in process (ASGI), to make accounts and keys
    app: object


@pytest.fixture(scope="module")
async def stage(module_settings) -> AsyncIterator[Stage]:
    """Tollgate (every service, in this process) served over HTTP by uvicorn, trusting loopback
    proxies, a keys:verify token, and the upstream. One per module (its tests, here and in the
    modules that import it, make accounts and keys of their own, and give back what they take of
    the edge's admitted lane): one start, not one per test."""
    trusting = module_settings.model_copy(update={"trusted_proxies": ["127.0.0.1/32"]})
    async with running_app(trusting) as (app, client):
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="warning"))
        serving = asyncio.create_task(server.serve())
        upstream = _upstream()
        try:
            await wait_until(lambda: _started(server), timeout=10, interval=0.02)
            token = await service_token(client, trusting, ["keys:verify"], name="ingress")
            yield Stage(f"127.0.0.1:{port}", f"127.0.0.1:{upstream.server_address[1]}", token, client, app)
        finally:
            upstream.shutdown()
            server.should_exit = True
            await serving


async def _started(server: uvicorn.Server) -> bool:
    return server.started


@contextmanager
def nginx(stage: Stage, tmp: Path, tollgate: str | None = None) -> Iterator[str]:
    """deploy/ingress/nginx/example.conf with its addresses and token replaced, and its snippets."""
    for name in ("tollgate-server.conf", "tollgate-protect.conf"):
        shutil.copy(INGRESS / "nginx" / name, tmp / name)
    port = free_port()
    text = (INGRESS / "nginx" / "example.conf").read_text()
    for old, new in (
        ("server 127.0.0.1:8080;", f"server {tollgate or stage.tollgate};"),
        ("server 127.0.0.1:9000;", f"server {stage.upstream};"),
        ("listen 127.0.0.1:8443;", f"listen 127.0.0.1:{port};"),
        ("st-REPLACE_WITH_A_KEYS_VERIFY_TOKEN", stage.token),
    ):
        assert old in text, old
        text = text.replace(old, new)
    conf = tmp / "nginx.conf"
    conf.write_text(text)
    (tmp / "logs").mkdir(exist_ok=True)
    shape = split.SplitShape(tmp, port, ())
    proc = subprocess.Popen(split._nginx_cmd(shape, conf, foreground=True), stderr=subprocess.PIPE)
    try:
        _wait_listening(f"http://127.0.0.1:{port}/", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def caddy(stage: Stage, tmp: Path, tollgate: str | None = None) -> Iterator[str]:
    """deploy/ingress/Caddyfile as it is, its settings from the environment."""
    port = free_port()
    env = {
        **os.environ,
        "TOLLGATE_URL": tollgate or stage.tollgate,
        "TOLLGATE_SERVICE_TOKEN": stage.token,
        "UPSTREAM": stage.upstream,
        "LISTEN": f"http://127.0.0.1:{port}",
        "BIND": "127.0.0.1",
        "HOME": str(tmp),
        "XDG_DATA_HOME": str(tmp / "data"),
        "XDG_CONFIG_HOME": str(tmp / "config"),
    }
    command = ["caddy", "run", "--config", str(INGRESS / "Caddyfile"), "--adapter", "caddyfile"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait_listening(f"http://127.0.0.1:{port}/", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


INGRESSES = {"nginx": nginx, "caddy": caddy}


def _wait_listening(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 15
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the ingress exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _installed(name: str) -> bool:
    return shutil.which(name) is not None or Path(f"/usr/sbin/{name}").exists()


def _body(response: httpx.Response) -> dict:
    assert response.headers["content-type"].startswith("application/json"), response.headers
    return dict(response.json())


@pytest.mark.parametrize("kind", ["nginx", "caddy"])
async def test_every_outcome_reaches_the_caller_as_the_contract_says(stage: Stage, kind: str, tmp_path: Path):
    if not _installed(kind):
        pytest.fail(f"{kind} is not installed: `make test-prereqs` (deploy/local/prereqs.sh --test) installs it")
    client, edge = stage.client, stage.app.state.runtime.edge  # type: ignore[attr-defined]
    account, owner = await signup(client)
    key = await new_key(client, owner)
    disabled = await new_key(client, owner)
    await client.post(f"/api/api-keys/{disabled['id']}/toggle", headers=owner)
    with INGRESSES[kind](stage, tmp_path) as ingress:
        async with httpx.AsyncClient(base_url=ingress, timeout=10) as http:
            admitted = await http.get("/v1/models", headers={**bearer(key["key"]), **FORGED})
            assert admitted.status_code == 200, admitted.text
            received = {k.lower(): v for k, v in admitted.json()["received"].items()}
            assert received["x-tollgate-account"] == account["id"]
            assert received["x-tollgate-key"] == key["id"]
            assert received["x-tollgate-role"] == "owner" and received["x-tollgate-plan"] == "free"
            assert "forged" not in received.values()

            for headers, status, expected in (
                ({}, 401, "missing_credentials"),
                (bearer("sk-" + uuid.uuid4().hex * 2), 401, "invalid_api_key"),
                (bearer(disabled["key"]), 401, "api_key_disabled"),
            ):
                refused = await http.get("/v1/models", headers={**headers, **FORGED})
                assert (refused.status_code, _body(refused)["error"]["code"]) == (status, expected)
                assert refused.headers["www-authenticate"] == "Bearer"
                assert "received" not in refused.text  # the upstream never saw it

            # Overloaded: every place of Tollgate's admitted lane is taken. First the admitted call's
            # event is sent and its place free again, or its release after the places are taken
            # would let the next call in.
            async def flushed() -> bool:
                return edge.calls.lanes.open == 0

            await wait_until(flushed, timeout=10, interval=0.02)
            taken = 0
            while edge.calls.reserve():
                taken += 1
            try:
                overloaded = await http.get("/v1/models", headers=bearer(key["key"]))
            finally:
                for _ in range(taken):
                    edge.calls.release()
            assert (overloaded.status_code, _body(overloaded)["error"]["code"]) == (503, "overloaded")
            assert overloaded.headers["retry-after"] == "1"

            # Rate-limited: the free plan's burst, through the ingress.
            flooded = await new_key(client, owner)
            for _ in range(300):
                limited = await http.get("/v1/models", headers=bearer(flooded["key"]))
                if limited.status_code == 429:
                    break
            assert (limited.status_code, _body(limited)["error"]["code"]) == (429, "rate_limited")
            assert int(limited.headers["retry-after"]) >= 1
            assert "x-ratelimit-limit" in limited.headers

    # Insufficient quota (the location gates ai_tokens): another account whose tokens are spent.
    spent_account, spent_owner = await signup(client)
    spent_key = await new_key(client, spent_owner)
    await _exhaust_ai_tokens(stage, uuid.UUID(spent_account["id"]))
    with INGRESSES[kind](stage, tmp_path) as ingress:
        async with httpx.AsyncClient(base_url=ingress, timeout=10) as http:
            exhausted = await http.get("/v1/models", headers=bearer(spent_key["key"]))
            error = _body(exhausted)["error"]
            assert (exhausted.status_code, error["code"]) == (403, "insufficient_quota")
            assert error["details"]["resource"] == "ai_tokens" and error["details"]["links"]


@pytest.mark.parametrize("kind", ["nginx", "caddy"])
async def test_tollgate_unreachable_is_the_contracts_503_never_a_pass(stage: Stage, kind: str, tmp_path: Path):
    if not _installed(kind):
        pytest.fail(f"{kind} is not installed: `make test-prereqs` (deploy/local/prereqs.sh --test) installs it")
    _, owner = await signup(stage.client)
    key = await new_key(stage.client, owner)
    with INGRESSES[kind](stage, tmp_path, tollgate=f"127.0.0.1:{free_port()}") as ingress:
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.get(f"{ingress}/v1/models", headers={**bearer(key["key"]), **FORGED})
    assert (answer.status_code, _body(answer)["error"]["code"]) == (503, "service_unavailable")
    assert answer.headers["retry-after"] == "1"


@pytest.mark.parametrize("kind", ["nginx", "caddy"])
async def test_the_model_is_the_ingress_configs_never_the_callers(stage: Stage, kind: str, tmp_path: Path):
    """(v4) The example location calls `tollgate-fake/parrot-1`: a key allowed only `openai/*` is
    refused even when the caller names an allowed model in X-Tollgate-Model itself."""
    if not _installed(kind):
        pytest.fail(f"{kind} is not installed: `make test-prereqs` (deploy/local/prereqs.sh --test) installs it")
    _, owner = await signup(stage.client)
    openai_only = await new_key(stage.client, owner)
    parrot_only = await new_key(stage.client, owner)
    for key, allowed in ((openai_only, "openai/*"), (parrot_only, "tollgate-fake/*")):
        patched = await stage.client.patch(f"/api/api-keys/{key['id']}", headers=owner, json={"allowed_models": [allowed]})
        assert patched.status_code == 200, patched.text  # the answering process applied it already
    with INGRESSES[kind](stage, tmp_path) as ingress:
        async with httpx.AsyncClient(base_url=ingress, timeout=10) as http:
            forged = {"X-Tollgate-Model": "openai/gpt-4o"}
            refused = await http.get("/v1/models", headers={**bearer(openai_only["key"]), **forged})
            assert (refused.status_code, _body(refused)["error"]["code"]) == (403, "model_not_allowed")
            admitted = await http.get("/v1/models", headers={**bearer(parrot_only["key"]), **forged})
            assert admitted.status_code == 200, admitted.text


async def _exhaust_ai_tokens(stage: Stage, account_id: uuid.UUID) -> None:
    """Report the free plan's whole ai_tokens through the usage API; wait until the edge blocks."""
    from datetime import UTC, datetime

    from contracts.common import Resource, Tier
    from contracts.plans import catalogue

    total = catalogue()[Tier.FREE].quotas[Resource.AI_TOKENS]
    writer = await service_token(stage.client, stage.app.state.runtime.settings, ["usage:write"], name="gateway")  # type: ignore[attr-defined]
    event = {
        "id": str(uuid.uuid4()),
        "time": datetime.now(UTC).isoformat(),
        "account_id": str(account_id),
        "resource": "ai_tokens",
        "quantity": total,
        "provider": "openai",
        "model": "gpt-4o",
        "source": "test",
    }
    reported = await stage.client.post("/api/usage/events", json={"events": [event]}, headers=bearer(writer))
    assert reported.status_code == 202, reported.text
    edge = stage.app.state.runtime.edge  # type: ignore[attr-defined]

    async def blocked() -> bool:
        return bool(edge.quota.is_blocked(account_id, Resource.AI_TOKENS, datetime.now(UTC)))

    await wait_until(blocked, timeout=30)
