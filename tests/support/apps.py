"""Run Tollgate for a test: in this process (ASGI, lifespan) or as real `serve` processes."""

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
from aiokafka import AIOKafkaProducer
from fastapi import FastAPI

from contracts.events import StateComplete
from contracts.topics import STATE_COMPLETE, STATE_OWNERS
from services.edge import Overrides
from services.runtime.host.app import create_app, expand_targets
from services.runtime.platform.kafka import ensure_topics
from services.runtime.platform.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def owners_elsewhere(targets: Iterable[str]) -> list[str]:
    """The owners of the edge's states (keys, billing, quota) that `targets` do not run."""
    running = expand_targets([",".join(targets)])
    return [owner for owner in STATE_OWNERS if owner not in running]


async def announce_state_complete(settings: Settings, owners: Iterable[str]) -> None:
    """Write the state-complete.v1 record of each of `owners`, as its state guard does once its
    topics hold its states (services/edge/state_complete.py): a test running only some services
    stands for a deployment whose owners run elsewhere, their checks done. Without these records
    no edge would ever be ready."""
    owners = list(owners)
    if not owners:
        return
    await ensure_topics(settings, (STATE_COMPLETE,))
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers)
    await producer.start()
    try:
        for owner in owners:
            record = StateComplete(time=datetime.now(UTC), owner=owner, held={})
            await producer.send_and_wait(
                settings.topic(STATE_COMPLETE.name), record.model_dump_json().encode(), key=owner.encode()
            )
    finally:
        await producer.stop()


def announce_state_complete_sync(settings: Settings, owners: Iterable[str]) -> None:
    """announce_state_complete from sync code, even code called inside a running event loop."""
    owners = list(owners)
    if owners:
        with ThreadPoolExecutor(1) as apart:
            apart.submit(asyncio.run, announce_state_complete(settings, owners)).result()


@asynccontextmanager
async def running_app(
    settings: Settings,
    targets: Sequence[str] = ("all",),
    overrides: Overrides | None = None,
    *,
    others_done: bool = True,
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The app with its lifespan run (migrations, topics, projections, subscribers) and a client;
    `overrides` replace the clock or the payment provider at bootstrap. `others_done`: the
    owners `targets` do not run are taken to run elsewhere, their checks done (their
    state-complete.v1 records are written first)."""
    if others_done:
        await announce_state_complete(settings, owners_elsewhere(targets))
    app = create_app(targets, settings, overrides=overrides)
    async with app.router.lifespan_context(app):
        # as `serve` is ready: the edge judges no credential before its projections caught up
        edge = app.state.runtime.edge
        for _ in range(600):
            if edge.is_ready():
                break
            await asyncio.sleep(0.05)
        else:
            raise TimeoutError("the edge's projections did not catch up in 30 s")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://tollgate.test") as client:
            yield app, client


# Below the kernel's ephemeral range (32768-60999 by default) and the test stack's ports (25432+).
FREE_PORTS = range(10_000, 25_000)


def free_port() -> int:
    """A port nothing listens on, for a server a test starts. Not one the kernel hands out for
    port 0: those come from the range its outgoing connections take theirs from, and one of the
    many clients of a test run (Kafka, Postgres, Redis) could take it before the server binds it
    (EADDRINUSE, seen in a fresh-clone run)."""
    while True:
        port = random.choice(FREE_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def own_stack_env(state: Path) -> dict[str, str]:
    """The environment for `tollgate` commands on a stack of their own: its state folder, free ports
    for every part, and none of the test stack's addresses inherited."""
    inherited = {"KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL", "CLICKHOUSE_DSN", "CLICKHOUSE_DATABASE", "REDIS_URL"}
    return {
        **{k: v for k, v in os.environ.items() if k not in inherited},
        "TOLLGATE_STATE_DIR": str(state),
        "TOLLGATE_KAFKA_PORT": str(free_port()),
        "TOLLGATE_KAFKA_CONTROLLER_PORT": str(free_port()),
        "TOLLGATE_POSTGRES_PORT": str(free_port()),
        "TOLLGATE_CLICKHOUSE_HTTP_PORT": str(free_port()),
        "TOLLGATE_CLICKHOUSE_TCP_PORT": str(free_port()),
        "TOLLGATE_REDIS_PORT": str(free_port()),
    }


def settings_env(settings: Settings) -> dict[str, str]:
    """Environment variables that reproduce `settings` in a child process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        env[name.upper()] = value if isinstance(value, str) else json.dumps(value)
    return env


def process_tree() -> dict[int, list[int]]:
    """Every live process's children, from /proc (parent pid -> child pids)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(parent, []).append(int(entry.name))
    return tree


def spawned_pids(parent: int) -> dict[int, int]:
    """The processes of `serve --workers N` whose supervisor is `parent` (spawned: `... spawn_main ...`
    on their command line, unlike multiprocessing's resource tracker), each with its niceness."""
    spawned = {}
    for pid in process_tree().get(parent, []):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                spawned[pid] = niceness(pid)
        except OSError:
            continue
    return spawned


def niceness(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])  # field 19 of proc(5)


def worker_pids(parent: int) -> list[int]:
    """The request processes of `serve --workers N`: the supervisor's own niceness."""
    base = niceness(parent)
    return sorted(pid for pid, nice in spawned_pids(parent).items() if nice == base)


def consumers_pids(parent: int) -> list[int]:
    """The consumers' process of `serve --workers N` (one, unless it is being replaced): niced."""
    base = niceness(parent)
    return sorted(pid for pid, nice in spawned_pids(parent).items() if nice > base)


class ServeProcess:
    """`tollgate serve` in a child process (one worker unless `workers`); kill() is a real SIGKILL
    of its whole process group. `others_done`: as running_app's."""

    def __init__(
        self,
        settings: Settings,
        targets: str = "all",
        port: int | None = None,
        log_path: Path | None = None,
        workers: int = 1,
        *,
        others_done: bool = True,
    ) -> None:
        if others_done:
            announce_state_complete_sync(settings, owners_elsewhere([targets]))
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or (REPO / ".tollgate" / "test-logs" / f"serve-{self.port}.log")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    *[sys.executable, "-m", "tests.support.serve", "serve", "--target", targets],
                    *["--port", str(self.port), "--workers", str(workers)],
                ],
                env=settings_env(settings),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}; log: {self.log_path}")
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)  # a test waits on this dozens of times a run: ready is seen within 50 ms
        raise TimeoutError(f"serve on {self.port} not ready; log: {self.log_path}")

    def print_log_tail(self, lines: int = 40) -> None:
        """Its log's last warnings and errors, on stdout: pytest shows them when a test fails."""
        if self.log_path.exists():
            noteworthy = [line for line in self.log_path.read_text(errors="replace").splitlines() if '"INFO"' not in line]
            print(f"--- {self.log_path} (exit code {self.proc.poll()}), last lines but INFO:", *noteworthy[-lines:], sep="\n")

    def kill(self) -> None:
        self.print_log_tail()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        self.print_log_tail()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def serve_process(settings: Settings, targets: str = "all") -> Iterator[ServeProcess]:
    proc = ServeProcess(settings, targets)
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()
