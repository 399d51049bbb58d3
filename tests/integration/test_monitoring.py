"""Monitoring on the real stack (docs/operations.md): a live `serve --workers 2` exposes every
metric the alert rules and the dashboard name, each HELP with its unit, no id in a label, and its
processes' CPU and memory added up; a real Prometheus scraping a metering process sees
TollgateClickHouseUnreachable fire when that process's ClickHouse stops, and resolve when it is back."""

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiokafka import AIOKafkaProducer
from faststream.kafka import KafkaBroker
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from contracts.common import Role
from contracts.topics import USAGE
from services.runtime.host import stack
from tests.integration.test_keys_api import PASSWORD, signup
from tests.integration.test_usage_rules import usage
from tests.support.apps import REPO, ServeProcess, free_port, spawned_pids
from tests.support.metering import publish_account, session_token, wait_until
from tests.support.monitoring import ALERTS, every_metric
from tests.support.service_tokens import service_headers

pytestmark = pytest.mark.integration
ALERT = "TollgateClickHouseUnreachable"


def scrape(base_url: str) -> list[Any]:
    return list(text_string_to_metric_families(httpx.get(f"{base_url}/metrics", timeout=10).text))


def sample_names(families: list[Any]) -> set[str]:
    return {sample.name for family in families for sample in family.samples}


def resident_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_a_live_scrape_exposes_every_metric_of_the_rules_and_the_dashboard(settings):
    settings = settings.model_copy(update={"consumer_lag_interval_seconds": 0.5})
    serve = ServeProcess(settings, "all", workers=2)  # the multiprocess shape: /metrics adds up three processes
    try:
        serve.wait_ready()
        async with httpx.AsyncClient(base_url=serve.base_url, timeout=10) as http:
            # a write that goes through an outbox and keys.v1: consumer groups commit, lag is read
            body = {"email": f"m{uuid.uuid4().hex[:8]}@example.com", "password": PASSWORD, "name": "M", "user_type": "enterprise"}
            assert (await http.post("/api/auth/register", json=body)).status_code == 201

        async def complete() -> list[Any] | None:
            families = scrape(serve.base_url)
            return families if every_metric() <= sample_names(families) else None

        try:
            families = await wait_until(complete, timeout=60)
        except TimeoutError:
            missing = every_metric() - sample_names(scrape(serve.base_url))
            raise AssertionError(f"named by a rule or a panel, not on /metrics: {sorted(missing)}") from None

        ours = [family for family in families if family.name.startswith("tollgate_")]
        for family in ours:
            assert family.documentation.endswith(")") and "(unit: " in family.documentation, family
            labels = {label for sample in family.samples for label in sample.labels}
            assert not labels & {"account_id", "key_id", "user_id", "account", "key", "user"}, family.name
        values = {sample.name: sample.value for family in ours for sample in family.samples if not sample.labels}
        processes = spawned_pids(serve.proc.pid)
        assert len(processes) == 3  # two workers and the consumers
        assert values["tollgate_process_cpu_seconds_total"] > 0
        # the live processes' memory, added up (read a moment apart: within a third)
        alive = sum(resident_bytes(pid) for pid in processes)
        assert alive * 0.66 < values["tollgate_process_resident_memory_bytes"] < alive * 1.5
    finally:
        serve.stop()


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_ingest_sink_and_quota_count_what_happens_at_their_stage(app_client, settings):
    """The counters move where the thing happens: the endpoint's accepted, duplicate and refused
    events, the sink's and the quota consumer's dead letters by reason, writes and batches."""
    _, client = app_client
    account, _console = await signup(client)
    service = await service_headers(client, settings)
    metrics = {
        "accepted": ("tollgate_metering_ingest_events_total", {"outcome": "accepted"}),
        "duplicate": ("tollgate_metering_ingest_events_total", {"outcome": "duplicate"}),
        "refused": ("tollgate_metering_ingest_refused_events_total", {"reason": "rules_broken"}),
        "malformed": ("tollgate_metering_sink_dead_lettered_total", {"topic": "usage.v1", "reason": "malformed"}),
        "dead_lettered": ("tollgate_dead_lettered_total", {"topic": "usage.v1"}),
        "inserted": ("tollgate_metering_sink_events_total", {"topic": "usage.v1", "outcome": "inserted"}),
        "batches": ("tollgate_metering_sink_batch_events_count", {"topic": "usage.v1"}),
        "inserts": ("tollgate_metering_sink_insert_seconds_count", {"topic": "usage.v1"}),
        "counted": ("tollgate_quota_events_counted_total", {"topic": "usage.v1"}),
        "states": ("tollgate_quota_states_published_total", {"blocked": "false"}),
    }
    before = {key: value(name, **labels) for key, (name, labels) in metrics.items()}

    def moved() -> dict[str, float]:
        return {key: value(name, **labels) - before[key] for key, (name, labels) in metrics.items()}

    good = usage(account["id"], 30, input_tokens=10, output_tokens=20)
    refused = await client.post("/api/usage/events", json={"events": [good, usage(account["id"], -1)]}, headers=service)
    assert refused.status_code == 422
    assert (await client.post("/api/usage/events", json={"events": [good]}, headers=service)).status_code == 202
    assert (await client.post("/api/usage/events", json={"events": [good]}, headers=service)).json()["duplicates"] == 1
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(settings.topic(USAGE.name), b"{not json", key=account["id"].encode())
    finally:
        await producer.stop()

    expected = {"accepted": 1, "duplicate": 1, "refused": 2, "malformed": 1, "dead_lettered": 2}  # 2: quota's and the sink's
    expected |= {"inserted": 1, "counted": 1}

    async def settled() -> bool:
        now = moved()
        return all(now[key] == count for key, count in expected.items())

    try:
        await wait_until(settled, timeout=30)
    except TimeoutError:
        raise AssertionError(f"moved: {moved()}, expected: {expected}") from None
    assert moved()["batches"] >= 1 and moved()["inserts"] >= 1 and moved()["states"] >= 1


# ---- a real Prometheus, ClickHouse stopped and started --------------------------------------------
@pytest.fixture
def own_clickhouse() -> Iterator[stack.StackConfig]:
    """A ClickHouse server of this test's own (the shared stack's is never stopped). Under the
    repo, not /tmp/pytest-of-root (0700): the server's user must reach its folder."""
    cfg = stack.StackConfig(
        state_dir=REPO / ".tollgate" / f"ch-{uuid.uuid4().hex[:8]}",
        clickhouse_http_port=free_port(),
        clickhouse_tcp_port=free_port(),
        clickhouse_extra_databases=("t_*",),
    )
    stack.clickhouse_up(cfg)
    try:
        yield cfg
    finally:
        stack.clickhouse_down(cfg)
        shutil.rmtree(cfg.state_dir, ignore_errors=True)


def short_for_rules(folder: Path) -> Path:
    """alerts.yml with every `for:` shortened to 2 s (the test cannot wait a minute per state)."""
    document = yaml.safe_load(ALERTS.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "2s"
    path = folder / "alerts.yml"
    path.write_text(yaml.safe_dump(document))
    return path


class Prometheus:
    """Debian's `prometheus` on a free loopback port, scraping `target` every second."""

    def __init__(self, folder: Path, target: str, rules: Path) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is missing: install Debian's `prometheus` package (deploy/local/prereqs.sh --test)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "tollgate", "static_configs": [{"targets": [target]}]}],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log_path = folder / "prometheus.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={folder / 'prometheus.yml'}",
                    f"--storage.tsdb.path={folder / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def alert_state(self, name: str) -> str | None:
        """`pending`, `firing`, or None when the alert is not active."""
        alerts = httpx.get(f"{self.url}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        return next((a["state"] for a in alerts if a["labels"]["alertname"] == name), None)

    def query(self, expr: str) -> list[Any]:
        return list(httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5).json()["data"]["result"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"waited {timeout:.0f} s for {what}")


async def test_prometheus_fires_clickhouse_unreachable_when_it_stops_and_resolves_it_when_it_is_back(
    settings, own_clickhouse, tmp_path
):
    settings = settings.model_copy(update={"clickhouse_dsn": own_clickhouse.clickhouse_dsn})
    serve = ServeProcess(settings, "metering")
    serve.wait_ready()
    prometheus: Prometheus | None = None
    try:
        prometheus = Prometheus(tmp_path, f"127.0.0.1:{serve.port}", short_for_rules(tmp_path))
        up = 'tollgate_dependency_up{dependency="clickhouse"}'
        wait_for(lambda: [r["value"][1] for r in prometheus.query(up)] == ["1"], 60, "Prometheus to scrape ClickHouse up")
        assert prometheus.alert_state(ALERT) is None
        # A customer reading analytics meanwhile: 200 now, the contract's 503 while ClickHouse is away.
        account_id = uuid.uuid4()
        async with KafkaBroker(settings.kafka_bootstrap_servers) as broker:
            await publish_account(broker, settings, account_id, [Role.OWNER])
        overview = f"{serve.base_url}/api/ai/usage/overview?range=week"
        console = {"Authorization": f"Bearer {session_token(settings, account_id)}"}
        wait_for(lambda: httpx.get(overview, headers=console, timeout=5).status_code == 200, 30, "the overview")

        stack.clickhouse_down(own_clickhouse)
        async with httpx.AsyncClient(timeout=10) as http:
            down = await http.get(overview, headers=console)
        assert (down.status_code, down.json()["error"]["code"]) == (503, "service_unavailable"), down.text
        assert down.headers["Retry-After"]
        wait_for(lambda: prometheus.alert_state(ALERT) == "firing", 60, f"{ALERT} to fire")

        stack.clickhouse_up(own_clickhouse)
        wait_for(lambda: prometheus.alert_state(ALERT) is None, 60, f"{ALERT} to resolve")
        assert prometheus.alert_state("TollgateDown") is None  # the process itself kept answering
    finally:
        if prometheus is not None:
            prometheus.stop()
        serve.stop()
