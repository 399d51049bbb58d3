"""CPU of an idle `tollgate serve` (issue 18, item 5: <= 2% of a core, no busy polling).

Starts `serve --target all` (or --targets) on the test stack (Kafka, Postgres, the ClickHouse
server, redis; TEST_* env vars or the local test stack), waits for /readyz and a settle period,
then reads the process's utime + stime from /proc/<pid>/stat over --seconds with no traffic.
With `--workers N` (N > 1: a supervisor and N spawned workers) each process is read over the same
seconds, and the total. Baseline, same run: a bare Python process idling in asyncio for the same
time (what the interpreter costs doing nothing).

    .venv/bin/python bench/idle.py [--seconds 60] [--settle 10] [--targets all] [--workers 1] [--own-stack]

`--own-stack`: a stack of its own on free ports instead (its broker holds only this run's topics,
as a production cluster of Tollgate's own would; the shared test broker holds every test's), up
for the run and down after it.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.runtime.host import stack
from services.runtime.platform.settings import Settings
from tests.support import databases
from tests.support.apps import REPO, ServeProcess, consumers_pids, free_port, worker_pids
from tests.support.infra import Endpoints, delete_topics_with_prefix, endpoints

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (its own threads; fields 14 and 15 of /proc/<pid>/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after "(comm) ": field 3 is index 0
    return (int(fields[11]) + int(fields[12])) / TICKS


def shares_of_a_core(pids: list[int], seconds: float) -> list[float]:
    """Each process's CPU over the same `seconds`, in % of one core."""
    before, started = [cpu_seconds(pid) for pid in pids], time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    return [(cpu_seconds(pid) - used) / elapsed * 100 for pid, used in zip(pids, before, strict=True)]


def share_of_a_core(pid: int, seconds: float) -> float:
    return shares_of_a_core([pid], seconds)[0]


def bare_python(seconds: float) -> float:
    idle = subprocess.Popen([sys.executable, "-c", "import asyncio; asyncio.run(asyncio.sleep(3600))"])
    try:
        time.sleep(1)
        return share_of_a_core(idle.pid, seconds)
    finally:
        idle.kill()
        idle.wait()


@contextmanager
def own_stack() -> Iterator[Endpoints]:
    """A stack of its own on free ports, in a state directory of its own, down and deleted afterwards."""
    state = REPO / ".tollgate" / f"bench-idle-{uuid.uuid4().hex[:6]}"
    kafka, postgres, http, tcp, redis = (free_port() for _ in range(5))
    cfg = stack.StackConfig(
        state_dir=state, kafka_port=kafka, controller_port=free_port(), postgres_port=postgres,
        clickhouse_http_port=http, clickhouse_tcp_port=tcp, redis_port=redis, clickhouse_extra_databases=("b_*",),
    )  # fmt: skip
    stack.up(cfg)
    try:
        yield Endpoints(cfg.kafka_bootstrap, cfg.database_url, cfg.clickhouse_dsn, cfg.analyst_dsns()["http"], cfg.redis_url)
    finally:
        stack.down(cfg)
        shutil.rmtree(state, ignore_errors=True)


def main(seconds: float, settle: float, targets: str, workers: int, stack_of_its_own: bool) -> None:
    import asyncio

    where: AbstractContextManager[Endpoints] = own_stack() if stack_of_its_own else endpoints()
    with where as infra:
        tag = uuid.uuid4().hex[:8]
        template = databases.create_template(infra.database_url)
        url = databases.clone(infra.database_url, template)
        settings = Settings(
            kafka_bootstrap_servers=infra.kafka_bootstrap, database_url=url, topic_prefix=f"bench{tag}.",
            clickhouse_dsn=infra.clickhouse_dsn, clickhouse_database=f"b_{tag}", session_secret=f"bench-{tag}",
            redis_url=infra.redis_url,
        )  # fmt: skip
        serve = ServeProcess(settings, targets, workers=workers)
        try:
            serve.wait_ready()
            if workers > 1:  # every worker and the consumers' process started, not just the first to listen
                while len(worker_pids(serve.proc.pid)) < workers or not consumers_pids(serve.proc.pid):
                    time.sleep(0.2)
            time.sleep(settle)
            spawned = [*worker_pids(serve.proc.pid), *consumers_pids(serve.proc.pid)] if workers > 1 else []
            pids = [serve.proc.pid, *spawned]
            used = shares_of_a_core(pids, seconds)
        finally:
            serve.stop()
            databases.drop(infra.database_url, url)
            databases.drop_template(infra.database_url, template)
            asyncio.run(delete_topics_with_prefix(infra.kafka_bootstrap, settings.topic_prefix))
    baseline = bare_python(seconds)
    shape = f"`serve --target {targets} --workers {workers}`"
    if workers == 1:
        print(f"idle {shape} over {seconds:.0f} s: {used[0]:.2f}% of a core (goal <= 2%)")
    else:
        each = ", ".join(f"{share:.2f}%" for share in used[1:-1])
        print(f"idle {shape} over {seconds:.0f} s: supervisor {used[0]:.2f}%, workers {each}, consumers {used[-1]:.2f}%")
        print(f"  in total {sum(used):.2f}% of a core (goal <= 2% per serve process)")
    print(f"baseline, a bare asyncio process over {seconds:.0f} s: {baseline:.2f}% of a core")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--settle", type=float, default=10)
    parser.add_argument("--targets", default="all")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--own-stack", action="store_true", help="a stack of its own on free ports (a broker of its own)")
    args = parser.parse_args()
    main(args.seconds, args.settle, args.targets, args.workers, args.own_stack)
