"""Bounded request heads for `tollgate serve`: uvicorn's httptools protocol with limits.

uvicorn bounds nothing with httptools (its fast default): a client could send a request line or
headers of any size and the server would buffer them all. This subclass counts the bytes of
each request head as they arrive and refuses, before the app runs, with the contract's error
body and `Connection: close`:
- 414 when the URL (path + query string) exceeds MAX_URL_BYTES,
- 431 when the request line and headers together exceed MAX_HEAD_BYTES.
At most MAX_HEAD_BYTES plus one read (asyncio reads <= 256 KiB at a time) is ever buffered.
"""

import asyncio
import json
import secrets
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from contracts.errors import ErrorCode
from services.runtime.host.one_write import OneWriteTransport

MAX_URL_BYTES = 16 * 1024
MAX_HEAD_BYTES = 64 * 1024
# After a refusal the connection reads and drops what the client is still sending, for a moment
# (a "lingering close"): closing with unread data would reset the connection and lose the answer.
LINGER_S = 1.0
LINGER_BYTES = 1024 * 1024


class _Refused(Exception):
    pass


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refusal: tuple[int, str] | None = None
        self._in_head = True  # a connection starts with a request head
        self._head_bytes = 0
        self._boundaries = 0  # heads and messages completed: what a read contained besides a head
        self._discarded: int | None = None  # bytes dropped since a refusal

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # a response's head and body in one socket write (one_write.py)
        super().connection_made(OneWriteTransport(transport, self.loop))  # type: ignore[arg-type]

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > MAX_URL_BYTES:
            self._refusal = (414, f"The URL is longer than {MAX_URL_BYTES // 1024} KiB.")
            raise _Refused  # httptools turns it into a parser error: send_400_response below answers

    def on_headers_complete(self) -> None:
        # A head that arrived within one read is measured here (data_received sees only longer ones).
        if len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers) > MAX_HEAD_BYTES:
            self._refusal = (431, f"The request line and headers exceed {MAX_HEAD_BYTES // 1024} KiB.")
            raise _Refused
        self._in_head = False
        self._boundaries += 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
        self._boundaries += 1

    def data_received(self, data: bytes) -> None:
        if self._discarded is not None:
            self._discarded += len(data)
            if self._discarded > LINGER_BYTES:
                self.transport.close()
            return
        boundaries = self._boundaries
        super().data_received(data)
        if self._boundaries != boundaries:  # a head or a body ended in this read: count from the next one
            self._head_bytes = 0
            return
        if self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refusal = (431, f"The request line and headers exceed {MAX_HEAD_BYTES // 1024} KiB.")
                self.send_400_response("")

    def send_400_response(self, msg: str) -> None:
        if self._refusal is None:
            super().send_400_response(msg)
            return
        status, message = self._refusal
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()  # a pipelined head while a response is on its way: just hang up
            return
        request_id = secrets.token_hex(12)
        code = ErrorCode.PAYLOAD_TOO_LARGE  # the contract has no code of its own for an oversized head
        body = json.dumps({"error": {"code": code.value, "message": message, "request_id": request_id}}).encode()
        reason = b"URI Too Long" if status == 414 else b"Request Header Fields Too Large"
        head = (
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"x-request-id: %s\r\nconnection: close\r\n\r\n" % (status, reason, len(body), request_id.encode())
        )
        self.transport.write(head + body)
        self._discarded = 0
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the answer, then FIN; the client may still be sending
        self.loop.call_later(LINGER_S, self.transport.close)
