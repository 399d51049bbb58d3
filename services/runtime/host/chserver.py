"""A real ClickHouse server from the engine in the `chdb-core` wheel (no server package, no Docker).

Run as `python -m services.runtime.host.chserver INSTANCE_DIR` with its settings in the environment
(see `ServerSpec.to_env`); `services.runtime.host.stack` does that. This process owns the instance
folder (an exclusive flock taken before anything is written), writes config.xml and users.xml
into it, drops to an unprivileged user (keeping CAP_SYS_NICE alone, so the analyst's nice 19
applies), loads the engine module without importing the `chdb` package, and runs one blocking
query whose lifetime keeps the HTTP and native listeners open. It exits 0 when stopped by SIGTERM
and non-zero whenever that query ends by itself (port in use, data directory locked, bad users
file: the engine reports those on stderr, not by raising).
"""

import encodings.idna  # noqa: F401 (the stop request needs it; after the drop to `nobody` the stdlib may be unreadable)
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import pwd
import signal
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from xml.sax.saxutils import escape

from services.runtime.host import capabilities
from services.runtime.host.private_files import write_private

SPEC_ENV = "TOLLGATE_CH_SERVER_SPEC"
RUN_AS = "nobody"
# The query the listeners live in. The marker comes first, as a comment: system.processes keeps
# the text verbatim, so `LIKE '/* marker */%'` finds exactly this query and nothing else.
BLOCKING_QUERY = (
    "SYSTEM START LISTEN HTTP; SYSTEM START LISTEN TCP; /* {marker} */ "
    "SELECT count() FROM system.numbers WHERE sleepEachRow(0.5) != 0 SETTINGS max_block_size = 1"
)
# Settings that take a host path (or URL): constant in every profile, or any user can read or
# overwrite a host file through a format setting.
CONST_SETTINGS = (
    "output_format_schema",
    "format_template_resultset",
    "format_template_row",
    "format_schema",
    "format_schema_source",
    "input_format_record_errors_file_path",
    "format_avro_schema_registry_url",
)
# What the application may do in its databases: listed, never ALL (ALL includes CREATE
# DICTIONARY, and a dictionary with an EXECUTABLE source runs a command as the server's user).
APP_PRIVILEGES = (
    "SHOW, SELECT, INSERT, ALTER, CREATE DATABASE, CREATE TABLE, CREATE VIEW, DROP DATABASE, "
    "DROP TABLE, DROP VIEW, TRUNCATE, OPTIMIZE"
)
# Table engines by name: `TABLE ENGINE ON *` would admit File(...) and URL(...).
APP_TABLE_ENGINES = ("MergeTree", "ReplacingMergeTree", "SummingMergeTree", "AggregatingMergeTree", "Memory")
# The folder under the data path BACKUP and RESTORE use (`tollgate backup`/`restore` move files in and out).
BACKUPS_DIR = "backups"


@dataclass(frozen=True)
class ServerSpec:
    """Everything the server process needs; only password hashes except `ctl_password`, which
    this process itself uses to stop its blocking query."""

    http_port: int
    tcp_port: int
    marker: str
    ctl_password: str
    tollgate_sha256: str
    analyst_sha256: str
    database: str = "tollgate"
    # Name patterns (`t_*`) the application may also create and use: per-test databases.
    extra_database_patterns: tuple[str, ...] = ()
    # More table engines for `tollgate` (bench/metering.py compares with the Kafka engine).
    extra_table_engines: tuple[str, ...] = ()
    analyst_max_execution_time_s: int = 30
    analyst_max_memory_bytes: int = 2_000_000_000
    analyst_max_concurrent_queries: int = 4

    def to_env(self) -> dict[str, str]:
        return {SPEC_ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls) -> "ServerSpec":
        raw = json.loads(os.environ[SPEC_ENV])
        raw["extra_database_patterns"] = tuple(raw.get("extra_database_patterns", ()))
        raw["extra_table_engines"] = tuple(raw.get("extra_table_engines", ()))
        return cls(**raw)


def sha256_hex(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def config_xml(spec: ServerSpec) -> str:
    return f"""<clickhouse>
    <listen_host>127.0.0.1</listen_host>
    <http_port>{spec.http_port}</http_port>
    <tcp_port>{spec.tcp_port}</tcp_port>
    <users_config>users.xml</users_config>
    <!-- `tollgate backup`/`restore` (services/runtime/host/backup.py): BACKUP ... TO File('NAME')
         reads and writes NAME in this folder, relative to the data path, and nowhere else. -->
    <backups><allowed_path>{BACKUPS_DIR}/</allowed_path></backups>
</clickhouse>
"""


def _profile(extra: str = "") -> str:
    consts = "".join(f"<{name}><const/></{name}>" for name in CONST_SETTINGS)
    return f"{extra}<constraints>{consts}</constraints>"


def users_xml(spec: ServerSpec) -> str:
    app_grants = f"<query>GRANT {APP_PRIVILEGES} ON {escape(spec.database)}.*</query>"
    # Tests also stop merges in their own databases, to look at rows before a merge dedupes them.
    app_grants += "".join(
        f"<query>GRANT {APP_PRIVILEGES}, SYSTEM MERGES ON {escape(p)}.*</query>" for p in spec.extra_database_patterns
    )
    engines = (*APP_TABLE_ENGINES, *spec.extra_table_engines)
    app_grants += "".join(f"<query>GRANT TABLE ENGINE ON {escape(engine)}</query>" for engine in engines)
    analyst_limits = (
        "<readonly>1</readonly>"
        f"<max_execution_time>{spec.analyst_max_execution_time_s}</max_execution_time>"
        f"<max_memory_usage>{spec.analyst_max_memory_bytes}</max_memory_usage>"
        # Per query alone, N analyst queries at once (a dashboard's panels, a script's loop) could
        # hold N times the memory and take the server's from Tollgate's own: the user's total is
        # capped too, and how many run at once (the rest are refused, TOO_MANY_SIMULTANEOUS_QUERIES).
        f"<max_memory_usage_for_user>{spec.analyst_max_memory_bytes}</max_memory_usage_for_user>"
        f"<max_concurrent_queries_for_user>{spec.analyst_max_concurrent_queries}</max_concurrent_queries_for_user>"
        "<max_threads>1</max_threads>"
        # Tollgate's own queries come first: the analyst's threads run at the lowest CPU priority
        # (nice 19), and the engine pauses them while higher-priority (lower value) queries run.
        "<os_thread_priority>19</os_thread_priority>"
        "<priority>10</priority>"
    )
    # `tollgate backup`/`restore` (run by the launcher, which alone knows this password): BACKUP of
    # the database, and RESTORE into it while a replaced copy waits under `<db>_replaced_*`.
    # The File backup engine needs READ/WRITE ON FILE; config.xml confines it to BACKUPS_DIR.
    ctl_backup_grants = (
        "<query>GRANT READ, WRITE ON FILE</query>"
        + "".join(
            f"<query>GRANT BACKUP, SHOW, SELECT, INSERT, CREATE DATABASE, CREATE TABLE, CREATE VIEW, "
            f"DROP DATABASE, DROP TABLE, DROP VIEW ON {escape(db)}.*</query>"
            for db in (spec.database, f"{spec.database}_replaced_*")
        )
        + "".join(f"<query>GRANT TABLE ENGINE ON {escape(engine)}</query>" for engine in engines)
    )
    return f"""<clickhouse>
    <profiles>
        <default>{_profile()}</default>
        <analyst>{_profile(analyst_limits)}</analyst>
    </profiles>
    <users>
        <!-- The engine's own internal session logs in as `default`: passwordless, present,
             and allowed only what starting the listeners needs. -->
        <default>
            <password></password>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
            <grants>
                <query>GRANT SYSTEM LISTEN ON *.*</query>
                <query>GRANT SELECT ON system.numbers</query>
            </grants>
        </default>
        <ctl>
            <password_sha256_hex>{sha256_hex(spec.ctl_password)}</password_sha256_hex>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
            <grants>
                <query>GRANT SELECT ON system.processes</query>
                <query>GRANT KILL QUERY ON *.*</query>
                {ctl_backup_grants}
            </grants>
        </ctl>
        <tollgate>
            <password_sha256_hex>{spec.tollgate_sha256}</password_sha256_hex>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
            <grants>{app_grants}</grants>
        </tollgate>
        <analyst>
            <password_sha256_hex>{spec.analyst_sha256}</password_sha256_hex>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>analyst</profile>
            <quota>default</quota>
            <!-- Listed grants, not <allow_databases>: that grants nearly everything on the
                 database (SYSTEM MERGES among it, which readonly=1 does not stop) plus host-reaching
                 sources, leaving readonly as the only guard. -->
            <grants><query>GRANT SHOW TABLES, SHOW COLUMNS, SELECT ON {escape(spec.database)}.*</query></grants>
        </analyst>
    </users>
    <quotas><default></default></quotas>
</clickhouse>
"""


def _lock(instance: Path) -> int:
    """An exclusive flock on the instance folder, held for this process's life; exits if taken."""
    fd = os.open(instance, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"clickhouse: {instance} is in use by another server process")
    return fd


def _own(instance: Path, uid: int, gid: int) -> None:
    for root, dirs, files in os.walk(instance):
        for name in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
            st = os.lstat(name)
            if (st.st_uid, st.st_gid) != (uid, gid):
                os.lchown(name, uid, gid)


def _load_engine() -> ModuleType:
    """`chdb/_chdb.abi3.so` as the module `chdb._chdb`, without running the `chdb` package's
    __init__ (its in-process session cannot start listeners)."""
    spec = importlib.util.find_spec("chdb")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("clickhouse: the chdb-core wheel is not installed")
    path = os.path.join(next(iter(spec.submodule_search_locations)), "_chdb.abi3.so")
    loader = importlib.machinery.ExtensionFileLoader("chdb._chdb", path)
    module_spec = importlib.util.spec_from_file_location("chdb._chdb", path, loader=loader)
    if module_spec is None:
        sys.exit(f"clickhouse: cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    loader.exec_module(module)
    return module


def _kill_blocking_query(spec: ServerSpec) -> None:
    """Through the server's own HTTP port: an in-process KILL would wait behind the query."""
    sql = f"KILL QUERY WHERE query LIKE '/* {spec.marker} */%' SYNC"
    url = f"http://127.0.0.1:{spec.http_port}/?" + urllib.parse.urlencode({"query": sql})
    request = urllib.request.Request(url, method="POST")
    request.add_header("X-ClickHouse-User", "ctl")
    request.add_header("X-ClickHouse-Key", spec.ctl_password)
    try:
        urllib.request.urlopen(request, timeout=10).read()  # noqa: S310
    except OSError as exc:
        print(f"clickhouse: stop request failed: {exc}", file=sys.stderr, flush=True)


def serve(instance: Path, spec: ServerSpec) -> int:
    instance.mkdir(parents=True, exist_ok=True)
    lock_fd = _lock(instance)  # before writing anything: a live instance's files stay untouched
    for name, text in (("config.xml", config_xml(spec)), ("users.xml", users_xml(spec))):
        write_private(instance / name, text)
    (instance / "data").mkdir(exist_ok=True)
    os.chdir(instance)  # the engine reads ./config.xml
    if os.geteuid() == 0:
        # No grant closes `INSERT ... FROM INFILE`: the process must not be able to read much.
        user = pwd.getpwnam(RUN_AS)
        _own(instance, user.pw_uid, user.pw_gid)
        capabilities.drop_privileges(user.pw_uid, user.pw_gid)
    if not capabilities.effective() >> capabilities.CAP_SYS_NICE & 1:  # e.g. started by a user, or a bare container
        print("clickhouse: no CAP_SYS_NICE: the analyst's nice 19 will not apply", file=sys.stderr, flush=True)
    engine = _load_engine()
    stopping = threading.Event()
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(engine.query(BLOCKING_QUERY.format(marker=spec.marker), "TabSeparated", path=str(instance / "data")))
        except Exception as exc:  # the engine usually reports on stderr and returns
            outcome.append(exc)

    def on_term(_signum: int, _frame: object) -> None:
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=_kill_blocking_query, args=(spec,), daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    worker = threading.Thread(target=run, name="clickhouse-listeners")
    started = time.monotonic()
    worker.start()
    while worker.is_alive():
        worker.join(0.2)
    if stopping.is_set():
        print("clickhouse: stopped", flush=True)
        os.close(lock_fd)
        return 0
    elapsed = time.monotonic() - started
    print(f"clickhouse: the server ended by itself after {elapsed:.1f}s: {outcome!r}", file=sys.stderr, flush=True)
    return 2


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m services.runtime.host.chserver INSTANCE_DIR (settings in $TOLLGATE_CH_SERVER_SPEC)")
    spec = ServerSpec.from_env()
    code = serve(Path(sys.argv[1]).resolve(), spec)
    sys.stdout.flush()
    # The engine's threads do not wind down for a normal interpreter exit.
    os._exit(code)


if __name__ == "__main__":
    main()
