"""Scale-out on this machine (issue #20): a three-node Kafka cluster (RF 3, min.insync.replicas 2)
and `up --split` (one process per service, two replicas of geo and metering, behind nginx), on a
stack of its own ports. Figures measured in one run:

1. toggle -> refused on the other replicas: a key toggled off on the keys process, both geo
   replicas polled back to back until they answer 401 api_key_disabled; p50/p99/max over
   --toggles (goal p99 <= 10 ms, contract max 1 s). A poll's own duration (an admitted call, tens
   of ms on this machine) bounds that figure's resolution, so also: one call to each replica sent
   0, 2, 5 and 10 ms after the toggle's response, one trial at a time, --toggles trials each
   (the fraction refused by both is the lag's distribution at that point, as a caller meets it);
2. cross-replica overshoot on the cluster: bench/admissions.py (3 replicas, --callers concurrent
   callers, api_calls; goal <= 1 per replica) and bench/geo_overshoot.py (3 replicas; goal 0),
   run as they are with TEST_* pointing at this cluster and KAFKA_REPLICATION_FACTOR=3;
3. throughput, split vs `--target all`: wrk on an admitted, metered API-key call
   (GET /api/geo/projects, enterprise keys) through the ingress vs one `serve --target all`
   on the same stack (ratio);
4. the cost of acks=all with RF 3 vs RF 1: the same producer (Tollgate's PRODUCER_CONFIG)
   sending the same records one at a time (a request's publish) and in bulk, to a topic of
   each replication factor on the same cluster (ratio);
5. recovery after a broker kill: one tenant's usage reported through the ingress at a steady rate
   (one key: one partition of usage.v1), that partition's leader SIGKILLed; per consumer group of
   usage.v1, the time from the kill to its first commit past the partition's end at the kill (a
   batch holding an event reported after the kill).

    .venv/bin/python bench/scale.py [--toggles 200] [--delays 0,2,5,10] [--callers 200] [--seconds 10] [--skip overshoot,...]
"""

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import TopicPartition

from bench.http_load import WRK_SCRIPT, tenant, wrk
from bench.stats import percentile, ratio_line
from contracts.topics import USAGE
from services.runtime.host import split, stack
from services.runtime.platform.kafka import PRODUCER_CONFIG
from services.runtime.platform.settings import Settings
from tests.support import databases
from tests.support.apps import REPO, ServeProcess, settings_env
from tests.support.infra import drop_clickhouse_database
from tests.support.platform import client, new_service_token, new_tenant, usage_event

# Its own ports, clear of the test, fault and scale-test stacks (tests/faults/test_scale_cluster.py).
BENCH_STACK = stack.StackConfig(
    state_dir=REPO / ".tollgate" / "bench-scale",
    kafka_nodes=3,
    kafka_port=27700,
    controller_port=27701,
    postgres_port=27732,
    clickhouse_http_port=27723,
    clickhouse_tcp_port=27790,
    redis_port=27779,
    clickhouse_extra_databases=("b_*", "t_*"),
)
INGRESS_PORT, FIRST_REPLICA_PORT, ALL_PORT = 27750, 27751, 27760


def _ms(samples_s: list[float]) -> str:
    ms = [s * 1000 for s in samples_s]
    if not ms:
        return "none (n=0)"
    return f"p50={percentile(ms, 50):.2f}ms p99={percentile(ms, 99):.2f}ms max={max(ms):.2f}ms n={len(ms)}"


def _settings(tag: str) -> Settings:
    return Settings(
        kafka_bootstrap_servers=BENCH_STACK.kafka_bootstrap,
        kafka_replication_factor=3,
        database_url=databases.create_empty(BENCH_STACK.database_url, f"b_{tag}"),
        clickhouse_dsn=BENCH_STACK.clickhouse_dsn,
        clickhouse_database=f"b_{tag}",
        redis_url=BENCH_STACK.redis_url,
        topic_prefix=f"b{tag}.",
        session_secret=f"bench-{tag}",
        admin_token=f"admin-{tag}",
        trusted_proxies=["127.0.0.1/32"],
        log_level="WARNING",
    )


# ---- 1. toggle -> refused on the other replicas ---------------------------------------------------
async def toggles(shape: split.SplitShape, n: int) -> tuple[list[float], list[float]]:
    """The lags, and how long each accepted poll took: a refusal shows up only in a poll sent after
    the replica applied the toggle, so one poll's duration is the resolution of a lag."""
    keys, geos = shape.of("keys")[0], shape.of("geo")
    polls: list[float] = []
    async with client(30) as http:
        t = await new_tenant(http, _ingress(shape))
        auth = t.api_key()

        async def until(base_url: str, refused: bool) -> float:
            started = time.perf_counter()
            while True:
                sent = time.perf_counter()
                response = await http.get(f"{base_url}/api/geo/projects", headers=auth)
                if refused and response.status_code == 200:
                    polls.append(time.perf_counter() - sent)
                if (response.status_code == 401) == refused:
                    return time.perf_counter() - started
                if time.perf_counter() - started > 5:
                    raise RuntimeError(f"{base_url}: still {response.status_code} after 5 s")

        await asyncio.gather(*(until(g.base_url, False) for g in geos))
        lags: list[float] = []
        for _ in range(n):
            off = await http.post(f"{keys.base_url}/api/api-keys/{t.key_id}/toggle", headers=t.console())
            assert off.json()["status"] == "disabled", off.text
            # the slower of the two replicas: refused by EVERY other replica
            lags.append(max(await asyncio.gather(*(until(g.base_url, True) for g in geos))))
            await http.post(f"{keys.base_url}/api/api-keys/{t.key_id}/toggle", headers=t.console())
            await asyncio.gather(*(until(g.base_url, False) for g in geos))
        return lags, polls


@dataclass
class Trial:
    sent_ms: float  # when the calls left, ms after the toggle's response (the delay asked for + scheduling)
    refused: bool  # both replicas answered 401 api_key_disabled
    refused_by_ms: float  # when both had refused (polling on after a call that was admitted)
    enabled_ms: float = 0.0  # enabled again: when both replicas admitted the key (enabling may lag)


async def refused_after(shape: split.SplitShape, delays_ms: list[float], trials: int) -> dict[float, list[Trial]]:
    """What a caller sees: one call to each geo replica sent `delay` ms after the toggle's response,
    one trial at a time (no probe traffic of its own to queue behind). A lag's p99 is at most D when
    at least 99% of the calls sent D ms after the response are refused by every replica."""
    keys, geos = shape.of("keys")[0], shape.of("geo")
    results: dict[float, list[Trial]] = {}
    async with client(30) as http:
        t = await new_tenant(http, _ingress(shape))
        auth = t.api_key()
        toggle = f"{keys.base_url}/api/api-keys/{t.key_id}/toggle"

        async def calls() -> bool:
            answers = await asyncio.gather(*(http.get(f"{g.base_url}/api/geo/projects", headers=auth) for g in geos))
            return all(a.status_code == 401 for a in answers)

        async def admitted_by(base_url: str) -> None:
            for _ in range(5000):
                if (await http.get(f"{base_url}/api/geo/projects", headers=auth)).status_code != 401:
                    return
                await asyncio.sleep(0.001)
            raise RuntimeError(f"{base_url}: still refusing 5 s after the key was enabled")

        for delay in delays_ms:
            results[delay] = []
            for _ in range(trials):
                await asyncio.gather(*(admitted_by(g.base_url) for g in geos))
                off = await http.post(toggle, headers=t.console())
                answered = time.perf_counter()
                assert off.json()["status"] == "disabled", off.text
                await asyncio.sleep(max(0.0, answered + delay / 1000 - time.perf_counter()))
                sent = time.perf_counter()
                refused = await calls()
                while not await calls():
                    if time.perf_counter() - answered > 5:
                        raise RuntimeError("a geo replica still admits the key 5 s after the toggle")
                since = (time.perf_counter() - answered) * 1000
                on = await http.post(toggle, headers=t.console())
                assert on.json()["status"] == "enabled", on.text
                enabling = time.perf_counter()
                await asyncio.gather(*(admitted_by(g.base_url) for g in geos))
                enabled_ms = (time.perf_counter() - enabling) * 1000
                results[delay].append(Trial((sent - answered) * 1000, refused, since, enabled_ms))
    return results


def _ingress(shape: split.SplitShape):  # type: ignore[no-untyped-def]
    from tests.support.platform import Ingress

    return Ingress.single(shape.ingress_url)


# ---- 2. overshoot: the existing benchmarks on the cluster -----------------------------------------
def overshoot(callers: int) -> None:
    env = {
        **os.environ,
        # one node to bootstrap from (they find the others): the tests' helpers hand this string to
        # FastStream as is, which takes a comma list for one host
        "TEST_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{BENCH_STACK.kafka_port}",
        "TEST_DATABASE_URL": BENCH_STACK.database_url,
        "TEST_CLICKHOUSE_URL": BENCH_STACK.clickhouse_dsn,
        "TEST_REDIS_URL": BENCH_STACK.redis_url,
        "KAFKA_REPLICATION_FACTOR": "3",
        "LOG_LEVEL": "WARNING",
    }
    for script, args in (("admissions.py", ["--callers", str(callers)]), ("geo_overshoot.py", ["--processes", "3"])):
        print(f"-- bench/{script} {' '.join(args)} on the 3-node cluster", flush=True)
        done = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], env=env, cwd=REPO, check=False)
        if done.returncode != 0:
            print(f"bench/{script} failed ({done.returncode})")


# ---- 3. split vs --target all ---------------------------------------------------------------------
async def throughput(shape: split.SplitShape, settings: Settings, seconds: float) -> None:
    if shutil.which("wrk") is None:
        print("wrk is not installed (./deploy/local/prereqs.sh --bench): throughput skipped")
        return
    script = Path(tempfile.mkdtemp()) / "rotate.lua"
    script.write_text(WRK_SCRIPT)
    everything = ServeProcess(settings.model_copy(update={"trusted_proxies": []}), "all", port=ALL_PORT)
    try:
        everything.wait_ready(180)
        async with httpx.AsyncClient(timeout=30) as http:
            keys = [(await tenant(http, shape.ingress_url, "enterprise"))[1] for _ in range(5)]
            for key in keys:  # the accounts' plans known to every replica
                for base in [*(g.base_url for g in shape.of("geo")), everything.base_url]:
                    for _ in range(100):
                        r = await http.get(f"{base}/api/geo/projects", headers={"Authorization": f"Bearer {key}"})
                        if r.status_code == 200 and r.headers.get("X-RateLimit-Limit", "0") != "60":
                            break
                        await asyncio.sleep(0.1)
        runs = {}
        for name, url in (("split (nginx, 2 geo replicas)", shape.ingress_url), ("--target all", everything.base_url)):
            runs[name] = wrk(script, f"{url}/api/geo/projects", keys, seconds, connections=32, threads=2)
            print(runs[name].line(name), flush=True)
        split_run, all_run = runs["split (nginx, 2 geo replicas)"], runs["--target all"]
        print(ratio_line("metered API-key calls/s, split vs --target all", split_run.per_s, all_run.per_s, "req/s"))
    finally:
        everything.stop()


# ---- 4. acks=all, RF 3 vs RF 1 --------------------------------------------------------------------
async def replication_cost(records: int) -> None:
    tag = uuid.uuid4().hex[:6]
    topics = {rf: f"bench-rf{rf}-{tag}" for rf in (1, 3)}
    admin = AIOKafkaAdminClient(bootstrap_servers=BENCH_STACK.kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(t, 6, rf, topic_configs={"min.insync.replicas": str(rf // 2 + 1)} if rf > 1 else {})
                for rf, t in topics.items()
            ]
        )
        await asyncio.sleep(2)
        payload = b'{"id": "00000000-0000-0000-0000-000000000000", "quantity": 2000, "padding": "' + b"x" * 300 + b'"}'
        one: dict[int, list[float]] = {}
        bulk: dict[int, float] = {}
        producer = AIOKafkaProducer(bootstrap_servers=BENCH_STACK.kafka_bootstrap, linger_ms=5, **PRODUCER_CONFIG)
        await producer.start()
        try:
            for rf, t in [*topics.items(), *topics.items()]:  # each twice, interleaved; the second run counts
                for _ in range(50):
                    await producer.send_and_wait(t, payload, key=b"warm")
                one[rf] = []
                for i in range(records // 10):
                    started = time.perf_counter()
                    await producer.send_and_wait(t, payload, key=str(i).encode())
                    one[rf].append(time.perf_counter() - started)
                started = time.perf_counter()
                await asyncio.gather(*[await producer.send(t, payload, key=str(i).encode()) for i in range(records)])
                bulk[rf] = records / (time.perf_counter() - started)
        finally:
            await producer.stop()
        for rf in (3, 1):
            print(f"acks=all RF {rf}: one at a time {_ms(one[rf])}; in bulk {bulk[rf]:,.0f} records/s", flush=True)
        print(
            ratio_line(
                "p50 publish (one at a time), RF 3 vs RF 1",
                statistics.median(one[3]) * 1000,
                statistics.median(one[1]) * 1000,
                "ms",
            )
        )
        print(ratio_line("bulk records/s, RF 3 vs RF 1", bulk[3], bulk[1], "records/s"))
    finally:
        await admin.delete_topics(list(topics.values()))
        await admin.close()


# ---- 5. recovery after a broker kill --------------------------------------------------------------
async def _committed(admin: AIOKafkaAdminClient, group: str, tp: TopicPartition) -> int:
    offsets = await admin.list_consumer_group_offsets(group, partitions=[tp])
    meta = offsets.get(tp)
    return -1 if meta is None else int(meta.offset)


async def busiest_partition(topic: str, partitions: int, within: float = 2.0) -> tuple[TopicPartition, int]:
    """The partition that grows (one tenant's usage: one key, one partition) and its end offset."""
    consumer = AIOKafkaConsumer(bootstrap_servers=BENCH_STACK.kafka_bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        first = await consumer.end_offsets(tps)
        await asyncio.sleep(within)
        second = await consumer.end_offsets(tps)
        tp = max(tps, key=lambda t: second[t] - first[t])
        return tp, int(second[tp])
    finally:
        await consumer.stop()


async def recovery(shape: split.SplitShape, settings: Settings) -> None:
    topic = settings.topic(USAGE.name)
    admin = AIOKafkaAdminClient(bootstrap_servers=BENCH_STACK.kafka_bootstrap, request_timeout_ms=3000)
    await admin.start()
    victim = 0
    try:
        async with client(30) as http:
            ingress = _ingress(shape)
            t = await new_tenant(http, ingress)
            service = await new_service_token(http, ingress, settings.admin_token.get_secret_value())  # type: ignore[union-attr]
            stop = asyncio.Event()

            async def report() -> None:
                while not stop.is_set():
                    event = usage_event(t.account_id, 1000)
                    while not stop.is_set():  # resend the same id until acknowledged
                        try:
                            r = await http.post(ingress.url("/api/usage/events"), json={"events": [event]}, headers=service)
                            if r.status_code == 202:
                                break
                        except httpx.HTTPError:
                            pass
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(0.02)

            reporter = asyncio.create_task(report())
            await asyncio.sleep(3)
            groups = []
            for group_id, *_ in await admin.list_consumer_groups():
                offsets = await admin.list_consumer_group_offsets(group_id)
                if group_id.startswith(settings.topic_prefix) and any(tp.topic == topic for tp in offsets):
                    groups.append(group_id)
            tp, end = await busiest_partition(topic, USAGE.partitions)
            (described,) = await admin.describe_topics([topic])
            victim = int(next(p["leader"] for p in described["partitions"] if p["partition"] == tp.partition))
            pid = stack._read_pid(stack.kafka_pid_file(BENCH_STACK, victim))
            assert pid is not None
            os.killpg(pid, signal.SIGKILL)
            killed_at = time.perf_counter()
            stack._wait_gone(pid, 10)  # reap it: the bench started it
            # recovered: the group committed past the partition's end at the kill (an event reported after it)
            recovered: dict[str, float] = {}
            while len(recovered) < len(groups) and time.perf_counter() - killed_at < 120:
                for g in groups:
                    if g not in recovered:
                        try:
                            if await _committed(admin, g, tp) > end:
                                recovered[g] = time.perf_counter() - killed_at
                        except Exception:  # the group's coordinator may have been the dead broker: ask again
                            pass
                await asyncio.sleep(0.05)
            stop.set()
            await reporter
        for g in groups:
            shown = f"{recovered[g] * 1000:,.0f} ms" if g in recovered else "not within 120 s"
            name = g.removeprefix(settings.topic_prefix)
            where = f"{USAGE.name}/{tp.partition}"
            print(f"broker {victim} (leader of {where}) SIGKILLed -> {name}: {shown}")
        if recovered:
            print(
                f"time to recover (kill -> a post-kill event committed by every group): {max(recovered.values()) * 1000:,.0f} ms"
            )
    finally:
        await admin.close()
        if victim:
            stack.kafka_up(BENCH_STACK, victim)


async def main(n_toggles: int, callers: int, seconds: float, skip: set[str], delays: list[float]) -> None:
    stack.up(BENCH_STACK)
    tag = uuid.uuid4().hex[:8]
    settings = _settings(tag)
    shape = split.shape(BENCH_STACK.state_dir / f"split-{tag}", INGRESS_PORT, FIRST_REPLICA_PORT)
    try:
        split.start(shape, settings_env(settings))
        if "toggle" not in skip:
            lags, polls = await toggles(shape, n_toggles)
            print(f"key toggled off on keys -> refused by both geo replicas: {_ms(lags)}", flush=True)
            # none when strict revocation held: every first poll after a toggle was already refused
            print(f"baseline, one accepted poll (GET /api/geo/projects on a geo replica): {_ms(polls)}", flush=True)
            for delay, trials in (await refused_after(shape, delays, n_toggles)).items():
                refused = sum(t.refused for t in trials)
                sent = [t.sent_ms for t in trials]
                late = [t.refused_by_ms for t in trials if not t.refused]
                print(
                    f"a call to both geo replicas sent {delay:g} ms after the toggle's response (sent at p50 "
                    f"{percentile(sent, 50):.1f} ms, p99 {percentile(sent, 99):.1f} ms): refused by both in "
                    f"{refused}/{len(trials)} = {refused / len(trials):.3f}"
                    + (f"; the others refused by a call answered at most {max(late):.1f} ms after" if late else "")
                    + f"; enabled again -> admitted by both: {_ms([t.enabled_ms / 1000 for t in trials])}",
                    flush=True,
                )
        if "throughput" not in skip:
            await throughput(shape, settings, seconds)
        if "replication" not in skip:
            await replication_cost(2000)
        if "recovery" not in skip:
            await recovery(shape, settings)
        split.stop(shape.run_dir)
        if "overshoot" not in skip:
            overshoot(callers)
    finally:
        split.stop(shape.run_dir)
        databases.drop(BENCH_STACK.database_url, settings.database_url)
        drop_clickhouse_database(BENCH_STACK.clickhouse_dsn, f"b_{tag}")
        stack.down(BENCH_STACK)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--toggles", type=int, default=200)
    parser.add_argument("--callers", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--skip", default="", help="comma-separated: toggle,throughput,replication,recovery,overshoot")
    parser.add_argument("--delays", default="0,2,5,10", help="ms after a toggle's response that the calls leave, comma-separated")
    args = parser.parse_args()
    delays = [float(d) for d in args.delays.split(",")]
    asyncio.run(main(args.toggles, args.callers, args.seconds, set(filter(None, args.skip.split(","))), delays))
