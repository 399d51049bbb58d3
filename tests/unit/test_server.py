"""services/runtime/host/server.py: uvicorn's main loop, woken by the exit signal, not a 0.1 s timer."""

import asyncio
import signal
from typing import Any

import pytest
import uvicorn

from services.runtime.host import server as calm


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})


async def test_the_exit_signal_wakes_the_main_loop_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calm, "TICK_S", 3600)  # only the signal can end the wait
    server = calm.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None))
    serving = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 (uvicorn has a flag for it, no event)
        await asyncio.sleep(0.01)
    date = server.server_state.default_headers
    assert any(name == b"date" for name, _ in date)  # the first tick set the Date header
    server.handle_exit(signal.SIGTERM, None)
    server._captured_signals.clear()  # else uvicorn raises the signal again on its way out (at pytest)
    await asyncio.wait_for(serving, 10)
