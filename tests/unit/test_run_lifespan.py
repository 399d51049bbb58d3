"""The consumers' process runs the app's lifespan without serving: started, then stopped on SIGTERM;
an app that cannot start exits STARTUP_FAILURE (the supervisor then stops, as for a worker)."""

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from starlette.applications import Starlette

from services.runtime.host.workers import STARTUP_FAILURE, run_lifespan


def app_recording(steps: list[str], fail: bool = False, started: asyncio.Event | None = None) -> Starlette:
    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        steps.append("start")
        if started is not None:
            started.set()
        if fail:
            raise RuntimeError("Kafka is away")
        yield
        steps.append("stop")

    return Starlette(lifespan=lifespan)


async def test_starts_then_stops_on_sigterm() -> None:
    steps: list[str] = []
    started = asyncio.Event()
    running = asyncio.create_task(run_lifespan(app_recording(steps, started=started)))
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.sleep(0.05)
    assert not running.done()  # serving no requests, it waits for its stop
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(running, 5)
    assert steps == ["start", "stop"]


async def test_an_app_that_cannot_start_exits_startup_failure() -> None:
    steps: list[str] = []
    with pytest.raises(SystemExit) as exited:
        await run_lifespan(app_recording(steps, fail=True))
    assert exited.value.code == STARTUP_FAILURE
    assert steps == ["start"]
