"""How fast a change made on one process is refused by another: polled as fast as it answers."""

import time

import httpx


async def refused_within(
    client: httpx.AsyncClient, path: str, headers: dict[str, str], expected: str, deadline_s: float
) -> float:
    """Seconds until `client`'s process answers 401 `expected` on `path`; until then every answer
    must be a 200 (the credential still works), and the deadline holds."""
    started = time.perf_counter()
    while True:
        response = await client.get(path, headers=headers)
        if response.status_code == 401 and response.json()["error"]["code"] == expected:
            return time.perf_counter() - started
        assert response.status_code == 200, response.text
        assert time.perf_counter() - started < deadline_s, f"still accepted after {deadline_s} s"
