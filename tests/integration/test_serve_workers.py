"""`tollgate serve --workers 2`: two processes on one port and one of consumers keep the guarantees of one.

Which worker takes a connection is the kernel's choice: the test sends calls concurrently on
fresh connections and reads, from the workers' own metric files (prometheus multiprocess mode),
which worker served what. Both must serve; a key toggled off is refused by both within the
contract's second; the consumers run niced in their own process, and when it is SIGKILLed with
calls not yet counted, its replacement counts them: every admitted call is counted once in
`api_calls` and stored once for the activity log; /metrics adds up every process; a worker that
dies is replaced while the other answers.
"""

import asyncio
import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from contracts.rate_limit import RateLimit
from services.runtime.host.workers import CONSUMERS_NICENESS
from tests.integration.test_edge_rate_limit import publish_plan
from tests.integration.test_keys_api import PASSWORD, bearer, code
from tests.support.apps import ServeProcess, consumers_pids, niceness, worker_pids
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration
GEO = "/api/geo/projects"
CLOSE = {"Connection": "close"}  # a new connection per request: the worker that accepts it serves it
SERVED = "tollgate_http_request_seconds_count"


def listening(port: int) -> int:
    """Sockets listening on `port` (one per started worker: each has its own, SO_REUSEPORT)."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for row in rows if row.split()[1].endswith(f":{port:04X}") and row.split()[3] == "0A")


def metrics_dir(pid: int) -> Path:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return Path(next(v for v in environ if v.startswith(b"PROMETHEUS_MULTIPROC_DIR=")).split(b"=", 1)[1].decode())


def geo_calls_by_worker(folder: Path, status: str) -> Counter[int]:
    """Calls of GEO answered with `status`, per worker pid, from each worker's own histogram file."""
    served: Counter[int] = Counter()
    for path in folder.glob("histogram_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        for metric in MultiProcessCollector.merge([str(path)]):
            for sample in metric.samples:
                if sample.name == SERVED and sample.labels.get("route") == GEO and sample.labels.get("status") == status:
                    served[pid] += int(sample.value)
    return served


async def calls(http: httpx.AsyncClient, secret: str, n: int) -> list[httpx.Response]:
    """`n` calls at once, each on a connection of its own."""
    return list(await asyncio.gather(*(http.get(GEO, headers={**bearer(secret), **CLOSE}) for _ in range(n))))


async def test_two_workers_on_one_port_keep_toggles_metering_and_metrics(settings):
    serve = ServeProcess(settings, "all", workers=2)
    try:
        serve.wait_ready()
        workers = await wait_until(lambda: _two_workers(serve.proc.pid), timeout=30)
        (consumers,) = await wait_until(lambda: _consumers(serve.proc.pid), timeout=30)
        assert niceness(consumers) == niceness(workers[0]) + CONSUMERS_NICENESS

        async def both_listening() -> bool:
            return listening(serve.port) >= 2

        await wait_until(both_listening, timeout=60)
        folder = metrics_dir(workers[0])
        limits = httpx.Limits(max_connections=20)
        async with httpx.AsyncClient(base_url=serve.base_url, timeout=10, limits=limits) as http:
            email = "workers@example.com"
            body = {"email": email, "password": PASSWORD, "name": "W", "user_type": "enterprise"}
            registered = await http.post("/api/auth/register", json=body, headers=CLOSE)
            assert registered.status_code == 201
            # rate limits that leave room for bursts (the free plan's would answer 429)
            roomy = RateLimit(per_second=10_000, burst=10_000, per_minute=1_000_000)
            await publish_plan(settings, uuid.UUID(registered.json()["id"]), roomy)
            login = await http.post("/api/auth/login", json={"email": email, "password": PASSWORD}, headers=CLOSE)
            console = {**bearer(login.json()["access_token"]), **CLOSE}
            key = (await http.post("/api/api-keys", json={"name": "w"}, headers=console)).json()

            # Until both workers have learnt the key (keys.v1), then a burst both serve.
            async def all_admitted() -> bool:
                return all(r.status_code == 200 for r in await calls(http, key["key"], 20))

            await wait_until(all_admitted, timeout=10)
            await calls(http, key["key"], 60)
            admitted_by = geo_calls_by_worker(folder, "200")
            assert sorted(admitted_by) == workers, f"calls served per worker: {dict(admitted_by)}"

            # Toggled off: refused by every worker within the contract's 1 s.
            off = await http.post(f"/api/api-keys/{key['id']}/toggle", headers=console)
            assert off.json()["status"] == "disabled"
            toggled = time.monotonic()
            while True:
                burst = await calls(http, key["key"], 10)
                if all(r.status_code == 401 for r in burst):
                    break
                assert time.monotonic() - toggled < 1.0, "a worker still admits the key 1 s after the toggle"
            assert {code(r) for r in burst} == {"api_key_disabled"}
            assert {r.status_code for r in await calls(http, key["key"], 60)} == {401}
            assert sorted(geo_calls_by_worker(folder, "401")) == workers
            admitted = sum(geo_calls_by_worker(folder, "200").values())  # + those admitted before the toggle landed

            # The consumers killed at once, whatever they had not counted or stored yet: their
            # replacement does (offsets are committed only after the writes).
            os.kill(consumers, signal.SIGKILL)
            await wait_until(lambda: _consumers(serve.proc.pid, without=consumers), timeout=30)

            # Every admitted call counted once, whichever worker served it.
            async def api_calls_used() -> int:
                quota = (await http.get("/api/billing/check-quota", headers=console)).json()
                return int(next(i["used"] for i in quota["items"] if i["resource"] == "api_calls"))

            async def all_counted() -> bool:
                return await api_calls_used() >= admitted

            await wait_until(all_counted, timeout=60)  # the killed consumers' session expires first
            await asyncio.sleep(1)
            assert await api_calls_used() == admitted

            async def logged_admitted() -> int:
                logged, cursor = 0, None
                while True:
                    params = {"outcome": "admitted", "limit": 200, **({"cursor": cursor} if cursor else {})}
                    page = await http.get("/api/activity-log", params=params, headers=console)
                    assert page.status_code == 200, page.text
                    logged += len(page.json()["items"])
                    if not (cursor := page.json()["next_cursor"]):
                        return logged

            async def all_logged() -> bool:
                return await logged_admitted() >= admitted

            await wait_until(all_logged, timeout=60)
            assert await logged_admitted() == admitted

            # /metrics, answered by either worker, adds up both.
            metrics = (await http.get("/metrics", headers=CLOSE)).text
            scraped = sum(
                float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith(SERVED) and f'route="{GEO}"' in line and 'status="200"' in line
            )
            assert scraped == admitted

            # A worker that dies is replaced; the other answers meanwhile. (Connections the kernel
            # had queued on the dying worker's socket are reset: the test asks once that socket is
            # closed. A zombie is not enough: its leader thread is, while its other threads still
            # exit and hold the socket open.)
            os.kill(workers[0], signal.SIGKILL)

            async def killed_ones_socket_closed() -> bool:
                return listening(serve.port) == 1

            await wait_until(killed_ones_socket_closed, timeout=10)
            assert (await http.get("/healthz", headers=CLOSE)).status_code == 200
            replaced = await wait_until(lambda: _two_workers(serve.proc.pid, without=workers[0]), timeout=30)
            assert len(replaced) == 2, replaced
    finally:
        serve.kill()


async def _two_workers(parent: int, without: int | None = None) -> list[int]:
    pids = [pid for pid in worker_pids(parent) if pid != without]
    return pids if len(pids) == 2 else []


async def _consumers(parent: int, without: int | None = None) -> list[int]:
    return [pid for pid in consumers_pids(parent) if pid != without]


async def test_every_known_counter_series_is_on_metrics_at_0_before_anything_happened(settings):
    """An alert on a counter needs its series before the first event (a series that appears at 5 has
    no increase to see): every labelled counter whose label values are known is exported at 0 by a
    fresh `serve --workers 2`, added up over its processes."""
    expected = {
        ("tollgate_edge_call_events_dropped_total", (("reason", reason),)) for reason in ("refused_fold_full", "shutdown")
    }
    expected |= {
        ("tollgate_metering_sink_events_total", (("outcome", outcome), ("topic", topic)))
        for topic in ("usage.v1", "calls.v1")
        for outcome in ("inserted", "duplicate", "dead_lettered", "lost")
    }
    expected |= {
        ("tollgate_pruned_rows_total", (("table", table),))
        for table in ("metering.ingested_events", "billing.idempotency_keys", "keys.outbox", "billing.outbox", "geo.outbox")
    }
    serve = ServeProcess(settings, "all", workers=2)
    try:
        serve.wait_ready()
        async with httpx.AsyncClient(base_url=serve.base_url, timeout=10) as http:

            async def missing() -> set[tuple[str, tuple[tuple[str, str], ...]]]:
                samples = {
                    (sample.name, tuple(sorted(sample.labels.items()))): sample.value
                    for family in text_string_to_metric_families((await http.get("/metrics")).text)
                    for sample in family.samples
                }
                return {series for series in expected if samples.get(series) != 0.0}

            async def none_missing() -> bool:
                return not await missing()

            try:  # the consumers' process (the metering sink) starts a little after the workers answer
                await wait_until(none_missing, timeout=30)
            except TimeoutError:
                pytest.fail(f"not on /metrics at 0: {sorted(await missing())}")
    finally:
        serve.kill()
