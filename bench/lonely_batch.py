"""What one of the sink's batches costs when it holds a single event: a few calls a second, each
batch alone (issue 18: a metered call that travels alone pays every per-batch cost itself).

A ClickHouse server of its own (the local stack's kind, free ports). The sink's real write
(`MeteringStore.insert_calls`) of one call event, one batch every 150 ms, then the same number
of `SELECT 1` through the same writer client at the same pace as the baseline (the least a
statement costs this server). Prints the client's CPU (this process) and the server's CPU (its
process, from /proc, merges included: it runs 3 s on after the last batch) per batch.

Run: .venv/bin/python bench/lonely_batch.py [--batches 100]
"""

import argparse
import asyncio
import os
import shutil
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.idle import cpu_seconds
from bench.stats import ratio_line
from contracts.events import CallEvent
from services.metering.ingest import canonical
from services.metering.store import MeteringStore
from services.runtime.host import stack
from tests.support import backfill
from tests.support.apps import REPO, free_port

PAUSE_S = 0.15
SETTLE_S = 3.0  # the merges a batch's part sets off are part of its cost


def call_event(account: uuid.UUID) -> bytes:
    """A call made now (the shared factory stamps historical times)."""
    return backfill.call(account, 0).model_copy(update={"time": datetime.now(UTC)}).model_dump_json().encode()


async def paced(n: int, pid: int, step: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """(client ms, server ms) of CPU per step, `n` steps PAUSE_S apart."""
    client, server = time.process_time(), cpu_seconds(pid)
    for _ in range(n):
        await step()
        await asyncio.sleep(PAUSE_S)
    await asyncio.sleep(SETTLE_S)
    return (time.process_time() - client) / n * 1000, (cpu_seconds(pid) - server) / n * 1000


async def main(batches: int) -> None:
    server = stack.StackConfig(
        state_dir=REPO / ".tollgate" / f"bench-lonely-{uuid.uuid4().hex[:8]}",
        clickhouse_http_port=free_port(),
        clickhouse_tcp_port=free_port(),
    )
    stack.clickhouse_up(server)
    store = MeteringStore(server.clickhouse_dsn, "tollgate")
    try:
        await asyncio.to_thread(store.open)
        pid = int((server.state_dir / "clickhouse.pid").read_text().split()[0])
        account, to_canonical = uuid.uuid4(), canonical(CallEvent)
        print(f"# lonely batches {datetime.now(UTC):%Y-%m-%d %H:%M}Z, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
        await asyncio.sleep(SETTLE_S)  # the migrations' own merges
        select = await paced(batches, pid, lambda: store.writer.run(lambda c: c.query("SELECT 1")))
        insert = await paced(batches, pid, lambda: store.insert_calls([call_event(account)], to_canonical))
        for label, (client_ms, server_ms) in (("SELECT 1", select), ("a batch of one call event", insert)):
            pace = f"({batches}, {PAUSE_S * 1000:.0f} ms apart)"
            print(f"{label}: client {client_ms:.2f} ms, server {server_ms:.2f} ms of CPU each {pace}")
        print(ratio_line("a lonely batch vs SELECT 1, client + server CPU", sum(insert), sum(select), "ms"))
    finally:
        store.close()
        stack.clickhouse_down(server)
        shutil.rmtree(server.state_dir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=100)
    asyncio.run(main(parser.parse_args().batches))
