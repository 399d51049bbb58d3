"""`tollgate serve --workers N`: N processes serving one port, each a whole replica of the targets.

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

import logging
import multiprocessing
import signal
import socket
import threading
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

log = logging.getLogger(__name__)

STARTUP_FAILURE = 3  # uvicorn's exit code when the app cannot start: a replacement would fail too
STOP_TIMEOUT_S = 30.0


def supervise(workers: int, serve_one: Callable[..., None], args: tuple[Any, ...]) -> int:
    """Run `serve_one(*args)` in `workers` spawned processes until SIGTERM or SIGINT; the exit code."""
    spawn = multiprocessing.get_context("spawn")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    def start() -> BaseProcess:
        process = spawn.Process(target=serve_one, args=args, daemon=False)
        process.start()
        return process

    processes = [start() for _ in range(workers)]
    code = 0
    while not stop.wait(0.5):
        for index, process in enumerate(processes):
            if process.is_alive():
                continue
            if process.exitcode == STARTUP_FAILURE:
                log.error("worker %s could not start; stopping", process.pid)
                code = STARTUP_FAILURE
                stop.set()
                break
            log.warning("worker %s ended (exit code %s); starting another", process.pid, process.exitcode)
            processes[index] = start()
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
