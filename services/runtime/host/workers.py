"""`tollgate serve --workers N`: N processes serving one port, each a replica of the targets'
routes and projections, and one process running their consumers at a lower CPU priority.

The consumers (quota's counting, the metering sink, alerts, ...) work in bursts that can take a
core for seconds, as when a backlog of usage sinks. Sharing a process with requests, a request
waits on the event loop behind a batch being parsed, counted or sunk. In a process of their own,
niced, they never hold a request's loop, the kernel's scheduler serves the requests first, and
the consumers take what is left: under a sustained overload they lag, and catch up after
(BENCHMARKS.md, "background", round 2). The consumer groups are the same, so nothing else
changes: offsets committed after each write, every event counted once; a consumer that crashes
takes no request worker with it.

Each worker binds a socket of its own with SO_REUSEPORT, and the kernel spreads new connections
over the listening ones by their addresses. One socket shared by all (uvicorn's `--workers`)
handed every connection of a light load to the same worker, and a keep-alive client's whole pool
could land on one. A worker's socket starts listening only once its app has started (uvicorn
listens after the lifespan), so a worker being replaced is never handed a connection it would
hold while it starts. The supervisor replaces a worker that dies, and stops them all on SIGTERM
or SIGINT. The price of a socket per worker: connections the kernel had queued on a worker that
dies, not yet accepted, are reset with it (Linux hands them to the other listeners instead with
`sysctl net.ipv4.tcp_migrate_req=1`); with one shared socket they waited for another worker.
"""

import asyncio
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

from prometheus_client import multiprocess
from starlette.applications import Starlette

log = logging.getLogger(__name__)

STARTUP_FAILURE = 3  # uvicorn's exit code when the app cannot start: a replacement would fail too
STOP_TIMEOUT_S = 30.0
RESTART_PAUSE_MAX_S = 30.0
# The consumers' process against the request processes: the scheduler's weights are 110 to 1024.
CONSUMERS_NICENESS = 10


Job = tuple[Callable[..., None], tuple[Any, ...]]  # a process's function and its arguments


def forget_live_metrics(pid: int | None) -> None:
    """A dead worker's live gauges (its memory) leave /metrics; its counters stay in the sums."""
    if pid is not None and "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


@dataclass
class _Slot:
    """One job's place: its process (None while it pauses before a restart)."""

    job: Job
    process: BaseProcess | None
    replaced: bool = False  # its first process started: a later failure to start is a dependency down
    pause_s: float = 0.0
    restart_at: float = 0.0


def supervise(jobs: list[Job]) -> int:
    """Run each job in a spawned process until SIGTERM or SIGINT (one that ends is started again);
    the exit code.

    A first process that cannot start (a bad setting) stops them all: a replacement would fail too.
    A replacement that cannot start met a dependency down for a while, and the other processes
    still serve: it is started again after a pause that doubles up to RESTART_PAUSE_MAX_S."""
    spawn = multiprocessing.get_context("spawn")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def start(job: Job) -> BaseProcess:
        process = spawn.Process(target=job[0], args=job[1], daemon=False)
        process.start()
        return process

    slots = [_Slot(job, start(job)) for job in jobs]
    code = 0
    while not stop.wait(0.5):
        for slot in slots:
            ended = slot.process
            if ended is None:
                if time.monotonic() >= slot.restart_at:
                    slot.process = start(slot.job)
                continue
            if ended.is_alive():
                continue
            forget_live_metrics(ended.pid)
            if ended.exitcode == STARTUP_FAILURE and not slot.replaced:
                log.error("worker %s could not start; stopping", ended.pid)
                code = STARTUP_FAILURE
                stop.set()
                break
            slot.replaced = True
            if ended.exitcode == STARTUP_FAILURE:
                slot.pause_s = min(max(2 * slot.pause_s, 1.0), RESTART_PAUSE_MAX_S)
                log.error("worker %s could not start; another in %.0f s", ended.pid, slot.pause_s)
                slot.process, slot.restart_at = None, time.monotonic() + slot.pause_s
                continue
            log.warning("worker %s ended (exit code %s); starting another", ended.pid, ended.exitcode)
            slot.pause_s = 0.0
            slot.process = start(slot.job)
    processes = [slot.process for slot in slots if slot.process is not None]
    for process in processes:
        if process.is_alive():
            process.terminate()  # SIGTERM: uvicorn finishes its requests and runs the app's shutdown
    for process in processes:
        process.join(STOP_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join()
    return code


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """Bound, not yet listening: uvicorn listens on it once the app has started."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


async def run_lifespan(app: Starlette) -> None:
    """The app's start, then its stop on SIGTERM or SIGINT, serving no requests (the consumers'
    process); exit STARTUP_FAILURE if it cannot start."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    lifespan = app.router.lifespan_context(app)
    try:
        await lifespan.__aenter__()
    except Exception:
        log.exception("the consumers could not start")
        sys.exit(STARTUP_FAILURE)
    try:
        await stop.wait()
    finally:
        await lifespan.__aexit__(None, None, None)
