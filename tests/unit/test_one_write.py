"""A connection's writes gathered into one socket write per turn of the loop (one_write.py): the
transport's part alone, then `tollgate serve`'s protocol on a real socket, where each response
(head and body) must leave in one write and every answer must arrive whole and in order
(keep-alive, pipelining, HEAD, 204, `Expect: 100-continue`, a close after the answer)."""

import asyncio
import socket
from typing import Any

import pytest
import uvicorn

from services.runtime.host import one_write
from services.runtime.host.http_limits import BoundedHttpToolsProtocol
from services.runtime.host.one_write import OneWriteTransport


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def test_the_writes_of_one_step_leave_as_one_in_their_order() -> None:
    fake = FakeTransport()
    transport = OneWriteTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"head ")
    transport.write(b"")
    transport.write(memoryview(b"body"))
    assert fake.writes == [] and transport.get_write_buffer_size() == 9
    await asyncio.sleep(0)
    assert fake.writes == [b"head body"]
    transport.write(b"next")
    await asyncio.sleep(0)
    transport.writelines([b"a", b"b"])
    await asyncio.sleep(0)
    assert fake.writes == [b"head body", b"next", b"ab"]
    assert transport.get_extra_info("peername") == "info:peername"  # the rest is the transport's own


async def test_a_long_response_leaves_as_it_is_written_past_the_bound() -> None:
    fake = FakeTransport()
    transport = OneWriteTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    chunk = b"x" * (one_write.MAX_HELD_BYTES // 2)
    transport.write(b"head")
    transport.write(chunk)
    assert fake.writes == []
    transport.write(chunk)  # past the bound: at once, so that the transport's flow control sees it
    assert fake.writes == [b"head" + chunk + chunk] and transport.get_write_buffer_size() == 0
    transport.write(b"end")
    await asyncio.sleep(0)
    assert fake.writes[1:] == [b"end"]


async def test_close_sends_what_is_held_first_and_abort_drops_it() -> None:
    fake = FakeTransport()
    transport = OneWriteTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"answer")
    transport.close()
    assert fake.writes == [b"answer"] and fake.closed
    await asyncio.sleep(0)
    assert fake.writes == [b"answer"]  # the flush scheduled by the write finds nothing left

    fake = FakeTransport()
    transport = OneWriteTransport(fake, asyncio.get_running_loop())  # type: ignore[arg-type]
    transport.write(b"lost")
    transport.abort()
    await asyncio.sleep(0)
    assert fake.writes == [] and fake.aborted


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    status = 204 if scope["path"] == "/empty" else 200
    answer = b"" if status == 204 else scope["path"].encode() + b":" + body
    headers = [(b"content-length", str(len(answer)).encode())] if status != 204 else []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def _exchange(port: int, request: bytes, body: bytes = b"") -> bytes:
    """Send the request head(s) (the last one asks to close), then `body` once 100 Continue came if
    the head expects it; everything the server answered until it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        if body:  # the head alone: the body only after 100 Continue
            assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(body)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


@pytest.fixture
async def served(monkeypatch: pytest.MonkeyPatch) -> Any:
    flushes: list[int] = []  # how many writes each socket write carried
    original = OneWriteTransport._flush

    def counted(self: OneWriteTransport) -> None:
        if self._held:
            flushes.append(len(self._held))
        original(self)

    monkeypatch.setattr(one_write.OneWriteTransport, "_flush", counted)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=BoundedHttpToolsProtocol, log_config=None, access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110  # uvicorn says so with a flag, not an event
        await asyncio.sleep(0.01)
    yield sock.getsockname()[1], flushes
    server.should_exit = True
    await task


async def test_each_response_leaves_in_one_write_whole_and_in_order(served: Any) -> None:
    port, flushes = served
    close = b"Connection: close\r\n"
    pipelined = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nHost: x\r\n" + close + b"Content-Length: 2\r\n\r\nok"
    received = await asyncio.to_thread(_exchange, port, pipelined)
    first, second = received.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert first.endswith(b"\r\n\r\n/a:") and second.endswith(b"\r\n\r\n/b:ok")
    assert flushes == [2, 2]  # head + body, one write each

    flushes.clear()
    received = await asyncio.to_thread(_exchange, port, b"GET /empty HTTP/1.1\r\nHost: x\r\n" + close + b"\r\n")
    assert received.startswith(b"HTTP/1.1 204 No Content\r\n") and received.endswith(b"\r\n\r\n")
    head = await asyncio.to_thread(_exchange, port, b"HEAD /h HTTP/1.1\r\nHost: x\r\n" + close + b"\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n") and b"content-length: 3" in head
    assert flushes == [1, 1]  # a head alone still leaves, at the end of its step

    flushes.clear()
    expecting = b"POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n" + close + b"\r\n"
    received = await asyncio.to_thread(_exchange, port, expecting, b"hello")
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and received.endswith(b"\r\n\r\n/c:hello")
    assert flushes == [1, 2]  # 100 Continue before the wait for the body, then the answer
