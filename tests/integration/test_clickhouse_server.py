"""The local stack's ClickHouse server (services/runtime/host/chserver.py) as a real process: it runs as
`nobody` holding CAP_SYS_NICE alone (so the analyst's queries really run at nice 19), keeps its
data across SIGTERM and SIGKILL, refuses a second launcher and a taken port (and never reports
ready on another server's port), and Tollgate rides out its outage: /readyz says so, the metering
sink commits no offsets while it is down and catches up exactly after."""

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from contracts.topics import USAGE
from services.metering.consumers import SINK_EVENTS
from services.runtime.host import backup, capabilities, stack
from services.runtime.host.chserver import ServerSpec, sha256_hex
from services.runtime.platform import clickhouse
from services.runtime.platform.kafka import ensure_topics
from tests.support.apps import REPO, free_port, niceness, running_app
from tests.support.backfill import produce, stamp, usage
from tests.support.metering import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def own_server() -> Iterator[stack.StackConfig]:
    """A ClickHouse server of this test's own (it gets stopped), on free ports. Under the repo,
    not /tmp/pytest-of-root (0700): the server's user must reach its folder."""
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


def _pid(cfg: stack.StackConfig) -> int:
    return int((cfg.state_dir / "clickhouse.pid").read_text())


def _count(cfg: stack.StackConfig, table: str) -> int:
    client = clickhouse.connect(cfg.clickhouse_dsn)
    try:
        return int(client.query(f"SELECT count() FROM {table}").result_rows[0][0])
    finally:
        client.close()


def _launch(instance: Path, spec: ServerSpec) -> subprocess.CompletedProcess[str]:
    """The server's launcher on its own, in the foreground (what `clickhouse_up` starts)."""
    return subprocess.run(
        [sys.executable, "-m", "services.runtime.host.chserver", str(instance)],
        env={**os.environ, **spec.to_env()},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_runs_unprivileged_keeps_data_and_refuses_a_second_owner_or_a_taken_port(own_server):
    cfg = own_server
    proc_status = open(f"/proc/{_pid(cfg)}/status").read().splitlines()
    uids = next(line for line in proc_status if line.startswith("Uid:")).split()[1:]
    assert set(uids) == {str(65534)}  # nobody, real and effective
    assert capabilities.effective(_pid(cfg)) == 1 << capabilities.CAP_SYS_NICE  # that one alone
    assert os.stat(cfg.state_dir / "clickhouse" / "data").st_uid == 65534

    client = clickhouse.connect(cfg.clickhouse_dsn)
    client.command("CREATE DATABASE tollgate")
    client.command("CREATE TABLE tollgate.kept (n UInt32) ENGINE = MergeTree ORDER BY n")
    client.command("INSERT INTO tollgate.kept SELECT number FROM numbers(1000)")
    client.close()

    stack.clickhouse_down(cfg)  # SIGTERM: a clean stop
    assert not stack.status(cfg)["clickhouse"].startswith("running")
    stack.clickhouse_up(cfg)
    assert _count(cfg, "tollgate.kept") == 1000

    os.killpg(_pid(cfg), signal.SIGKILL)  # no clean stop at all
    assert stack._wait_gone(_pid(cfg), 10)
    stack.clickhouse_up(cfg)
    assert _count(cfg, "tollgate.kept") == 1000

    # A second launcher on the live instance exits non-zero and leaves its files alone.
    users = cfg.state_dir / "clickhouse" / "users.xml"
    before = users.read_bytes()
    second = _launch(cfg.state_dir / "clickhouse", ServerSpec(free_port(), free_port(), "other", "pw", "00", "00"))
    assert second.returncode != 0 and "in use" in second.stderr, second.stderr
    assert users.read_bytes() == before

    # Another instance on the same (taken) ports: `up` names them and starts nothing, so it never
    # takes the first server's answers for its own.
    clash = replace(cfg, state_dir=REPO / ".tollgate" / f"ch-{uuid.uuid4().hex[:8]}")
    taken = rf"clickhouse: port {cfg.clickhouse_http_port}, {cfg.clickhouse_tcp_port} on 127.0.0.1 is already in use"
    try:
        with pytest.raises(SystemExit, match=taken):
            stack.clickhouse_up(clash, timeout=60)
        assert not (clash.state_dir / "clickhouse.pid").exists()
        # Taken between that look and the start: the engine cannot listen and its launcher exits non-zero.
        ports = (cfg.clickhouse_http_port, cfg.clickhouse_tcp_port)
        third = _launch(clash.state_dir / "clickhouse", ServerSpec(*ports, "clash", "pw", sha256_hex("a"), sha256_hex("b")))
        assert third.returncode != 0 and "Address already in use" in third.stdout + third.stderr, third.stderr[-2000:]
    finally:
        stack.clickhouse_down(clash)
        shutil.rmtree(clash.state_dir, ignore_errors=True)
    assert _count(cfg, "tollgate.kept") == 1000  # the first server is untouched


async def _committed(settings, group: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(settings.group(group))
    finally:
        await admin.close()
    return sum(max(meta.offset, 0) for tp, meta in offsets.items() if tp.topic == settings.topic(USAGE.name))


async def test_server_stopped_under_load_readyz_says_so_offsets_wait_and_the_sink_catches_up(settings, own_server):
    cfg = own_server
    settings = settings.model_copy(update={"clickhouse_dsn": cfg.clickhouse_dsn})
    await ensure_topics(settings)
    account = uuid.uuid4()
    events = [usage(account, n) for n in range(40_000)]
    topic, key = settings.topic(USAGE.name), str(account).encode()
    records = [(topic, key, e.model_dump_json().encode(), stamp(e)) for e in events]
    table = f"{settings.clickhouse_database}.usage_events"

    def sink_counts() -> dict[str, float]:  # this process's sink: to tell a dead letter from a lost write
        return {o: SINK_EVENTS.labels(USAGE.name, o)._value.get() for o in ("inserted", "duplicate", "dead_lettered")}

    before = sink_counts()
    async with running_app(settings, targets=("metering",)) as (_, client):
        assert (await client.get("/readyz")).status_code == 200
        producing = asyncio.create_task(produce(settings, records[:20_000]))

        async def some_written() -> bool:
            return await asyncio.to_thread(_count, cfg, table) > 0

        await wait_until(some_written, timeout=60, interval=0.05)
        await asyncio.to_thread(stack.clickhouse_down, cfg)  # a real process stop, mid-stream
        await producing
        await produce(settings, records[20_000:])  # and more arrives while it is down

        down = await client.get("/readyz")
        assert down.status_code == 503
        assert down.json()["checks"]["clickhouse"] == "unavailable"
        committed = await _committed(settings, "metering.usage")
        await asyncio.sleep(3)  # the sink keeps retrying meanwhile
        assert await _committed(settings, "metering.usage") == committed < len(records)

        await asyncio.to_thread(stack.clickhouse_up, cfg)

        async def caught_up() -> bool:
            return await _committed(settings, "metering.usage") == len(records)

        await wait_until(caught_up, timeout=120, interval=0.2)
        assert (await client.get("/readyz")).status_code == 200
    ch = clickhouse.connect(cfg.clickhouse_dsn)
    try:
        rows, ids = ch.query(f"SELECT count(), uniqExact(id) FROM {table}").result_rows[0]
    finally:
        ch.close()
    counted = {o: n - before[o] for o, n in sink_counts().items()}
    assert (rows, ids) == (len(events), len(events)), counted  # nothing lost, nothing twice


def test_native_protocol_serves_the_app_and_the_read_only_analyst(own_server):
    driver = pytest.importorskip("clickhouse_driver")  # a dev dependency (pyproject.toml)
    cfg = own_server
    tcp = f"127.0.0.1:{cfg.clickhouse_tcp_port}"
    app = driver.Client.from_url(f"clickhouse://tollgate:{cfg.passwords()['tollgate']}@{tcp}/default")
    app.execute("CREATE DATABASE IF NOT EXISTS tollgate")
    app.execute("CREATE TABLE tollgate.native (n UInt32, s String) ENGINE = MergeTree ORDER BY n")
    app.execute("INSERT INTO tollgate.native (n, s) VALUES", [(i, f"row {i}") for i in range(100)])
    analyst = driver.Client.from_url(cfg.analyst_dsns()["native"])
    assert analyst.execute("SELECT count(), sum(n) FROM native") == [(100, 4950)]
    with pytest.raises(driver.errors.ServerException) as refused:
        analyst.execute("INSERT INTO tollgate.native (n, s) VALUES", [(1000, "x")])
    assert refused.value.code == 497  # ACCESS_DENIED
    with pytest.raises(driver.errors.ServerException):
        driver.Client.from_url(f"clickhouse://analyst:wrong@{tcp}/tollgate").execute("SELECT 1")
    assert analyst.execute("SELECT count() FROM native") == [(100,)]


def _nice_values(pid: int) -> list[int]:
    """The nice value of each of a process's threads (/proc/TID/stat answers for a thread too)."""
    values = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            values.append(niceness(int(task)))
        except FileNotFoundError:  # the thread ended
            continue
    return values


def _slow_table(cfg: stack.StackConfig) -> None:
    """tollgate.slow, 40 rows, made as the application: what the analysts' slow queries read."""
    app = clickhouse.connect(cfg.clickhouse_dsn)
    app.command("CREATE DATABASE tollgate")
    app.command("CREATE TABLE tollgate.slow (n UInt32) ENGINE = MergeTree ORDER BY n")
    app.command("INSERT INTO tollgate.slow SELECT number FROM numbers(40)")
    app.close()


def _niceness_while(cfg: stack.StackConfig, dsn: str) -> set[int]:
    """The server's thread nice values seen while `dsn`'s user runs a 2-second query."""
    client = clickhouse.connect(dsn)
    seen: set[int] = set()
    done = threading.Event()

    def query() -> None:
        try:
            client.query("SELECT sum(sleepEachRow(0.05)) FROM tollgate.slow")  # 40 rows: 2 s
        finally:
            done.set()

    worker = threading.Thread(target=query)
    worker.start()
    while not done.wait(0.05):
        seen.update(_nice_values(_pid(cfg)))
    worker.join()
    client.close()
    return seen


def test_the_analysts_queries_run_at_nice_19_and_tollgates_own_do_not(own_server):
    cfg = own_server
    _slow_table(cfg)
    assert 19 not in _niceness_while(cfg, cfg.clickhouse_dsn)
    assert 19 in _niceness_while(cfg, cfg.analyst_dsns()["http"])


def test_only_the_launchers_ctl_backs_up_and_only_into_the_backups_folder(own_server):
    """`tollgate backup`/`restore` (services/runtime/host/backup.py) need BACKUP and READ, WRITE ON
    FILE: the launcher's `ctl` has them; the application and the analyst do not, and ctl's File
    backups are confined to the data path's backups folder."""
    cfg = own_server
    app = clickhouse.connect(cfg.clickhouse_dsn)
    app.command("CREATE DATABASE IF NOT EXISTS tollgate")
    app.command("CREATE TABLE tollgate.kept (n UInt32) ENGINE = MergeTree ORDER BY n")
    app.command("INSERT INTO tollgate.kept SELECT number FROM numbers(10)")
    for dsn in (cfg.clickhouse_dsn, cfg.analyst_dsns()["http"]):
        refused = httpx.post(dsn, content="BACKUP DATABASE tollgate TO File('stolen')", timeout=10)
        assert refused.status_code != 200 and "ACCESS_DENIED" in refused.text, refused.text
    outside = backup._ch_response(cfg, "BACKUP DATABASE tollgate TO File('/tmp/outside')")
    assert outside.status_code != 200 and "not allowed" in outside.text.lower(), outside.text
    backup._ch(cfg, "BACKUP DATABASE tollgate TO File('mine')")
    assert (cfg.state_dir / "clickhouse" / "data" / "backups" / "mine" / ".backup").exists()
    app.close()


def test_the_analysts_queries_together_are_bounded(own_server):
    """Each analyst query is limited, and so are all of them at once: their memory in total, and
    how many run (a fifth beside four is refused: TOO_MANY_SIMULTANEOUS_QUERIES), so that a
    dashboard's many panels cannot hold N x 2 GB of the server's memory."""
    cfg = own_server
    _slow_table(cfg)
    analysts = [clickhouse.connect(cfg.analyst_dsns()["http"]) for _ in range(5)]
    limits = (
        analysts[0]
        .query("SELECT getSetting('max_memory_usage_for_user'), getSetting('max_concurrent_queries_for_user')")
        .result_rows[0]
    )
    assert (int(limits[0]), int(limits[1])) == (2_000_000_000, 4)
    slow = [threading.Thread(target=c.query, args=("SELECT sum(sleepEachRow(0.05)) FROM tollgate.slow",)) for c in analysts[:4]]
    for worker in slow:
        worker.start()
    try:
        threading.Event().wait(0.7)  # the four are running (each takes 2 s)
        with pytest.raises(Exception, match=r"TOO_MANY_SIMULTANEOUS_QUERIES|202"):
            analysts[4].query("SELECT 1")
    finally:
        for worker in slow:
            worker.join()
        for client in analysts:
            client.close()
