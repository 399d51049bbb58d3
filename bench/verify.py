"""(v3, issue 37 item 7) verify and authorize over HTTP: wrk against a `tollgate up` of its own,
every figure with its baseline measured by the same wrk in the same run.

Runs, each on a quiet stack (the previous run's calls consumed, counted and stored):
  1. GET /healthz: the baseline (no auth, no work);
  2. POST /api/edge/verify with a keys:verify service token, the body naming a key rotated over
     enterprise accounts (so no rate limit binds): verify's throughput as a ratio of /healthz;
  3. verify paced at half that throughput: its p50 and p99 (goal: p99 <= 5 ms on loopback);
  4. the shipped nginx snippet (deploy/ingress/nginx/example.conf, its addresses and token
     replaced) in front of a static upstream (a server block of the same nginx answering 200),
     wrk GETting through it with the keys rotated in `Authorization: Bearer`: its throughput as a
     ratio of verify's (goal >= 0.8: the ingress adds little); and, as sanity baselines, the
     static upstream alone and nginx proxying to it without the snippet.
Every response must be a 200, and every verify answer `valid: true`: the script says so and exits
1 otherwise. Speed is reported, never asserted. With --profile, one more verify run at saturation
under py-spy (after the measured ones) tells where a request worker's time goes.

    .venv/bin/python bench/verify.py [--seconds 10] [--connections 32] [--threads 2] [--accounts 8] [--profile]
        [--no-ingress]

--no-ingress leaves out step 4 (nginx): verify's own cost, base against new, in half the time.
"""

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.e2e import tollgate_up
from bench.http_load import CLK_TCK, PY_SPY, Run, per_request, scripts_run, settle, stack_cpu_seconds, tenant
from services.runtime.host import split
from services.runtime.host.stack import StackConfig
from tests.support.apps import REPO, free_port, process_tree, worker_pids

NGINX = REPO / "deploy" / "ingress" / "nginx"
PROTECTED = "/v1/models"  # a path under example.conf's protected `location /v1/`
CLI = [sys.executable, "-m", "services.runtime.host.cli"]

# Every request is formatted once, in `init`, from the arguments after `--` (wrk's `request` then
# only picks the next one). WRK_MODE=verify: each argument is a key, sent in verify's JSON body with
# the service token of WRK_SERVICE_TOKEN; WRK_MODE=bearer: each argument is a key sent as
# `Authorization: Bearer`; no arguments: a plain GET. In verify mode each answer's body is checked
# for `"valid":true` (counted in `invalid` otherwise; read from every thread by `done`).
# WRK_DELAY_MS: each connection waits that long before each request, a paced load.
WRK_SCRIPT = """
local requests = {}
local i = 0
local mode = os.getenv("WRK_MODE") or "bearer"
local pace = tonumber(os.getenv("WRK_DELAY_MS") or "")
if pace then delay = function() return pace end end
local threads = {}
setup = function(thread) threads[#threads + 1] = thread end
invalid = 0
init = function(args)
  for _, key in ipairs(args) do
    if mode == "verify" then
      local body = '{"key":"' .. key .. '","method":"GET","path":"/v1/models","ip":"203.0.113.7",'
        .. '"user_agent":"bench-verify","resource":"ai_tokens"}'
      local headers = {["Authorization"] = "Bearer " .. os.getenv("WRK_SERVICE_TOKEN"),
                       ["Content-Type"] = "application/json"}
      requests[#requests + 1] = wrk.format("POST", nil, headers, body)
    else
      requests[#requests + 1] = wrk.format("GET", nil, {["Authorization"] = "Bearer " .. key})
    end
  end
  if #requests == 0 then requests[1] = wrk.format("GET", nil, {}) end
end
request = function()
  i = i % #requests + 1
  return requests[i]
end
if mode == "verify" then
  response = function(status, headers, body)
    if not string.find(body, '"valid":%s*true') then invalid = invalid + 1 end
  end
end
done = function(summary, latency, requests)
  local e = summary.errors
  local bad = 0
  for _, thread in ipairs(threads) do bad = bad + (thread:get("invalid") or 0) end
  io.write(string.format(
    'RESULT {"requests": %d, "duration_us": %d, "non2xx": %d, "socket_errors": %d, "p50_us": %d, "p99_us": %d, "invalid": %d}\\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99), bad))
end
"""


@dataclass(frozen=True)
class Load:
    """How wrk loads: its script, connections, threads, seconds."""

    script: Path
    seconds: float
    connections: int
    threads: int

    def run(
        self, url: str, keys: list[str], *, mode: str = "bearer", token: str = "", delay_ms: float | None = None
    ) -> tuple[Run, int]:
        """wrk's figures, and how many verify answers were not `valid: true`."""
        command = ["wrk", "-t", str(self.threads), "-c", str(self.connections), "-d", f"{round(self.seconds)}s"]
        command += ["-s", str(self.script), url, "--", *keys]
        env = {**os.environ, "WRK_MODE": mode, "WRK_SERVICE_TOKEN": token}
        if delay_ms is not None:
            env["WRK_DELAY_MS"] = f"{delay_ms:.3f}"
        out = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
        body = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT ")).removeprefix("RESULT "))
        run = Run(
            requests=body["requests"],
            seconds=body["duration_us"] / 1e6,
            non2xx=body["non2xx"],
            socket_errors=body["socket_errors"],
            p50_ms=body["p50_us"] / 1000,
            p99_ms=body["p99_us"] / 1000,
        )
        return run, int(body["invalid"])

    def paced_at_half(self, url: str, keys: list[str], maximum: Run, mode: str, token: str) -> tuple[Run, int]:
        """The load paced at half `maximum`'s throughput. Each connection waits between its calls; a
        first pass tells the call's own time at that pace, which the second takes off the wait."""
        cycle_ms = self.connections * 1000 / (maximum.per_s / 2)  # each connection's time per call
        first, _ = self.run(url, keys, mode=mode, token=token, delay_ms=cycle_ms)
        call_ms = self.connections * 1000 / first.per_s - cycle_ms
        return self.run(url, keys, mode=mode, token=token, delay_ms=max(0.0, cycle_ms - call_ms))


@dataclass(frozen=True)
class Measured:
    run: Run
    invalid: int  # verify's answers that were not `valid: true`
    cpu_by: dict[str, float]  # each process's CPU seconds, from the run's start until the stack was quiet again
    workers: tuple[float, float] = (0.0, 0.0)  # the request workers' user and system (kernel) seconds of those

    def cpu_line(self) -> str:
        user, system = (round(seconds * 1e6 / max(1, self.run.requests)) for seconds in self.workers)
        return (
            "  CPU per request until quiet again: "
            + per_request(self.cpu_by, self.run.requests)
            + f"\n  request workers: user {user:,} us, system {system:,} us"
        )


def workers_user_system(state: Path) -> tuple[float, float]:
    """utime and stime of `tollgate up`'s request workers (live ones), in seconds."""
    parent = int((state / "tollgate.pid").read_text().split()[0])
    user = system = 0
    for pid in worker_pids(parent):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user, system = user + int(fields[11]), system + int(fields[12])
    return user / CLK_TCK, system / CLK_TCK


# ---- the stack -----------------------------------------------------------------------------------
def stack_settings(env: dict[str, str], state: Path) -> dict[str, str]:
    """The settings that point a Tollgate command (here `service-token create`) at this stack."""
    config = StackConfig(
        state_dir=state,
        kafka_port=int(env["TOLLGATE_KAFKA_PORT"]),
        controller_port=int(env["TOLLGATE_KAFKA_CONTROLLER_PORT"]),
        postgres_port=int(env["TOLLGATE_POSTGRES_PORT"]),
        clickhouse_http_port=int(env["TOLLGATE_CLICKHOUSE_HTTP_PORT"]),
        clickhouse_tcp_port=int(env["TOLLGATE_CLICKHOUSE_TCP_PORT"]),
        redis_port=int(env["TOLLGATE_REDIS_PORT"]),
    )
    return {**env, **config.env()}


def verify_token(env: dict[str, str], state: Path) -> str:
    """A new service token with the scope keys:verify, made as an operator would."""
    made = subprocess.run(
        [*CLI, "service-token", "create", "bench-verify", "--scope", "keys:verify"],
        env=stack_settings(env, state),
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return str(json.loads(made.stdout[made.stdout.index("{") :])["token"])


async def until_valid(http: httpx.AsyncClient, base: str, token: str, keys: list[str], within: float = 60) -> None:
    """Every key verified `valid: true` with this token: the token and the accounts' enterprise
    plans have reached the edge (through Kafka)."""
    deadline = time.monotonic() + within
    pending = list(keys)
    while pending:
        body = {"key": pending[0], "method": "GET", "path": PROTECTED, "ip": "203.0.113.7", "resource": "ai_tokens"}
        answer = await http.post(f"{base}/api/edge/verify", json=body, headers={"Authorization": f"Bearer {token}"})
        if answer.status_code == 200 and answer.json()["valid"] and answer.json()["plan"] == "enterprise":
            pending.pop(0)
            continue
        if time.monotonic() > deadline:
            raise SystemExit(f"verify never admitted the bench's key: {answer.status_code} {answer.text}")
        await asyncio.sleep(0.5)


# ---- nginx ---------------------------------------------------------------------------------------
def tree_cpu_seconds(root: int) -> float:
    """utime+stime+cutime+cstime of `root` and every live process below it (nginx's master and workers)."""
    tree, todo, ticks = process_tree(), [root], 0
    while todo:
        pid = todo.pop()
        try:
            ticks += sum(int(f) for f in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:15])
        except OSError:
            continue
        todo.extend(tree.get(pid, []))
    return ticks / CLK_TCK


@dataclass(frozen=True)
class Ingress:
    pid: int  # nginx's master
    protected: str  # through the shipped snippet: auth_request to Tollgate, then the static upstream
    open: str  # the same nginx proxying to the static upstream without the snippet
    static: str  # the static upstream itself


def rendered_example(tollgate: str, token: str, listen: int, static: int, open_port: int) -> str:
    """deploy/ingress/nginx/example.conf as shipped, its three addresses and its token replaced, and
    two server blocks added: the static upstream (answers 200) and an unprotected proxy to it."""
    text = (NGINX / "example.conf").read_text()
    for old, new in (
        ("server 127.0.0.1:8080;", f"server {tollgate};"),
        ("server 127.0.0.1:9000;", f"server 127.0.0.1:{static};"),
        ("listen 127.0.0.1:8443;", f"listen 127.0.0.1:{listen};"),
        ("st-REPLACE_WITH_A_KEYS_VERIFY_TOKEN", token),
    ):
        if old not in text:
            raise SystemExit(f"example.conf no longer has {old!r}: update bench/verify.py")
        text = text.replace(old, new)
    added = f"""
  server {{  # the protected service, static: what the snippet adds is all there is to measure
    listen 127.0.0.1:{static};
    location / {{ default_type text/plain; return 200 "ok\\n"; }}
  }}
  server {{  # the same proxying without the snippet
    listen 127.0.0.1:{open_port};
    location /v1/ {{ proxy_http_version 1.1; proxy_set_header Connection ""; proxy_pass http://ai_gateway; }}
  }}
}}"""
    head, _, _ = text.rpartition("}")  # the http block's end
    return head + added.lstrip("\n")


@contextmanager
def nginx(tollgate: str, token: str) -> Iterator[Ingress]:
    run_dir = Path(tempfile.mkdtemp(prefix="bench-verify-nginx-"))
    for name in ("tollgate-server.conf", "tollgate-protect.conf"):
        shutil.copy(NGINX / name, run_dir / name)
    listen, static, open_port = free_port(), free_port(), free_port()
    conf = run_dir / "nginx.conf"
    conf.write_text(rendered_example(tollgate, token, listen, static, open_port))
    (run_dir / "logs").mkdir()
    shape = split.SplitShape(run_dir, listen, ())
    check = subprocess.run(split._nginx_cmd(shape, conf, "-t", "-q"), capture_output=True, text=True)
    if check.returncode != 0:
        raise SystemExit(f"nginx refuses the rendered example.conf: {check.stderr.strip()}")
    proc = subprocess.Popen(split._nginx_cmd(shape, conf, foreground=True), stderr=subprocess.DEVNULL)
    try:
        ingress = Ingress(
            proc.pid,
            f"http://127.0.0.1:{listen}{PROTECTED}",
            f"http://127.0.0.1:{open_port}{PROTECTED}",
            f"http://127.0.0.1:{static}/",
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                httpx.get(ingress.static, timeout=1).raise_for_status()
                break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("nginx did not start") from None
                time.sleep(0.05)
        yield ingress
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(run_dir, ignore_errors=True)


# ---- where a verify's time goes (--profile) -----------------------------------------------------------
def profiled(state: Path, run: Callable[[], object], seconds: float, top: int = 20) -> list[str]:
    """`run` while py-spy samples every request worker (not during the measured runs: sampling takes
    CPU): the functions with the most busy samples of their own, then each function's inclusive share
    below the chain every request passes (uvicorn, the middlewares, the router: over 60%)."""
    parent = int((state / "tollgate.pid").read_text().split()[0])
    folder = Path(tempfile.mkdtemp(prefix="bench-verify-pyspy-"))
    recorders = []
    for pid in worker_pids(parent):
        command = [PY_SPY, "record", "--pid", str(pid), "--duration", str(round(seconds)), "--rate", "200"]
        command += ["--nonblocking", "--format", "raw", "--output", str(folder / f"{pid}.txt")]
        recorders.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    run()
    for recorder in recorders:
        recorder.wait(timeout=seconds + 60)
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for out in folder.glob("*.txt"):
        for line in out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]  # per function, not line
            inclusive.update({frame: int(count) for frame in set(frames)})
            own[frames[-1]] += int(count)
            total += int(count)
    shutil.rmtree(folder, ignore_errors=True)
    share = max(total, 1)
    lines = [f"own time ({total:,} busy samples of the request workers):"]
    lines += [f"  {n / share:6.1%}  {frame}" for frame, n in own.most_common(top)]
    lines.append("inclusive, below the chain every request passes:")
    below = [(frame, n) for frame, n in inclusive.most_common() if n / share < 0.6]
    lines += [f"  {n / share:6.1%}  {frame}" for frame, n in below[: top + 10]]
    return lines


# ---- the run -------------------------------------------------------------------------------------
def checked(name: str, run: Run, invalid: int = 0) -> tuple[str, bool]:
    good = run.non2xx == 0 and invalid == 0
    word = "all 200" if good else f"NOT all 200: {run.non2xx} non-2xx"
    return f"  {name}: {run.requests:,} responses, {word}" + (f", {invalid} not valid" if invalid else "") + (
        f", {run.socket_errors} socket errors" if run.socket_errors else ""
    ), good


async def main(seconds: float, connections: int, threads: int, accounts: int, profile: bool, ingress: bool = True) -> int:
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: ./deploy/local/prereqs.sh --bench")
    load_before = os.getloadavg()
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    state = REPO / ".tollgate" / f"bench-verify-{uuid.uuid4().hex[:6]}"
    port = free_port()
    # Every port of the stack its own (tollgate_up picks Kafka's and Postgres's; the rest from here).
    for name in ("TOLLGATE_CLICKHOUSE_HTTP_PORT", "TOLLGATE_CLICKHOUSE_TCP_PORT", "TOLLGATE_REDIS_PORT"):
        os.environ[name] = str(free_port())
    env, _ = tollgate_up(state, port)
    base = f"http://127.0.0.1:{port}"
    script = Path(tempfile.mkdtemp()) / "verify.lua"
    script.write_text(WRK_SCRIPT)
    load = Load(script, seconds, connections, threads)
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            keys = [(await tenant(http, base, "enterprise"))[1] for _ in range(accounts)]
            token = await asyncio.to_thread(verify_token, env, state)
            await until_valid(http, base, token, keys)
            # every worker's consumers must have joined their groups (each join moves partitions)
            await asyncio.sleep(20)

            def quiet_run(
                url: str, keys: list[str], nginx_pid: int | None = None, mode: str = "bearer", token: str = ""
            ) -> Measured:
                """A run started on a quiet stack, with every process's CPU (the stack's and nginx's)
                from its start until the stack is quiet again (its calls consumed, counted, stored)."""

                def cpu() -> dict[str, float]:
                    return {**stack_cpu_seconds(state), **({"nginx": tree_cpu_seconds(nginx_pid)} if nginx_pid else {})}

                settle(state)
                before, workers_before = cpu(), workers_user_system(state)
                run, invalid = load.run(url, keys, mode=mode, token=token)
                settle(state)
                spent_by = {name: spent - before.get(name, 0.0) for name, spent in cpu().items()}
                workers = tuple(after - was for after, was in zip(workers_user_system(state), workers_before, strict=True))
                return Measured(run, invalid, spent_by, (workers[0], workers[1]))

            verify_url = f"{base}/api/edge/verify"
            healthz = await asyncio.to_thread(quiet_run, f"{base}/healthz", [])
            verify_scripts = scripts_run(int(env["TOLLGATE_REDIS_PORT"]))
            verify = await asyncio.to_thread(quiet_run, verify_url, keys, mode="verify", token=token)
            verify_scripts = scripts_run(int(env["TOLLGATE_REDIS_PORT"])) - verify_scripts
            await asyncio.to_thread(settle, state)
            paced, paced_invalid = await asyncio.to_thread(load.paced_at_half, verify_url, keys, verify.run, "verify", token)
            samples: list[str] = []
            if profile:
                await asyncio.to_thread(settle, state)
                samples = await asyncio.to_thread(
                    profiled, state, lambda: load.run(verify_url, keys, mode="verify", token=token), seconds
                )
            through: tuple[Measured, Measured, Measured] | None = None
            if ingress:
                with nginx(f"127.0.0.1:{port}", token) as proxy:
                    through = (
                        await asyncio.to_thread(quiet_run, proxy.static, [], proxy.pid),
                        await asyncio.to_thread(quiet_run, proxy.open, keys, proxy.pid),
                        await asyncio.to_thread(quiet_run, proxy.protected, keys, proxy.pid),
                    )
    finally:
        await asyncio.to_thread(subprocess.run, [*CLI, "down"], env=env, cwd=REPO, capture_output=True, check=False)
        shutil.rmtree(state, ignore_errors=True)
        shutil.rmtree(script.parent, ignore_errors=True)
    load_after = os.getloadavg()

    print(
        f"wrk -t{threads} -c{connections} -d{seconds:g}s against one `tollgate up` (default --workers) on "
        f"{os.cpu_count()} cores, {accounts} enterprise accounts; {started_at}; "
        f"load average {load_before[0]:.2f} at the start, {load_after[0]:.2f} at the end"
    )
    print(healthz.run.line("GET /healthz (baseline)"))
    print(healthz.cpu_line())
    print(verify.run.line("POST /api/edge/verify", healthz.run))
    print(verify.cpu_line())
    print(f"  Redis round trips (scripts run) per verify: {verify_scripts / max(1, verify.run.requests):.3f}")
    goal_p99 = "met" if paced.p99_ms <= 5 else "MISSED"
    print(
        paced.line("verify, paced")
        + f" -> {paced.per_s / verify.run.per_s:.2f} of verify's maximum (goal: p99 <= 5 ms at 0.5: {goal_p99})"
    )
    if through is not None:
        static, proxied, protected = through
        print(static.run.line("static upstream alone (nginx)"))
        print(static.cpu_line())
        print(proxied.run.line("nginx -> static, no snippet"))
        print(proxied.cpu_line())
        ratio = protected.run.per_s / verify.run.per_s
        print(
            protected.run.line("nginx + snippet -> static")
            + f" -> {ratio:.3f} of verify's throughput (goal >= 0.8: {'met' if ratio >= 0.8 else 'MISSED'}), "
            + f"{protected.run.per_s / healthz.run.per_s:.3f} of /healthz"
        )
        print(protected.cpu_line())
    if samples:
        print("where a request worker's time goes under verify at saturation (py-spy, inclusive, busy samples):")
        print("\n".join(samples))
    lines = [
        checked("/healthz", healthz.run),
        checked("verify", verify.run, verify.invalid),
        checked("verify paced", paced, paced_invalid),
    ]
    if through is not None:
        lines += [
            checked("static upstream", through[0].run),
            checked("nginx without the snippet", through[1].run),
            checked("nginx with the snippet", through[2].run),
        ]
    print("responses (each must be a 200, and each of verify's `valid: true`):")
    for line, _ in lines:
        print(line)
    return 0 if all(good for _, good in lines) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--accounts", type=int, default=8, help="enterprise accounts (500 calls/s each at most)")
    parser.add_argument("--profile", action="store_true", help="one more verify run under py-spy: where the time goes")
    parser.add_argument("--no-ingress", dest="ingress", action="store_false", help="leave out the nginx runs")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.seconds, args.connections, args.threads, args.accounts, args.profile, args.ingress)))
