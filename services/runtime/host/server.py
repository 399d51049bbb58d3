"""uvicorn's Server with a main loop that wakes once a second, not ten times.

uvicorn's loop sleeps 0.1 s between looks at its exit flag, and refreshes the Date header every
tenth look: ten wake-ups a second in every idle process (BENCHMARKS.md, "idle"). Here it looks
once a second (the Date header's own pace), and the signal that asks it to exit wakes it at once.
"""

import asyncio
import contextlib
from types import FrameType

import uvicorn

TICK_S = 1.0
_TICKS_PER_DATE = 10  # uvicorn's on_tick refreshes the Date header when counter % 10 == 0


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit_asked = asyncio.Event()

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + _TICKS_PER_DATE) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit_asked.wait(), TICK_S)
            should_exit = await self.on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None:  # a signal handler: it runs between the loop's steps
            self._loop.call_soon_threadsafe(self._exit_asked.set)
