"""The local stack without Docker: Kafka (KRaft, Maven Central jars), Postgres (initdb), a
ClickHouse server (the engine of the chdb-core wheel, services/runtime/host/chserver.py) and redis.

Each part listens on 127.0.0.1, keeps its data under the state directory, is waited for
until it really answers, and is stopped by its PID. `up` is idempotent.
"""

import asyncio
import glob
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from services.runtime.host.chserver import ServerSpec, sha256_hex
from services.runtime.host.private_files import write_private

REPO_ROOT = Path(__file__).resolve().parents[3]
DEPLOY = REPO_ROOT / "deploy" / "local"


@dataclass(frozen=True)
class StackConfig:
    state_dir: Path
    kafka_port: int = 19092
    controller_port: int = 19093
    postgres_port: int = 15432
    database: str = "tollgate"
    clickhouse_http_port: int = 18123
    clickhouse_tcp_port: int = 19000
    redis_port: int = 16379
    # The ClickHouse users' passwords; unset, each is generated once into the state directory.
    clickhouse_password: str | None = None
    clickhouse_analyst_password: str | None = None
    # Database name patterns (`t_*`) the `tollgate` user may also create: per-test databases.
    clickhouse_extra_databases: tuple[str, ...] = ()
    clickhouse_extra_table_engines: tuple[str, ...] = ()  # for benchmarks only (Kafka)
    # 1, or 3 for a cluster (`stack up --kafka-nodes 3`): node i listens on kafka_port + 2(i-1),
    # its controller on controller_port + 2(i-1); topics get replication factor min(3, nodes).
    kafka_nodes: int = 1

    def kafka_node_port(self, node: int) -> int:
        return self.kafka_port + 2 * (node - 1)

    def kafka_controller_port(self, node: int) -> int:
        return self.controller_port + 2 * (node - 1)

    @property
    def kafka_replication_factor(self) -> int:
        return min(3, self.kafka_nodes)

    @property
    def kafka_min_insync_replicas(self) -> int:
        # a majority of the replicas: with RF 3, an acked write survives the loss of any one broker
        return self.kafka_replication_factor // 2 + 1

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.kafka_node_port(i)}" for i in range(1, self.kafka_nodes + 1))

    @property
    def database_url(self) -> str:
        return f"postgresql://tollgate@127.0.0.1:{self.postgres_port}/{self.database}"

    @property
    def clickhouse_dsn(self) -> str:
        """The application's DSN (user `tollgate`, over HTTP like in production)."""
        return f"http://tollgate:{_quote(self.passwords()['tollgate'])}@127.0.0.1:{self.clickhouse_http_port}"

    def analyst_dsns(self) -> dict[str, str]:
        """The read-only analyst's DSNs, for HTTP and for the native protocol."""
        password = _quote(self.passwords()["analyst"])
        return {
            "http": f"http://analyst:{password}@127.0.0.1:{self.clickhouse_http_port}",
            "native": f"clickhouse://analyst:{password}@127.0.0.1:{self.clickhouse_tcp_port}/{self.database}",
        }

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def passwords(self) -> dict[str, str]:
        """The `tollgate` and `analyst` passwords: the configured ones, else generated once and
        kept in the state directory (readable by its owner only)."""
        path = self.state_dir / "clickhouse-passwords.json"
        try:
            stored: dict[str, str] = json.loads(path.read_text())
        except FileNotFoundError:
            stored = {"tollgate": secrets.token_urlsafe(18), "analyst": secrets.token_urlsafe(18)}
            self.state_dir.mkdir(parents=True, exist_ok=True)
            write_private(path, json.dumps(stored))
        return {
            "tollgate": self.clickhouse_password or stored["tollgate"],
            "analyst": self.clickhouse_analyst_password or stored["analyst"],
        }

    def env(self) -> dict[str, str]:
        """The settings (environment variables) that point Tollgate at this stack."""
        return {
            "KAFKA_BOOTSTRAP_SERVERS": self.kafka_bootstrap,
            "KAFKA_REPLICATION_FACTOR": str(self.kafka_replication_factor),
            "DATABASE_URL": self.database_url,
            "CLICKHOUSE_DSN": self.clickhouse_dsn,
            "CLICKHOUSE_DATABASE": self.database,
            "REDIS_URL": self.redis_url,
        }


def _quote(password: str) -> str:
    return urllib.parse.quote(password, safe="")


def _log(message: str) -> None:
    print(f"[stack] {message}", flush=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed child nobody reaped yet is a zombie: gone, though its pid still answers
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None
    return pid if _pid_alive(pid) else None


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _refuse_taken(part: str, *ports: int, grace_s: float = 5.0) -> None:
    """A part about to start finds its ports free, or the start stops here with why. Another
    process on one (another checkout's stack, or one a killed test run left behind) would
    otherwise make the start fail obscurely, or answer in this stack's place with other
    passwords and other data. The grace covers this part's own processes still dying after a
    kill (a process group goes one process at a time)."""
    deadline = time.monotonic() + grace_s
    while (taken := [str(port) for port in ports if _port_open(port)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    if taken:
        raise SystemExit(
            f"{part}: port {', '.join(taken)} on 127.0.0.1 is already in use by a process this stack did not start "
            "(another checkout's Tollgate stack, or one a killed run left behind?); stop it "
            "(`tollgate stack down` in its checkout; `ss -ltnp` names it) or give this stack other ports"
        )


def _as_postgres_user(cmd: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _postgres_bin(name: str) -> str:
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    found = candidates[0] if candidates else shutil.which(name)
    if not found:
        raise SystemExit(f"PostgreSQL server binaries not found ({name}): install postgresql (apt-get install postgresql)")
    return found


# ---- Kafka ---------------------------------------------------------------------------------
def kafka_libs() -> Path:
    """The broker's jars, fetched once from Maven Central into a cache keyed by the pom."""
    pom = DEPLOY / "pom.xml"
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    libs = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tollgate" / f"kafka-{digest}"
    if (libs / ".complete").exists():
        return libs
    _log(f"fetching the Kafka broker from Maven Central into {libs}")
    libs.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "mvn",
            "-B",
            "-q",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={libs}",
            "-DincludeScope=runtime",
        ],
        check=True,
    )
    (libs / ".complete").touch()
    return libs


def _java_cmd(libs: Path, main: str, *args: str, heap: str = "512m") -> list[str]:
    return [
        "java",
        f"-Xmx{heap}",
        f"-Xms{min(256, int(heap.rstrip('m')))}m",
        "-XX:+UseG1GC",
        f"-Dlog4j2.configurationFile={DEPLOY / 'log4j2.yaml'}",
        "-cp",
        f"{libs}/*",
        main,
        *args,
    ]


def _kafka_run(cfg: StackConfig, node: int) -> Path:
    # Node 1 keeps the one-node stack's folder, so a one-node state directory stays as it was.
    return cfg.state_dir / ("kafka" if node == 1 else f"kafka-{node}")


def kafka_pid_file(cfg: StackConfig, node: int = 1) -> Path:
    return _kafka_run(cfg, node) / "kafka.pid"


def _kafka_layout(cfg: StackConfig) -> str:
    """The cluster id all nodes are formatted with; refuses a node count the data was not made for."""
    layout_file = _kafka_run(cfg, 1) / "cluster.json"
    try:
        layout = json.loads(layout_file.read_text())
    except FileNotFoundError:
        # formatted before the cluster file existed: a one-node stack
        formatted = (_kafka_run(cfg, 1) / "data" / "meta.properties").exists()
        layout = {"nodes": 1 if formatted else cfg.kafka_nodes, "cluster_id": str(uuid.uuid4())}
        layout_file.parent.mkdir(parents=True, exist_ok=True)
        layout_file.write_text(json.dumps(layout))
    if layout["nodes"] != cfg.kafka_nodes:
        raise SystemExit(
            f"the Kafka data in {cfg.state_dir} is for {layout['nodes']} node(s), not {cfg.kafka_nodes}: "
            f"`tollgate stack down`, remove {cfg.state_dir}/kafka*, and start again"
        )
    return str(layout["cluster_id"])


def recorded_kafka_nodes(state_dir: Path) -> int | None:
    """How many Kafka nodes the stack in `state_dir` was made with (None: no Kafka yet)."""
    try:
        return int(json.loads((state_dir / "kafka" / "cluster.json").read_text())["nodes"])
    except (FileNotFoundError, ValueError, KeyError):
        return 1 if (state_dir / "kafka" / "data" / "meta.properties").exists() else None


def kafka_up(cfg: StackConfig, node: int | None = None) -> None:
    """Start every node of the cluster that is not running (or only `node`), then wait for them."""
    cluster_id = _kafka_layout(cfg)
    voters = ",".join(f"{i}@127.0.0.1:{cfg.kafka_controller_port(i)}" for i in range(1, cfg.kafka_nodes + 1))
    # Each node runs in its own JVM; three 1 GB heaps would be a lot for a laptop.
    heap = "1024m" if cfg.kafka_nodes == 1 else "512m"
    started: list[tuple[int, subprocess.Popen[bytes]]] = []
    for i in [node] if node is not None else range(1, cfg.kafka_nodes + 1):
        run = _kafka_run(cfg, i)
        if _read_pid(run / "kafka.pid"):
            _log(f"kafka node {i} already running on 127.0.0.1:{cfg.kafka_node_port(i)}")
            continue
        _refuse_taken(f"kafka node {i}", cfg.kafka_node_port(i), cfg.kafka_controller_port(i))
        libs = kafka_libs()
        run.mkdir(parents=True, exist_ok=True)
        data = run / "data"
        props = run / "server.properties"
        props.write_text(
            (DEPLOY / "kafka-server.properties")
            .read_text()
            .format(
                node_id=i,
                voters=voters,
                port=cfg.kafka_node_port(i),
                controller_port=cfg.kafka_controller_port(i),
                log_dir=data,
                replication=cfg.kafka_replication_factor,
                min_isr=cfg.kafka_min_insync_replicas,
            )
        )
        if not (data / "meta.properties").exists():
            subprocess.run(
                _java_cmd(libs, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props), heap="256m"),
                check=True,
                stdout=subprocess.DEVNULL,
            )
        with open(run / "kafka.log", "ab") as log:
            proc = subprocess.Popen(
                _java_cmd(libs, "kafka.Kafka", str(props), heap=heap),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (run / "kafka.pid").write_text(str(proc.pid))
        started.append((i, proc))
    # A node of a cluster answers only once a quorum of controllers is up: wait after starting all.
    for i, proc in started:
        _wait_kafka(cfg, i, proc)
        _log(f"kafka node {i} ready on 127.0.0.1:{cfg.kafka_node_port(i)}")


def kafka_down(cfg: StackConfig) -> None:
    # In parallel: a node stopping alone waits for a controller quorum the others would leave.
    with ThreadPoolExecutor(max_workers=cfg.kafka_nodes) as pool:
        for i in range(1, cfg.kafka_nodes + 1):
            pool.submit(stop_pid_file, kafka_pid_file(cfg, i), "kafka" if cfg.kafka_nodes == 1 else f"kafka node {i}")


def _wait_kafka(cfg: StackConfig, node: int, proc: subprocess.Popen[bytes], timeout: float = 90) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    port = cfg.kafka_node_port(node)

    async def answers() -> bool:
        admin = AIOKafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=3000)
        try:
            await admin.start()
            await admin.list_topics()
            return True
        except Exception:
            return False
        finally:
            await admin.close()

    deadline = time.monotonic() + timeout
    # The probe gets a thread and loop of its own: `up` may be called from inside a running loop.
    with ThreadPoolExecutor(max_workers=1) as probe:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"kafka exited with {proc.returncode}; see {_kafka_run(cfg, node) / 'kafka.log'}")
            if _port_open(port) and probe.submit(asyncio.run, answers()).result():
                return
            time.sleep(0.3)
    raise SystemExit(f"kafka node {node} did not answer within {timeout:.0f}s")


# ---- Postgres ------------------------------------------------------------------------------
def postgres_up(cfg: StackConfig) -> None:
    run = (cfg.state_dir / "postgres").resolve()
    data = run / "data"
    if _read_pid(data / "postmaster.pid"):
        _log(f"postgres already running on port {cfg.postgres_port}")
        return
    _refuse_taken("postgres", cfg.postgres_port)
    run.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(run, "postgres", "postgres")
    if not (data / "PG_VERSION").exists():
        subprocess.run(
            _as_postgres_user(
                [_postgres_bin("initdb"), "-D", str(data), "-U", "tollgate", "-A", "trust", "-E", "UTF8", "--no-sync"]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
    options = (
        f"-c listen_addresses=127.0.0.1 -p {cfg.postgres_port} -c unix_socket_directories={run} "
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
    )
    subprocess.run(
        _as_postgres_user(
            [_postgres_bin("pg_ctl"), "-D", str(data), "-l", str(run / "postgres.log"), "-o", options, "-w", "-t", "60", "start"]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    _ensure_database(cfg)
    _log(f"postgres ready on port {cfg.postgres_port}")


def _ensure_database(cfg: StackConfig) -> None:
    import psycopg

    admin_url = cfg.database_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (cfg.database,)).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{cfg.database}"')


def postgres_down(cfg: StackConfig) -> None:
    data = (cfg.state_dir / "postgres" / "data").resolve()
    pid = _read_pid(data / "postmaster.pid")
    if pid is not None:
        subprocess.run(
            _as_postgres_user([_postgres_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
            check=False,
            stdout=subprocess.DEVNULL,
        )
        _wait_gone(pid, 15)  # pg_ctl returns when the pid file goes, a moment before the process
        _log("postgres stopped")


# ---- ClickHouse -----------------------------------------------------------------------------
def _clickhouse_files(cfg: StackConfig) -> tuple[Path, Path, Path, Path]:
    """The instance folder (owned by the server process), its pidfile, its control file (marker
    and `ctl` password of the running server) and its log."""
    state = cfg.state_dir.resolve()
    return state / "clickhouse", state / "clickhouse.pid", state / "clickhouse.ctl.json", state / "logs" / "clickhouse.log"


def clickhouse_up(cfg: StackConfig, timeout: float = 60) -> None:
    instance, pid_file, ctl_file, log_path = _clickhouse_files(cfg)
    if _read_pid(pid_file):
        _log(f"clickhouse already running on http://127.0.0.1:{cfg.clickhouse_http_port}")
        return
    _refuse_taken("clickhouse", cfg.clickhouse_http_port, cfg.clickhouse_tcp_port)
    passwords = cfg.passwords()
    spec = ServerSpec(
        http_port=cfg.clickhouse_http_port,
        tcp_port=cfg.clickhouse_tcp_port,
        marker=f"tollgate-clickhouse-{uuid.uuid4().hex}",
        ctl_password=secrets.token_urlsafe(18),
        tollgate_sha256=sha256_hex(passwords["tollgate"]),
        analyst_sha256=sha256_hex(passwords["analyst"]),
        database=cfg.database,
        extra_database_patterns=cfg.clickhouse_extra_databases,
        extra_table_engines=cfg.clickhouse_extra_table_engines,
    )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    write_private(ctl_file, json.dumps({"marker": spec.marker, "ctl_password": spec.ctl_password, "http_port": spec.http_port}))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.runtime.host.chserver", str(instance)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **spec.to_env()},
            cwd=REPO_ROOT,
            start_new_session=True,
        )
    pid_file.write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    while not _clickhouse_answers(ctl_file):
        if proc.poll() is not None:
            pid_file.unlink(missing_ok=True)
            raise SystemExit(f"clickhouse exited with {proc.returncode}; see {log_path}")
        if time.monotonic() > deadline:
            stop_pid_file(pid_file, "clickhouse")
            raise SystemExit(f"clickhouse did not answer within {timeout:.0f}s; see {log_path}")
        time.sleep(0.1)
    _log(f"clickhouse ready on http://127.0.0.1:{cfg.clickhouse_http_port} and native port {cfg.clickhouse_tcp_port}")


def _clickhouse_answers(ctl_file: Path) -> bool:
    """Our own server answers: its listeners' query is running. `/ping` alone is not enough,
    since any other server on the port answers it too."""
    try:
        ctl = json.loads(ctl_file.read_text())
        response = httpx.post(
            f"http://127.0.0.1:{ctl['http_port']}/",
            content=f"SELECT count() FROM system.processes WHERE query LIKE '/* {ctl['marker']} */%'",
            headers={"X-ClickHouse-User": "ctl", "X-ClickHouse-Key": ctl["ctl_password"]},
            timeout=2,
        )
    except (OSError, ValueError, KeyError, httpx.HTTPError):
        return False
    return response.status_code == 200 and response.text.strip() == "1"


def clickhouse_down(cfg: StackConfig) -> None:
    # The server stops its listeners' query on SIGTERM and exits within a few seconds.
    stop_pid_file(_clickhouse_files(cfg)[1], "clickhouse")


# ---- redis ---------------------------------------------------------------------------------
def _as_nobody(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", *cmd]


def redis_up(cfg: StackConfig, timeout: float = 30) -> None:
    state = cfg.state_dir.resolve()
    pid_file, data, log_path = state / "redis.pid", state / "redis", state / "logs" / "redis.log"
    if _read_pid(pid_file):
        _log(f"redis already running at {cfg.redis_url}")
        return
    _refuse_taken("redis", cfg.redis_port)
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: install redis-server (deploy/local/prereqs.sh)")
    data.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(data, "nobody", "nogroup")
    cmd = [binary, "--port", str(cfg.redis_port), "--bind", "127.0.0.1", "--dir", str(data), "--appendonly", "no"]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(_as_nobody(cmd), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    pid_file.write_text(str(proc.pid))
    import redis

    client = redis.Redis(port=cfg.redis_port, socket_timeout=1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if client.ping():
                break
        except redis.RedisError:
            pass
        if proc.poll() is not None:
            pid_file.unlink(missing_ok=True)
            raise SystemExit(f"redis exited with {proc.returncode}; see {log_path}")
        if time.monotonic() > deadline:
            stop_pid_file(pid_file, "redis")
            raise SystemExit(f"redis did not answer within {timeout:.0f}s; see {log_path}")
        time.sleep(0.05)
    client.close()
    _log(f"redis ready at {cfg.redis_url}")


def redis_down(cfg: StackConfig) -> None:
    stop_pid_file(cfg.state_dir.resolve() / "redis.pid", "redis")


# ---- the whole stack -----------------------------------------------------------------------
def stop_pid_file(pid_file: Path, name: str, timeout: float = 30) -> None:
    """SIGTERM the process group, SIGKILL it if it lingers; return only once it is gone."""
    pid = _read_pid(pid_file)
    if pid is None:
        return
    os.killpg(pid, signal.SIGTERM)
    if not _wait_gone(pid, timeout):
        os.killpg(pid, signal.SIGKILL)
        _wait_gone(pid, 10)
    pid_file.unlink(missing_ok=True)
    _log(f"{name} stopped")


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our child, or it lingers as a zombie
        except ChildProcessError:
            pass
        if not _pid_alive(pid):
            return True
        time.sleep(0.05)
    return not _pid_alive(pid)


def up(cfg: StackConfig) -> None:
    """Start the four side by side (none needs another to start): Kafka's JVM takes most of the
    wait, and the others start within it. Every one is waited for; the first failure is raised."""
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=4) as pool:
        starts = [pool.submit(start, cfg) for start in (postgres_up, kafka_up, clickhouse_up, redis_up)]
    for started in starts:
        started.result()


def down(cfg: StackConfig) -> None:
    redis_down(cfg)
    clickhouse_down(cfg)
    kafka_down(cfg)
    postgres_down(cfg)


def status(cfg: StackConfig) -> dict[str, str]:
    kafka = {i: _read_pid(kafka_pid_file(cfg, i)) for i in range(1, cfg.kafka_nodes + 1)}
    pg = _read_pid((cfg.state_dir / "postgres" / "data" / "postmaster.pid").resolve())
    _, ch_pid_file, ctl_file, _ = _clickhouse_files(cfg)
    ch = _read_pid(ch_pid_file)
    ch_state = "stopped"
    if ch:
        answers = "" if _clickhouse_answers(ctl_file) else ", NOT answering"
        ch_state = f"running (pid {ch}{answers}) on http://127.0.0.1:{cfg.clickhouse_http_port}, native {cfg.clickhouse_tcp_port}"
    rd = _read_pid(cfg.state_dir.resolve() / "redis.pid")
    kafka_states = {
        ("kafka" if cfg.kafka_nodes == 1 else f"kafka {i}"): f"running (pid {pid}) on 127.0.0.1:{cfg.kafka_node_port(i)}"
        if pid
        else "stopped"
        for i, pid in kafka.items()
    }
    return {
        **kafka_states,
        "postgres": f"running (pid {pg}) at {cfg.database_url}" if pg else "stopped",
        "clickhouse": ch_state,
        "redis": f"running (pid {rd}) at {cfg.redis_url}" if rd else "stopped",
    }
