"""(v3, issue 37 item 7) verify's latency by pace, beside /healthz's at the same paces: where the
tail comes from on this machine. One `tollgate up` of its own, 8 enterprise keys (no rate limit
binds), wrk with each connection waiting `WRK_DELAY_MS` between calls (bench/verify.py's script
and pieces), 10 s per pace, each started on a settled stack. Speed is reported, never asserted.

    .venv/bin/python bench/verify_paces.py
"""

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.e2e import tollgate_up
from bench.http_load import settle, tenant
from bench.verify import CLI, WRK_SCRIPT, Load, until_valid, verify_token
from tests.support.apps import REPO, free_port

HEALTHZ_PACES = [(1, 10.0), (1, 2.0)]  # (connections, ms each waits between its calls)
VERIFY_PACES = [(1, 10.0), (1, 2.0), (4, 5.0), (8, 8.0), (32, 50.0)]


async def main() -> None:
    state = REPO / ".tollgate" / f"bench-paces-{uuid.uuid4().hex[:6]}"
    port = free_port()
    for name in ("TOLLGATE_CLICKHOUSE_HTTP_PORT", "TOLLGATE_CLICKHOUSE_TCP_PORT", "TOLLGATE_REDIS_PORT"):
        os.environ[name] = str(free_port())
    env, _ = tollgate_up(state, port)
    base = f"http://127.0.0.1:{port}"
    script = Path(tempfile.mkdtemp()) / "verify.lua"
    script.write_text(WRK_SCRIPT)
    print(f"load average at the start: {os.getloadavg()[0]:.2f}")
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            keys = [(await tenant(http, base, "enterprise"))[1] for _ in range(8)]
            token = await asyncio.to_thread(verify_token, env, state)
            await until_valid(http, base, token, keys)
            await asyncio.sleep(20)  # every consumer joined its group
        for path, mode, paces in (("/healthz", "bearer", HEALTHZ_PACES), ("/api/edge/verify", "verify", VERIFY_PACES)):
            for connections, delay_ms in paces:
                await asyncio.to_thread(settle, state)
                load = Load(script, 10, connections, min(connections, 2))
                run, invalid = await asyncio.to_thread(
                    load.run, f"{base}{path}", [] if mode == "bearer" else keys, mode=mode, token=token, delay_ms=delay_ms
                )
                print(
                    f"{path:18} {connections:2} connection(s), {delay_ms:4.0f} ms apart: {run.per_s:7,.0f} req/s"
                    f"  p50 {run.p50_ms:6.2f} ms  p99 {run.p99_ms:7.2f} ms  non-2xx {run.non2xx}  not valid {invalid}"
                )
    finally:
        await asyncio.to_thread(subprocess.run, [*CLI, "down"], env=env, cwd=REPO, capture_output=True, check=False)
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(script.parent, ignore_errors=True)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
