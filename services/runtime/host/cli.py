"""The `tollgate` command: serve targets, run the local stack, bring everything up or down."""

import asyncio
import ipaddress
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn
from uuid import UUID

import httpx
import typer

from services.runtime.host import stack
from services.runtime.host.private_files import write_private

if TYPE_CHECKING:
    import socket

    from fastapi import FastAPI

    from services.runtime.platform.settings import Settings

app = typer.Typer(help="Tollgate: API keys, usage metering, quotas and usage alerts.", no_args_is_help=True)
stack_app = typer.Typer(help="The local stack (Kafka, Postgres, ClickHouse, redis) without Docker.", no_args_is_help=True)
app.add_typer(stack_app, name="stack")
service_token_app = typer.Typer(
    help="Tokens of the platform's own services (st-...): the only credential that writes usage.", no_args_is_help=True
)
app.add_typer(service_token_app, name="service-token")

STATE_DIR = Path(os.environ.get("TOLLGATE_STATE_DIR", ".tollgate"))
KEEP_ALIVE_S = 75
DEMO_EMAIL = "demo@tollgate.local"
DEMO_PASSWORD = "demo-password-123"
DEMO_SERVICE_TOKEN_NAME = "demo platform service"


def _config(kafka_nodes: int | None = None) -> stack.StackConfig:
    """The local stack: ports from TOLLGATE_* variables; Kafka nodes from the option, else
    TOLLGATE_KAFKA_NODES, else what the state directory's Kafka was made with, else 1."""
    env = os.environ.get
    nodes = kafka_nodes or int(env("TOLLGATE_KAFKA_NODES", "0")) or stack.recorded_kafka_nodes(STATE_DIR) or 1
    return stack.StackConfig(
        state_dir=STATE_DIR,
        kafka_nodes=nodes,
        kafka_port=int(env("TOLLGATE_KAFKA_PORT", "19092")),
        controller_port=int(env("TOLLGATE_KAFKA_CONTROLLER_PORT", "19093")),
        postgres_port=int(env("TOLLGATE_POSTGRES_PORT", "15432")),
        clickhouse_http_port=int(env("TOLLGATE_CLICKHOUSE_HTTP_PORT", "18123")),
        clickhouse_tcp_port=int(env("TOLLGATE_CLICKHOUSE_TCP_PORT", "19000")),
        redis_port=int(env("TOLLGATE_REDIS_PORT", "16379")),
        clickhouse_password=env("TOLLGATE_CLICKHOUSE_PASSWORD") or None,
        clickhouse_analyst_password=env("TOLLGATE_CLICKHOUSE_ANALYST_PASSWORD") or None,
    )


@app.command()
def serve(
    target: Annotated[str, typer.Option(help="all, or a comma-separated list of services")] = "all",
    host: str = "127.0.0.1",
    port: int = 8080,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="processes serving the port, each a replica of the targets' routes and projections, plus "
            "one process of their consumers at a lower CPU priority; 1: everything in this one process. "
            "Default: the number of cores",
        ),
    ] = os.cpu_count() or 1,
) -> None:
    """Run the named services' routes and consumers in this process (or in `--workers` processes
    and one of consumers). Refused against the local stack while a restore's reconcile of Kafka
    has not succeeded (docs/backup.md), and off loopback with a public SESSION_SECRET."""
    from services.runtime.host import restore_marker
    from services.runtime.platform.settings import PUBLIC_SESSION_SECRETS, get_settings

    if not _is_loopback(host) and get_settings().session_secret.get_secret_value() in PUBLIC_SESSION_SECRETS:
        typer.echo(
            f"serve: SESSION_SECRET is a public value (the default) and --host {host} is reachable from other "
            "machines: anyone could sign a console session of any account. Set SESSION_SECRET to a secret of "
            "your own (the same on every replica), or serve on 127.0.0.1.",
            err=True,
        )
        raise typer.Exit(1)
    cfg = _config()
    if restore_marker.pending(cfg) and restore_marker.runs_against(cfg, get_settings()):
        _refuse_unreconciled("serve", cfg)
    if workers == 1:
        _run(worker_app(target), host=host, port=port)
        return
    from services.runtime.host.workers import supervise
    from services.runtime.platform.logs import configure

    configure(get_settings().log_level)  # the supervisor's own lines: a worker ended, another started
    with tempfile.TemporaryDirectory(prefix="tollgate-metrics-") as metrics_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # /metrics adds up every process's counters
        code = supervise([(serve_worker, (target, host, port))] * workers + [(serve_consumers, (target,))])
    raise typer.Exit(code)


def _is_loopback(host: str) -> bool:
    """Whether only this machine reaches a server bound to `host`."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def _refuse_unreconciled(command: str, cfg: stack.StackConfig) -> NoReturn:
    """Exit 1 with the way out: its edges would rebuild, from the unreconciled topics, credentials
    the restore ended (services/runtime/host/restore_marker.py)."""
    from services.runtime.host import restore_marker

    typer.echo(f"{command}: {restore_marker.refusal(cfg)}", err=True)
    raise typer.Exit(1)


def serve_worker(target: str, host: str, port: int) -> None:
    """One of `serve --workers N`'s request processes (spawned): the app without its consumers, on
    a socket of its own."""
    from services.runtime.host.workers import reuse_port_socket

    _run(worker_app(target, consumers=False), sockets=[reuse_port_socket(host, port)])


def serve_consumers(target: str) -> None:
    """`serve --workers N`'s consumers process (spawned): the app's lifespan, with its consumers,
    and no socket, niced so that the request processes come first."""
    from services.runtime.host.workers import CONSUMERS_NICENESS, run_lifespan

    os.nice(CONSUMERS_NICENESS)
    asyncio.run(run_lifespan(worker_app(target)))


def _run(app: "FastAPI", sockets: list["socket.socket"] | None = None, **bind: Any) -> None:
    """The app served until it is asked to stop; exit STARTUP_FAILURE if it never started (as uvicorn.run)."""
    import uvicorn

    from services.runtime.host.server import Server
    from services.runtime.host.workers import STARTUP_FAILURE

    server = Server(uvicorn.Config(app, **bind, **_uvicorn_options()))
    server.run(sockets=sockets)
    if not server.started:
        sys.exit(STARTUP_FAILURE)


def worker_app(target: str, *, consumers: bool = True) -> "FastAPI":
    from services.runtime.host.app import create_app
    from services.runtime.platform.logs import configure
    from services.runtime.platform.settings import get_settings

    configure(get_settings().log_level)
    return create_app([target], consumers=consumers)


def _uvicorn_options() -> dict[str, Any]:
    from services.runtime.host.http_limits import BoundedHttpToolsProtocol

    return {
        "log_config": None,
        "access_log": False,
        # uvicorn's httptools protocol, but with bounded request heads (414/431).
        "http": BoundedHttpToolsProtocol,
        # Longer than the idle timeout of ingresses and client pools in front of us, so that they,
        # not we, close idle connections (else a request can race the close and fail).
        "timeout_keep_alive": KEEP_ALIVE_S,
    }


KafkaNodes = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=3,
        help="Kafka nodes: 1, or 3 for a KRaft cluster with replication factor 3 and min.insync.replicas 2 "
        "(default: TOLLGATE_KAFKA_NODES, else what the stack was made with, else 1)",
    ),
]


@stack_app.command("up")
def stack_up(kafka_nodes: KafkaNodes = None) -> None:
    """Start Kafka, Postgres, the ClickHouse server and redis (idempotent)."""
    stack.up(_config(kafka_nodes))


@stack_app.command("down")
def stack_down() -> None:
    stack.down(_config())


@stack_app.command("status")
def stack_status() -> None:
    """Each part of the stack; then Tollgate and what `tollgate up` printed (URLs, demo login, demo
    service token, the analyst's DSNs), so they can be found again."""
    cfg = _config()
    for part, state in stack.status(cfg).items():
        typer.echo(f"{part:11} {state}")
    for interface, dsn in cfg.analyst_dsns().items():
        typer.echo(f"analyst DSN ({interface}): {dsn}")
    typer.echo(f"clickhouse play: http://127.0.0.1:{cfg.clickhouse_http_port}/play")
    shown = _what_up_printed()
    if shown is None:
        typer.echo(f"{'tollgate':11} not started (tollgate up)")
        return
    base_url = str(shown["base_url"])
    state = "ready" if _is_ready(base_url) else "NOT answering /readyz"
    typer.echo(f"{'tollgate':11} {state} at {base_url}; as `tollgate up` printed it:")
    typer.echo(json.dumps(shown, indent=2))


def _up_file() -> Path:
    """What `tollgate up` printed (mode 0600: it holds the demo service token), for `stack status`."""
    return STATE_DIR / "up.json"


def _remember_what_up_printed(shown: dict[str, object]) -> None:
    path = _up_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps(shown, indent=2))


def _what_up_printed() -> dict[str, object] | None:
    try:
        shown: dict[str, object] = json.loads(_up_file().read_text())
    except (OSError, ValueError):
        return None
    return shown


def _is_ready(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/readyz", timeout=3).status_code == 200
    except httpx.HTTPError:
        return False


def _wait_ready(base_url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{base_url}/readyz", timeout=3)
            if response.status_code == 200:
                return
            last = response.text
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(0.5)
    raise SystemExit(f"Tollgate did not become ready at {base_url}: {last}")


def _ensure_demo_account(base_url: str) -> None:
    body = {"email": DEMO_EMAIL, "password": DEMO_PASSWORD, "name": "Demo", "user_type": "individual"}
    response = httpx.post(f"{base_url}/api/auth/register", json=body, timeout=10)
    if response.status_code not in (201, 409):
        typer.echo(f"warning: demo account not created ({response.status_code}): {response.text}", err=True)


def _seed_demo_data(base_url: str, service_token: str) -> dict[str, int | bool] | None:
    """Seven days of usage and the rest for the demo account (services/runtime/host/demo_data.py);
    a warning, not a failed `up`, if the platform refuses some of it."""
    from services.runtime.host import demo_data

    async def run() -> demo_data.Report:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            return await demo_data.seed(http, email=DEMO_EMAIL, password=DEMO_PASSWORD, service_token=service_token)

    try:
        return asyncio.run(run()).as_dict()
    except (demo_data.DemoDataError, httpx.HTTPError) as exc:
        typer.echo(f"warning: demo data not (fully) seeded: {exc}", err=True)
        return None


@service_token_app.command("create")
def service_token_create(
    name: str,
    scope: Annotated[list[str] | None, typer.Option(help="repeatable; default usage:write")] = None,
) -> None:
    """Create a token; prints {"id", "token"} (the token only now: only its hash is stored)."""
    from contracts.common import ServiceScope
    from services.keys import operator_cli
    from services.runtime.platform.settings import get_settings

    try:
        scopes = [ServiceScope(s) for s in scope or [ServiceScope.USAGE_WRITE.value]]
    except ValueError as exc:
        raise typer.BadParameter(f"choose from {', '.join(s.value for s in ServiceScope)}", param_hint="--scope") from exc
    if not name.strip() or len(name.strip()) > 200:
        raise typer.BadParameter("1..200 characters", param_hint="NAME")
    typer.echo(json.dumps(asyncio.run(operator_cli.create(get_settings(), name.strip(), scopes))))


@service_token_app.command("list")
def service_token_list() -> None:
    """Every service token (revoked ones too) as {"items": [...]}; never a token itself."""
    from services.keys import operator_cli
    from services.runtime.platform.settings import get_settings

    typer.echo(json.dumps({"items": asyncio.run(operator_cli.list_all(get_settings()))}, indent=2))


@service_token_app.command("revoke")
def service_token_revoke(token_id: UUID) -> None:
    """Revoke for good; returns once the revocation is in Kafka (refused everywhere at once)."""
    from services.keys import operator_cli
    from services.runtime.platform.settings import get_settings

    try:
        asyncio.run(operator_cli.revoke(get_settings(), token_id))
    except operator_cli.UnknownToken:
        typer.echo(f"no service token {token_id}", err=True)
        raise typer.Exit(1) from None
    typer.echo(json.dumps({"id": str(token_id), "revoked": True}))


@app.command()
def republish(
    topic: Annotated[list[str] | None, typer.Option(help="repeatable (e.g. keys.v1); default: every state topic")] = None,
) -> None:
    """Re-emit the current state of the compacted topics from their owners' Postgres (Kafka lost
    them: a wiped disk, a rebuilt cluster, a deleted topic); prints how many states per topic.
    Harmless while the services run: every state keeps its version."""
    from services.runtime.host import republish as owners
    from services.runtime.platform.settings import get_settings

    unknown = owners.unknown_topics(topic or [])
    if unknown:
        raise typer.BadParameter(f"{', '.join(unknown)}: choose from {', '.join(owners.OWNERS)}", param_hint="--topic")
    settings = get_settings()
    typer.echo(json.dumps(asyncio.run(owners.republish(settings, topic or [])), indent=2))
    _settle_restore(settings, every_topic=not topic)


def _settle_restore(settings: "Settings", *, every_topic: bool) -> None:
    """A restore of the local stack whose reconcile failed (services/runtime/host/restore_marker.py)
    is reconciled by a republish of every topic against the same stack: `tollgate up` may start."""
    from services.runtime.host import restore_marker

    cfg = _config()
    if not restore_marker.pending(cfg):
        return
    if every_topic and restore_marker.reconciles(cfg, settings):
        restore_marker.clear(cfg)
        typer.echo(f"republish: the restored stack in {cfg.state_dir} is reconciled; Tollgate starts again", err=True)
    else:
        typer.echo(
            f"republish: the restored stack in {cfg.state_dir} is still not reconciled (this was not a republish of "
            f"every topic to its Postgres, Kafka and redis): run {restore_marker.way_out(cfg)}",
            err=True,
        )


def _demo_service_token(cfg: stack.StackConfig) -> str:
    """A live service token for the local demo, kept in the state dir (mode 0600) across `up`s."""
    from services.keys import operator_cli
    from services.runtime.platform.settings import Settings

    # the serve process's settings: this stack's, and the rest from the environment
    settings = Settings(
        kafka_bootstrap_servers=cfg.kafka_bootstrap,
        kafka_replication_factor=cfg.kafka_replication_factor,
        database_url=cfg.database_url,
    )
    saved = STATE_DIR / "demo-service-token.json"
    if saved.exists():
        known = json.loads(saved.read_text())
        if asyncio.run(operator_cli.is_live(settings, UUID(known["id"]))):
            return str(known["token"])
    from contracts.common import ServiceScope

    created = asyncio.run(operator_cli.create(settings, DEMO_SERVICE_TOKEN_NAME, [ServiceScope.USAGE_WRITE]))
    write_private(saved, json.dumps(created))
    return created["token"]


SPLIT_INGRESS_PORT = 8090  # `up --split`: clear of `make run` (8080) and of the stack's ports
SPLIT_FIRST_PORT = 8091  # the replicas, on consecutive ports (services/runtime/host/split.py)


@app.command()
def up(
    port: Annotated[int | None, typer.Option(help="8080; with --split, the ingress's port, 8090")] = None,
    split: Annotated[
        bool,
        typer.Option(
            "--split",
            help="one process per service (two replicas of geo and metering) behind nginx "
            "routing by path prefix (deploy/ingress.conf), instead of one `serve --target all`",
        ),
    ] = False,
    kafka_nodes: KafkaNodes = None,
    workers: Annotated[
        int | None, typer.Option(min=1, help="`serve --workers` of the one process (default: the number of cores)")
    ] = None,
    demo_data: Annotated[
        bool,
        typer.Option(
            "--demo-data/--no-demo-data",
            help="seed the demo account with seven days of usage, an alert that fired and a paid order "
            "(idempotent); --no-demo-data leaves it empty (tests, benchmarks)",
        ),
    ] = True,
) -> None:
    """The local stack plus Tollgate in the background; prints URL and demo login. Refused while a
    restore's reconcile of Kafka has not succeeded (docs/backup.md)."""
    from services.runtime.host import restore_marker

    cfg = _config(kafka_nodes)
    if restore_marker.pending(cfg):
        _refuse_unreconciled("up", cfg)
    stack.up(cfg)
    if split:
        from services.runtime.host import split as split_shape

        shape = split_shape.shape(STATE_DIR / "split", port or SPLIT_INGRESS_PORT, SPLIT_FIRST_PORT)
        base_url = shape.ingress_url
        split_shape.start(shape, split_shape.process_env(cfg, shape, os.environ))
    else:
        base_url = f"http://127.0.0.1:{port or 8080}"
        pid_file = STATE_DIR / "tollgate.pid"
        if stack._read_pid(pid_file) is None:
            logs = STATE_DIR / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, **cfg.env()}
            with open(logs / "tollgate.log", "ab") as log:
                proc = subprocess.Popen(
                    [
                        *[sys.executable, "-m", "services.runtime.host.cli", "serve", "--target", "all"],
                        *["--port", str(port or 8080), "--workers", str(workers or os.cpu_count() or 1)],
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            pid_file.write_text(str(proc.pid))
        _wait_ready(base_url)
    _ensure_demo_account(base_url)
    service_token = _demo_service_token(cfg)
    seeded = _seed_demo_data(base_url, service_token) if demo_data else None
    shown: dict[str, object] = {
        "base_url": base_url,
        "console": f"{base_url}/console",
        "docs": f"{base_url}/docs",
        "demo_login": {"email": DEMO_EMAIL, "password": DEMO_PASSWORD},
        # for POST /api/usage/events, as a platform service would (README: "Reporting usage")
        "demo_service_token": service_token,
        "logs": str(STATE_DIR / ("split/logs" if split else "logs")),
        "clickhouse_analyst": cfg.analyst_dsns(),
        "clickhouse_play": f"http://127.0.0.1:{cfg.clickhouse_http_port}/play",
    }
    if seeded is not None:
        shown["demo_data"] = seeded
    if split:
        shown["docs"] = f"{shape.of('keys')[0].base_url}/docs"  # the ingress routes only the API and the console
        shown["replicas"] = {r.name: r.base_url for r in shape.replicas}
        shown["kafka_bootstrap"] = cfg.kafka_bootstrap
    _remember_what_up_printed(shown)
    typer.echo(json.dumps(shown, indent=2))


@app.command()
def down() -> None:
    """Stop Tollgate (either shape) and the local stack."""
    from services.runtime.host import split as split_shape

    split_shape.stop(STATE_DIR / "split")
    stack.stop_pid_file(STATE_DIR / "tollgate.pid", "tollgate")
    _up_file().unlink(missing_ok=True)
    stack.down(_config())


@app.command()
def backup(directory: Annotated[Path, typer.Argument(help="a new (or empty) folder")]) -> None:
    """Back up the local stack's Postgres (every service's schema), ClickHouse (its own BACKUP)
    and generated secrets into DIRECTORY, with a manifest; Kafka is rebuilt, not backed up
    (docs/backup.md). Works while the stack runs."""
    from services.runtime.host import backup as backups

    try:
        typer.echo(json.dumps(backups.backup(_config(), directory), indent=2))
    except backups.BackupError as exc:
        typer.echo(f"backup: {exc} (no backup written)", err=True)
        raise typer.Exit(1) from None


@app.command()
def restore(
    directory: Annotated[Path, typer.Argument(help="a folder `tollgate backup` wrote")],
    force: Annotated[bool, typer.Option("--force", help="replace a stack that already holds data")] = False,
) -> None:
    """Restore a backup into the stopped local stack (then `tollgate up`); all or nothing. Kafka's
    topics are then reconciled with the restored Postgres (`tollgate republish`, docs/backup.md)."""
    from services.runtime.host import backup as backups

    try:
        typer.echo(json.dumps(backups.restore(_config(), directory, force=force), indent=2))
    except backups.NotReconciled as exc:
        typer.echo(f"restore: {exc}", err=True)
        raise typer.Exit(1) from None
    except backups.BackupError as exc:
        typer.echo(f"restore: {exc} (the stack is as it was)", err=True)
        raise typer.Exit(1) from None


@app.command()
def docs(out: Path = Path("docs/generated")) -> None:
    """Write the OpenAPI (FastAPI) and AsyncAPI (FastStream) documents generated from the code."""
    from faststream.specification import AsyncAPI

    from services.runtime.host.app import create_app

    out.mkdir(parents=True, exist_ok=True)
    api = create_app(["all"])
    (out / "openapi.json").write_text(json.dumps(api.openapi(), indent=2))
    broker = api.state.runtime.broker
    spec = AsyncAPI(broker, title="Tollgate events", version="1.0.0").to_specification()
    (out / "asyncapi.json").write_text(spec.to_json())
    typer.echo(f"wrote {out / 'openapi.json'} and {out / 'asyncapi.json'}")


if __name__ == "__main__":
    app()
