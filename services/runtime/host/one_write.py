"""A connection's writes gathered into one socket write per turn of the event loop.

uvicorn's httptools protocol writes a response's head and its body with one `transport.write`
each, and uvloop sends each at once: two `send` system calls, two TCP segments over loopback,
for every response. In a request worker at saturation that writing was a quarter of the
worker's CPU under verify (BENCHMARKS.md, "verify", issue 38: `RequestResponseCycle.send`'s own
time, which is the two writes). `OneWriteTransport` stands in for the connection's transport:
what is written during one step of the loop (the head, then the body, as an ASGI app sends
them back to back) is sent as one write when the step ends (`call_soon`), in the order it was
written. Past `MAX_HELD_BYTES` what is held leaves at once, so a long response meets the
transport's flow control as before. Everything else is the transport's own. Closing sends what is
held first; aborting drops it, as the transport's own abort drops its buffer.

The bytes on the wire and their order are unchanged; a response leaves at the end of the loop
step that wrote it instead of during it (the rest of that step: microseconds). A write that must
reach the client before the server waits for it (`100 Continue`) is followed by a wait, which
ends the step, so it leaves before the wait begins.
"""

import asyncio
from typing import Any

# Held past this, the writes leave at once: the transport's own buffer and its flow control (uvicorn
# waits for a paused transport before each send) then see a long response as they always did.
MAX_HELD_BYTES = 64 * 1024


class OneWriteTransport:
    __slots__ = ("_held", "_held_bytes", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._held_bytes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self._flush)
        self._held.append(bytes(data))
        self._held_bytes += len(data)
        if self._held_bytes > MAX_HELD_BYTES:
            self._flush()

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def _flush(self) -> None:
        held = self._held
        if held:
            self._held, self._held_bytes = [], 0
            if not self._transport.is_closing():
                self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._held_bytes

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held, self._held_bytes = [], 0
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading, set_protocol...
        return getattr(self._transport, name)
