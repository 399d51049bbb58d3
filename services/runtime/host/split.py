"""The split shape on one machine (`tollgate up --split`): one `serve --target <service>` process
per service, two replicas of the edge-heavy ones, behind nginx routing by path prefix.

The ingress is deploy/ingress.conf, the very file docker-compose mounts: only its upstreams'
`server <service>:8080;` lines and its `listen` are rewritten to point at the local processes,
so the routes exist once for both.

Every process runs in a session of its own, with a pid file in the run folder; `stop` ends them.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from services.runtime.host import stack

INGRESS_CONF = stack.REPO_ROOT / "deploy" / "ingress.conf"

# geo and metering take the API-key and platform traffic: every API-key call (geo) goes through the
# edge's key lookup, rate limits and api_calls admission, and every usage report (metering) is an
# acks=all publish; both scale with the customers' traffic, the others with their people. Two
# replicas of metering also split its consumer group (usage -> ClickHouse) between two processes.
# Every service of app.SERVICES, in its order (tests/unit/test_split.py checks; not imported here,
# so that `tollgate down` does not load every service).
REPLICAS: Mapping[str, int] = {"keys": 1, "billing": 1, "quota": 1, "metering": 2, "alerts": 1, "geo": 2}
SERVICES = tuple(REPLICAS)


@dataclass(frozen=True)
class Replica:
    service: str
    index: int
    port: int

    @property
    def name(self) -> str:
        return f"{self.service}-{self.index}"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class SplitShape:
    run_dir: Path
    ingress_port: int
    replicas: tuple[Replica, ...]

    @property
    def ingress_url(self) -> str:
        return f"http://127.0.0.1:{self.ingress_port}"

    def of(self, service: str) -> list[Replica]:
        return [r for r in self.replicas if r.service == service]

    def pid_file(self, replica: Replica) -> Path:
        return self.run_dir / f"{replica.name}.pid"

    @property
    def nginx_pid_file(self) -> Path:
        return self.run_dir / "nginx.pid"


def shape(run_dir: Path, ingress_port: int, first_port: int, replicas: Mapping[str, int] = REPLICAS) -> SplitShape:
    """The processes, on consecutive ports from `first_port`, in SERVICES order."""
    planned: list[Replica] = []
    for service in SERVICES:
        for index in range(1, replicas[service] + 1):
            planned.append(Replica(service, index, first_port + len(planned)))
    return SplitShape(run_dir.resolve(), ingress_port, tuple(planned))


def render_ingress(split: SplitShape) -> str:
    """deploy/ingress.conf with its upstreams on the local replicas and its listener on loopback."""
    text = INGRESS_CONF.read_text()

    served: set[str] = set()

    def servers(match: re.Match[str]) -> str:
        service = match.group(1)
        if service not in SERVICES:
            raise ValueError(f"{INGRESS_CONF} routes to an unknown service {service!r}")
        served.add(service)
        return " ".join(f"server 127.0.0.1:{r.port};" for r in split.of(service))

    text = re.sub(r"server (\w+):8080;", servers, text)
    text, listens = re.subn(r"listen 8080;", f"listen 127.0.0.1:{split.ingress_port};", text)
    if served != set(SERVICES) or listens != 1:
        raise ValueError(f"{INGRESS_CONF}: expected a `server <service>:8080;` of every service and one `listen 8080;`")
    temp = split.run_dir / "nginx-temp"
    local = "\n".join(f"  {name}_temp_path {temp / name};" for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    # Local only: no access log (the services log), temporary files in the run folder.
    return text.replace("http {", f"http {{\n  access_log off;\n{local}", 1)


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if found is None:
        raise SystemExit("nginx not found: install nginx (deploy/local/prereqs.sh)")
    return found


def _nginx_cmd(split: SplitShape, conf: Path, *extra: str, foreground: bool = False) -> list[str]:
    directives = f"pid {split.nginx_pid_file};" + (" daemon off;" if foreground else "")
    if os.geteuid() == 0:
        directives += " user nobody nogroup;"  # workers never run as root
    return [nginx_binary(), "-p", str(split.run_dir), "-e", str(split.run_dir / "logs" / "nginx.log"), "-c", str(conf),
            "-g", directives, *extra]  # fmt: skip


def start_replica(split: SplitShape, replica: Replica, env: Mapping[str, str]) -> None:
    """`serve --target <service>` for one replica, unless its pid file names a live process."""
    pid_file = split.pid_file(replica)
    if stack._read_pid(pid_file):
        return
    logs = split.run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    # One worker each: the replicas are the shape's processes, counted in REPLICAS.
    cmd = [sys.executable, "-m", "services.runtime.host.cli", "serve", "--target", replica.service, "--port", str(replica.port)]
    cmd += ["--workers", "1"]
    with open(logs / f"{replica.name}.log", "ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(env), cwd=stack.REPO_ROOT, start_new_session=True
        )
    pid_file.write_text(str(proc.pid))


def start_ingress(split: SplitShape) -> None:
    if stack._read_pid(split.nginx_pid_file):
        return
    temp = split.run_dir / "nginx-temp"
    (split.run_dir / "logs").mkdir(parents=True, exist_ok=True)
    temp.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(temp, "nobody", "nogroup")
    conf = split.run_dir / "ingress.conf"
    conf.write_text(render_ingress(split))
    check = subprocess.run(_nginx_cmd(split, conf, "-t", "-q"), capture_output=True, text=True)
    if check.returncode != 0:
        raise SystemExit(f"nginx refuses {conf}: {check.stderr.strip()}")
    proc = subprocess.Popen(
        _nginx_cmd(split, conf, foreground=True),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    split.nginx_pid_file.write_text(str(proc.pid))


def _alive(pid_file: Path) -> bool:
    pid = stack._read_pid(pid_file)
    if pid is None:
        return False
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)  # our child: reap it if it exited
    except ChildProcessError:
        return True  # started by an earlier `up`: alive, as _read_pid said


def wait_ready(split: SplitShape, timeout: float = 180) -> None:
    """Every replica answers /readyz 200, and the ingress reaches keys (401 on /api/account)."""
    deadline = time.monotonic() + timeout
    pending = list(split.replicas)
    while pending:
        replica = pending[0]
        if not _alive(split.pid_file(replica)):
            raise SystemExit(f"{replica.name} exited; see {split.run_dir / 'logs' / (replica.name + '.log')}")
        try:
            if httpx.get(f"{replica.base_url}/readyz", timeout=3).status_code == 200:
                pending.pop(0)
                continue
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{replica.name} not ready within {timeout:.0f}s")
        time.sleep(0.3)
    while True:
        try:
            if httpx.get(f"{split.ingress_url}/api/account", timeout=3).status_code == 401:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"the ingress on {split.ingress_url} does not reach keys; see {split.run_dir / 'logs'}")
        time.sleep(0.2)


def start(split: SplitShape, env: Mapping[str, str], timeout: float = 180) -> None:
    """Every replica and the ingress (those not running yet), then wait until all answer."""
    split.run_dir.mkdir(parents=True, exist_ok=True)
    for replica in split.replicas:
        start_replica(split, replica, env)
    start_ingress(split)
    wait_ready(split, timeout)


def stop(run_dir: Path) -> None:
    """The ingress first (no new requests), then every replica (each pid file in `run_dir`) at once."""
    stack.stop_pid_file(run_dir / "nginx.pid", "ingress (nginx)")
    pid_files = sorted(run_dir.glob("*.pid"))
    if pid_files:
        with ThreadPoolExecutor(max_workers=len(pid_files)) as pool:
            for pid_file in pid_files:
                pool.submit(stack.stop_pid_file, pid_file, pid_file.stem)


def process_env(cfg: stack.StackConfig, split: SplitShape, base: Mapping[str, str]) -> dict[str, str]:
    """The replicas' settings: the stack's, the ingress as the one trusted proxy (client IPs from
    X-Forwarded-For), and the console's public URL on the ingress."""
    return {
        **base,
        **cfg.env(),
        "TRUSTED_PROXIES": '["127.0.0.1/32"]',
        "CONSOLE_URL": f"{split.ingress_url}/console",
    }
