"""What a user sees over HTTP: wrk against a running `tollgate up` stack, every path as a ratio of
GET /healthz measured by the same load generator in the same run.

Paths: /healthz (the baseline: no auth, no work); an admitted, metered API-key call
(GET /api/geo/projects with enterprise keys, rotated across accounts so no rate limit applies);
the admitted call paced at half its maximum throughput (its p99: issue 18 asks <= 50 ms);
an unknown key (401); a free key far over its rate limit (429). Then isolation: a second tenant's
throughput and p99 while a first floods with 429s, against the same tenant alone. After the
admitted run, a reconciliation: every 200 wrk saw is counted once in the accounts' `api_calls`.
The CPU of every process of the stack (serve, Kafka, Postgres, ClickHouse, Redis: all processes
below the stack's pid files, from /proc) from the admitted run's start until the stack is quiet
again (its calls consumed, counted and stored), divided by its calls, is the whole pipeline's CPU
per metered call; the same for each /healthz, 401 and 429, so that a path's cost can be set
against the baseline's process by process. Every measured path starts on a quiet stack, as the
/healthz baseline does. Last, a trickle: one connection, one admitted call every 200 ms, and the
stack's CPU per call over what the idle stack spends in as many seconds: what a call costs when it
travels alone (each consumer, the sink and Kafka then pay their per-batch costs for one call).

    (named http_load, not http: a script's folder comes first on sys.path and would hide the standard
library's `http`)

    .venv/bin/python bench/http_load.py [--seconds 15] [--connections 32] [--threads 2] [--accounts 5] [--workers N]
"""

import argparse
import asyncio
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.e2e import tollgate_up
from services.runtime.host.stack import StackConfig
from tests.support.apps import REPO, consumers_pids, free_port, process_tree, spawned_pids
from tests.support.platform import expect

# Each wrk thread rotates the Authorization header over the keys given after `--`; `done` prints
# one machine-readable line (wrk's own text output is for people). With WRK_DELAY_MS set, each
# connection waits that long before each request (wrk's `delay`): a paced, not a saturating, load.
WRK_SCRIPT = """
local keys = {}
local i = 0
local pace = tonumber(os.getenv("WRK_DELAY_MS") or "")
if pace then delay = function() return pace end end
init = function(args)
  for _, k in ipairs(args) do keys[#keys + 1] = k end
end
request = function()
  local headers = {}
  if #keys > 0 then
    i = i % #keys + 1
    headers["Authorization"] = "Bearer " .. keys[i]
  end
  return wrk.format("GET", nil, headers)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests": %d, "duration_us": %d, "non2xx": %d, "socket_errors": %d, "p50_us": %d, "p99_us": %d}\\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""
CLK_TCK = os.sysconf("SC_CLK_TCK")
FLAME_GRAPHS = REPO / "artifacts" / "flamegraphs"
TRICKLE_DELAY_MS = 200  # one connection's pause between calls: ~5 metered calls a second
PY_SPY = str(Path(sys.executable).with_name("py-spy"))  # a dev dependency (pyproject.toml)


def scripts_run(redis_port: int) -> int:
    """How many Lua scripts (the edge's rate limit and admission: one per call it asks Redis
    about) the stack's Redis has run."""
    stats = redis.Redis(port=redis_port).info("commandstats")
    return sum(int(stats.get(f"cmdstat_{command}", {}).get("calls", 0)) for command in ("evalsha", "eval"))


@dataclass(frozen=True)
class Run:
    requests: int
    seconds: float
    non2xx: int
    socket_errors: int
    p50_ms: float
    p99_ms: float

    @property
    def per_s(self) -> float:
        return self.requests / self.seconds

    def line(self, name: str, baseline: "Run | None" = None) -> str:
        ratio = f" -> {self.per_s / baseline.per_s:.3f} of /healthz" if baseline else ""
        return (
            f"{name:<34} {self.per_s:>9,.0f} req/s  p50 {self.p50_ms:6.1f} ms  p99 {self.p99_ms:6.1f} ms  "
            f"non-2xx {self.non2xx}  socket errors {self.socket_errors}{ratio}"
        )


def wrk(
    script: Path, url: str, keys: list[str], seconds: float, connections: int, threads: int, delay_ms: float | None = None
) -> Run:
    command = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{round(seconds)}s", "-s", str(script), url, "--", *keys]
    env = {**os.environ, **({"WRK_DELAY_MS": f"{delay_ms:.3f}"} if delay_ms is not None else {})}
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
    line = next(text for text in out.splitlines() if text.startswith("RESULT "))
    body = json.loads(line.removeprefix("RESULT "))
    return Run(
        requests=body["requests"],
        seconds=body["duration_us"] / 1e6,
        non2xx=body["non2xx"],
        socket_errors=body["socket_errors"],
        p50_ms=body["p50_us"] / 1000,
        p99_ms=body["p99_us"] / 1000,
    )


# ---- the CPU of the stack's processes -------------------------------------------------------------
def stack_cpu_seconds(state: Path) -> dict[str, float]:
    """utime+stime+cutime+cstime of every live process below the pid files under `state`, per pid
    file (named by its stem: kafka, clickhouse, ...; `tollgate up`'s serve process as "tollgate
    requests", its consumers' process apart), each CPU second counted once (a reaped child's time
    is in its parent's c-times, a live one's in its own)."""
    roots: dict[int, str] = {}
    for folder, _, files in os.walk(state):  # (rglob fails on a folder ClickHouse removes meanwhile)
        for name in files:
            if name.endswith(".pid"):
                try:
                    roots[int((Path(folder) / name).read_text().split()[0])] = name.removesuffix(".pid")
                except (OSError, ValueError, IndexError):
                    continue
    consumers = set()
    for pid, name in roots.items():
        if name == "tollgate":
            roots[pid] = "tollgate requests"
            try:
                consumers.update(consumers_pids(pid))
            except OSError:  # it ended meanwhile
                continue
    tree, seen, totals = process_tree(), set(), collections.Counter[str]()
    todo = list(roots.items())
    while todo:
        pid, name = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if pid in consumers:
            name = "tollgate consumers"
        todo.extend((child, name) for child in tree.get(pid, []))
        totals[name] += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return {name: ticks / CLK_TCK for name, ticks in totals.items()}


@dataclass(frozen=True)
class Measured:
    """A wrk run started on a quiet stack, and the stack's CPU for it."""

    run: Run
    cpu_by: dict[str, float]  # each process's, from the run's start until the stack is quiet again
    cpu_during: float  # every process's together, during the run alone
    catch_up_s: float  # how long after wrk stopped the stack was quiet again


def per_request(cpu_by: dict[str, float], requests: int) -> str:
    """Each process's CPU per request, the largest first, and their sum."""
    shares = sorted(cpu_by.items(), key=lambda item: -item[1])
    total = sum(cpu_by.values()) / max(requests, 1) * 1e6
    return f"{total:,.0f} us: " + ", ".join(f"{name} {seconds / max(requests, 1) * 1e6:,.0f} us" for name, seconds in shares)


def idle_rates(state: Path, seconds: float) -> dict[str, float]:
    """Each process's CPU per second while nothing calls the stack (after `settle`)."""
    before, started = stack_cpu_seconds(state), time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    return {name: (spent - before.get(name, 0.0)) / elapsed for name, spent in stack_cpu_seconds(state).items()}


def settle(state: Path, *, idle_share: float = 0.15, within: float = 120.0) -> float:
    """Wait until the stack is quiet again: two 1 s windows in a row in which all its processes
    together used less than `idle_share` of a core (idle it uses ~0.06). A run's calls are still
    being consumed, counted and stored after wrk stops; a path measured meanwhile shares the
    cores with that backlog, and its ratio to /healthz (measured on a quiet stack) would say less
    about the path than about the order of the runs. Returns the seconds it took."""
    started = time.monotonic()
    quiet = 0
    while quiet < 2 and time.monotonic() - started < within:
        before = sum(stack_cpu_seconds(state).values())
        time.sleep(1)
        quiet = quiet + 1 if sum(stack_cpu_seconds(state).values()) - before < idle_share else 0
    return time.monotonic() - started


def serving_processes(state: Path) -> list[int]:
    """`tollgate up`'s serve process, or its workers and consumers' process when it has them (`--workers N`)."""
    parent = int((state / "tollgate.pid").read_text().split()[0])
    return sorted(spawned_pids(parent)) or [parent]


def flame_graphs(state: Path, run: "Callable[[], Run]", seconds: float) -> tuple[Run, list[Path]]:
    """`run`, and py-spy flame graphs (SVG, under artifacts/flamegraphs/) of the serving processes during it."""
    FLAME_GRAPHS.mkdir(parents=True, exist_ok=True)
    recorders = []
    for pid in serving_processes(state):
        out = FLAME_GRAPHS / f"http_load-admitted-{pid}.svg"
        command = [PY_SPY, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200"]
        command += ["--nonblocking", "--format", "flamegraph", "--output", str(out)]
        recorders.append((out, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    result = run()
    for _, recorder in recorders:
        recorder.wait(timeout=seconds + 60)
    return result, [out for out, _ in recorders if out.exists()]


# ---- tenants -------------------------------------------------------------------------------------------
async def tenant(http: httpx.AsyncClient, base: str, plan: str | None) -> tuple[str, str]:
    """(console session, API key) of a new account, on `plan` (paid) or free."""
    email = f"b{uuid.uuid4().hex[:12]}@example.test"
    body = {"email": email, "password": "correct horse battery", "name": "Bench", "user_type": "enterprise"}
    await expect(await http.post(f"{base}/api/auth/register", json=body), 201)
    login = await expect(await http.post(f"{base}/api/auth/login", json={"email": email, "password": body["password"]}), 200)
    console = {"Authorization": f"Bearer {login['access_token']}"}
    key = await expect(await http.post(f"{base}/api/api-keys", json={"name": "bench"}, headers=console), 201)
    if plan is not None:
        order = await expect(
            await http.post(f"{base}/api/billing/orders", json={"kind": "plan_upgrade", "plan": plan}, headers=console), 201
        )
        await expect(await http.post(f"{base}/api/billing/orders/{order['id']}/pay", headers=console), 200)
    return console["Authorization"], key["key"]


async def api_calls_used(http: httpx.AsyncClient, base: str, console: str) -> int:
    body = await expect(await http.get(f"{base}/api/billing/check-quota", headers={"Authorization": console}), 200)
    return int(next(item["used"] for item in body["items"] if item["resource"] == "api_calls"))


def measure_stack_cpu(
    state: Path, script: Path, url: str, keys: list[str], seconds: float, connections: int, threads: int, *, trickle: bool = False
) -> Measured:
    """wrk on a quiet stack, with the stack's CPU until it is quiet again: for a metered call,
    until it is consumed, counted and stored (the consumers' process is niced and catches up
    after wrk stops). `trickle`: one connection, a call every TRICKLE_DELAY_MS, and the CPU over
    what the idle stack spends in as many seconds."""
    settle(state)
    idle = idle_rates(state, seconds) if trickle else {}
    before, started = stack_cpu_seconds(state), time.monotonic()
    if trickle:
        run = wrk(script, url, keys, seconds, 1, 1, TRICKLE_DELAY_MS)
    else:
        run = wrk(script, url, keys, seconds, connections, threads)
    during = sum(stack_cpu_seconds(state).values()) - sum(before.values())
    catch_up = settle(state)
    elapsed = time.monotonic() - started
    cpu_by = {
        name: spent - before.get(name, 0.0) - idle.get(name, 0.0) * elapsed for name, spent in stack_cpu_seconds(state).items()
    }
    return Measured(run, cpu_by, during, catch_up)


async def reconcile(
    http: httpx.AsyncClient, base: str, paying: list[tuple[str, str]], before: list[int], expected: int, in_flight: int
) -> bool:
    """Every admitted call is counted once in the accounts' `api_calls`: wrk does not count the
    responses still in flight when its time is up (at most `in_flight`), which were metered too."""
    deadline = time.monotonic() + 90
    counted = -1
    while time.monotonic() < deadline:
        after = [await api_calls_used(http, base, console) for console, _ in paying]
        counted = sum(a - b for a, b in zip(after, before, strict=True))
        if counted >= expected:
            break
        await asyncio.sleep(1)
    exact = expected <= counted <= expected + in_flight
    print(
        f"reconciliation: {counted} api_calls counted for {expected} admitted calls seen by wrk "
        f"(+ at most {in_flight} in flight when wrk stopped): {'exact' if exact else 'FAILED'}"
    )
    return exact


async def trickle_alone(
    http: httpx.AsyncClient,
    base: str,
    state: Path,
    script: Path,
    keys: list[str],
    seconds: float,
    paying: list[tuple[str, str]],
    before: list[int],
) -> int:
    """`--trickle-only`: the trickle alone (what a lonely call costs), with its reconciliation."""
    url = f"{base}/api/geo/projects"
    trickled = await asyncio.to_thread(lambda: measure_stack_cpu(state, script, url, keys, seconds, 1, 1, trickle=True))
    trickle = trickled.run
    alone_calls = trickle.requests - trickle.non2xx
    print(trickle.line("admitted, trickling (1 connection)"))
    print(
        "  whole-stack CPU per trickled call over the idle stack's, until quiet again: "
        + per_request(trickled.cpu_by, alone_calls)
    )
    return 0 if await reconcile(http, base, paying, before, alone_calls, 1) else 1


async def main(
    seconds: float, connections: int, threads: int, accounts: int, workers: int | None, trickle_only: bool = False
) -> int:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: ./deploy/local/prereqs.sh --bench")
    state = REPO / ".tollgate" / f"bench-http-{uuid.uuid4().hex[:6]}"
    port = free_port()
    env, _ = tollgate_up(state, port, *(["--workers", str(workers)] if workers else []))
    redis_port = int(env.get("TOLLGATE_REDIS_PORT", StackConfig(state_dir=state).redis_port))
    base = f"http://127.0.0.1:{port}"
    script = Path(tempfile.mkdtemp()) / "rotate.lua"
    script.write_text(WRK_SCRIPT)
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            paying = [await tenant(http, base, "enterprise") for _ in range(accounts)]
            _, free_key = await tenant(http, base, None)
            # The plans reach the edge through billing.v1, and every worker's consumers must have
            # joined their groups (each join moves partitions; a run during that measures the joins).
            await asyncio.sleep(20)
            keys = [key for _, key in paying]
            before = [await api_calls_used(http, base, console) for console, _ in paying]
            if trickle_only:
                return await trickle_alone(http, base, state, script, keys, seconds, paying, before)

            def measure(path: str, keys: list[str]) -> Run:
                return wrk(script, f"{base}{path}", keys, seconds, connections, threads)

            def measure_cpu(path: str, keys: list[str], *, trickle: bool = False) -> Measured:
                return measure_stack_cpu(state, script, f"{base}{path}", keys, seconds, connections, threads, trickle=trickle)

            baseline = await asyncio.to_thread(measure_cpu, "/healthz", [])
            metered_scripts = scripts_run(redis_port)
            metered = await asyncio.to_thread(measure_cpu, "/api/geo/projects", keys)
            metered_scripts = scripts_run(redis_port) - metered_scripts
            healthz, admitted = baseline.run, metered.run
            cpu = sum(metered.cpu_by.values())
            # Issue 18's latency bound: p99 <= 50 ms at half the maximum throughput. Each connection
            # waits between its calls; a first pass tells the call's own time at that pace, which
            # the second takes off the wait to land on half.
            target = admitted.per_s / 2
            cycle_ms = connections * 1000 / target  # each connection's time per call at the target
            first = await asyncio.to_thread(
                wrk, script, f"{base}/api/geo/projects", keys, seconds, connections, threads, cycle_ms
            )
            call_ms = connections * 1000 / first.per_s - cycle_ms
            paced = await asyncio.to_thread(
                wrk, script, f"{base}/api/geo/projects", keys, seconds, connections, threads, max(0.0, cycle_ms - call_ms)
            )
            unknown_key = await asyncio.to_thread(measure_cpu, "/api/geo/projects", ["sk-" + "x" * 45])
            scripts_before = scripts_run(redis_port)
            over_limit = await asyncio.to_thread(measure_cpu, "/api/geo/projects", [free_key])
            unknown, limited = unknown_key.run, over_limit.run
            flood_round_trips = scripts_run(redis_port) - scripts_before

            # Isolation: tenant B alone, then B while A floods with 429s (half the connections each).
            # B is the paying accounts together: one enterprise account's own limit (500 calls/s)
            # is within reach of half the connections, and B's own 429s would blur the figure.
            half = max(1, connections // 2)
            await asyncio.to_thread(settle, state)
            alone = await asyncio.to_thread(wrk, script, f"{base}/api/geo/projects", keys, seconds, half, 1)
            await asyncio.to_thread(settle, state)
            flood = asyncio.to_thread(wrk, script, f"{base}/api/geo/projects", [free_key], seconds, half, 1)
            victim = asyncio.to_thread(wrk, script, f"{base}/api/geo/projects", keys, seconds, half, 1)
            _, crowded = await asyncio.gather(flood, victim)

            trickled = await asyncio.to_thread(lambda: measure_cpu("/api/geo/projects", keys, trickle=True))
            trickle = trickled.run

            # Where a metered call's time goes: one more admitted run, under py-spy this time (its
            # sampling takes CPU, so not during the measured runs), a flame graph per serving process.
            profiled, graphs = await asyncio.to_thread(flame_graphs, state, lambda: measure("/api/geo/projects", keys), seconds)

            shape = f"--workers {workers}" if workers else f"default --workers ({os.cpu_count()})"
            print(f"wrk -t{threads} -c{connections} -d{seconds:g}s against one `tollgate up` ({shape}) on {os.cpu_count()} cores")
            print(healthz.line("GET /healthz (baseline)"))
            print("  whole-stack CPU per /healthz until quiet again: " + per_request(baseline.cpu_by, healthz.requests))
            print(admitted.line("admitted API-key call (metered)", healthz))
            served_calls = max(1, admitted.requests - admitted.non2xx)
            print(f"  Redis round trips (scripts run) per admitted call: {metered_scripts / served_calls:.3f}")
            print(
                paced.line("admitted, paced")
                + f" -> {paced.per_s / admitted.per_s:.2f} of the maximum (goal: p99 <= 50 ms at 0.5)"
            )
            print(unknown.line("unknown key (401)", healthz))
            print("  whole-stack CPU per 401 until quiet again: " + per_request(unknown_key.cpu_by, unknown.requests))
            print(limited.line("free key over its limit (429)", healthz))
            print("  whole-stack CPU per 429 until quiet again: " + per_request(over_limit.cpu_by, limited.requests))
            print(
                f"  rate-limit round trips to Redis: {flood_round_trips:,} for {limited.requests - limited.non2xx} calls "
                f"admitted and {limited.non2xx:,} refused (the rest from the edge's copies)"
            )
            print(alone.line("tenant B alone"))
            print(crowded.line("tenant B while A floods 429s"))
            print(
                f"isolation: B's throughput {crowded.per_s / alone.per_s:.2f}x and p99 "
                f"{crowded.p99_ms / alone.p99_ms:.2f}x of alone (goal: within 1.5x)"
            )
            print("flame graphs of the admitted calls' serving processes: " + ", ".join(str(g) for g in graphs))
            served = admitted.requests - admitted.non2xx
            print(
                f"whole-stack CPU per metered call: {cpu / max(served, 1) * 1e6:,.0f} us ({cpu:.1f} CPU-s / {served} calls, "
                f"until the stack was quiet again {metered.catch_up_s:.0f} s after wrk stopped; "
                f"{metered.cpu_during / max(served, 1) * 1e6:,.0f} us during the run alone)"
            )
            print("  of which: " + per_request(metered.cpu_by, served))
            alone_calls = trickle.requests - trickle.non2xx
            print(trickle.line("admitted, trickling (1 connection)"))
            print(
                "  whole-stack CPU per trickled call over the idle stack's, until quiet again: "
                + per_request(trickled.cpu_by, alone_calls)
            )

            # Every admitted call is counted once (the isolation runs added B's calls).
            b_calls = alone.requests - alone.non2xx + crowded.requests - crowded.non2xx
            paced_calls = first.requests - first.non2xx + paced.requests - paced.non2xx
            expected = served + paced_calls + b_calls + alone_calls + profiled.requests - profiled.non2xx
            # wrk does not count the responses still in flight when its time is up (at most one per
            # connection and run), but the server admitted and metered those calls too.
            in_flight = 4 * connections + 2 * half + 1
            return 0 if await reconcile(http, base, paying, before, expected, in_flight) else 1
    finally:
        down = [sys.executable, "-m", "services.runtime.host.cli", "down"]
        await asyncio.to_thread(subprocess.run, down, env=env, cwd=REPO, capture_output=True, check=False)
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(script.parent, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--accounts", type=int, default=5)
    parser.add_argument("--workers", type=int, default=None, help="`tollgate up --workers` (default: its own)")
    parser.add_argument("--trickle-only", action="store_true", help="only the trickle: what a lonely call costs")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.seconds, args.connections, args.threads, args.accounts, args.workers, args.trickle_only)))
