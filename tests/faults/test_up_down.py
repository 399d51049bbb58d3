"""`tollgate up` brings the whole thing up on a fresh state dir; `tollgate down` leaves nothing."""

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from tests.support.apps import REPO, consumers_pids, free_port, own_stack_env, worker_pids

pytestmark = pytest.mark.integration


def _pids(state: Path) -> list[int]:
    files = [state / "tollgate.pid", state / "kafka" / "kafka.pid", state / "postgres" / "data" / "postmaster.pid"]
    files += [state / "clickhouse.pid", state / "redis.pid"]
    return [int(f.read_text().split()[0]) for f in files if f.exists()]


def _alive(pid: int) -> bool:
    """Running: a zombie (exited, not yet reaped by the init process it was orphaned to) is not."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_up_serves_every_dependency_ready_with_a_demo_login_and_down_leaves_no_process():
    # Under the repo, not /tmp/pytest-of-root (0700): the postgres user must reach its data dir.
    state = REPO / ".tollgate" / f"e2e-{uuid.uuid4().hex[:8]}"
    port = free_port()
    env = own_stack_env(state)
    cli = [sys.executable, "-m", "services.runtime.host.cli"]
    pids: list[int] = []
    try:
        up = subprocess.run([*cli, "up", "--port", str(port)], env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
        assert up.returncode == 0, up.stdout + up.stderr
        printed = json.loads(up.stdout[up.stdout.index("{") :])
        base = printed["base_url"]
        assert base == f"http://127.0.0.1:{port}"

        ready = httpx.get(f"{base}/readyz", timeout=5)
        assert ready.status_code == 200
        assert all(v == "ready" for v in ready.json()["checks"].values())
        assert {"kafka", "postgres", "clickhouse"} <= ready.json()["checks"].keys()

        login = httpx.post(f"{base}/api/auth/login", json=printed["demo_login"], timeout=10)
        assert login.status_code == 200, login.text
        # the demo service token reports usage, as a platform service would (an empty batch: 422, not 401)
        service = {"Authorization": f"Bearer {printed['demo_service_token']}"}
        assert printed["demo_service_token"].startswith("st-")
        assert httpx.post(f"{base}/api/usage/events", json={"events": []}, headers=service, timeout=10).status_code == 422
        # the demo account is seeded (services/runtime/host/demo_data.py): a week of usage and the rest
        seeded = printed["demo_data"]
        assert seeded["new_usage_events"] == seeded["usage_events"] > 0, seeded
        assert seeded["paid_order"] and seeded["alert_rule"] and seeded["calls"] > 0 and seeded["refused_calls"] > 0, seeded
        # the analyst's DSNs are printed, and the analyst reads Tollgate's database but cannot write
        analyst = printed["clickhouse_analyst"]
        assert analyst["http"].startswith("http://analyst:")
        assert analyst["http"].endswith(f"@127.0.0.1:{env['TOLLGATE_CLICKHOUSE_HTTP_PORT']}")
        assert analyst["native"].endswith(f"@127.0.0.1:{env['TOLLGATE_CLICKHOUSE_TCP_PORT']}/tollgate")
        read = httpx.post(analyst["http"], content="SELECT count() FROM tollgate.usage_events", timeout=10)
        assert read.status_code == 200 and read.text.strip().isdigit(), read.text
        write = httpx.post(analyst["http"], content="DROP TABLE tollgate.usage_events", timeout=10)
        assert write.status_code != 200 and "ACCESS_DENIED" in write.text, write.text
        status = subprocess.run([*cli, "stack", "status"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert analyst["http"] in status.stdout and analyst["native"] in status.stdout, status.stdout
        assert "redis       running" in status.stdout and "clickhouse  running" in status.stdout, status.stdout
        # idempotent: a second `up` finds everything running and the demo account there
        again = subprocess.run([*cli, "up", "--port", str(port)], env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stdout + again.stderr
        printed_again = json.loads(again.stdout[again.stdout.index("{") :])
        assert printed_again["demo_service_token"] == printed["demo_service_token"]
        # ... and seeded once: a re-run's events are duplicates, nothing else is made again
        reseeded = printed_again["demo_data"]
        # (but for the few of an hour begun in between)
        assert reseeded["usage_events"] > 0 and reseeded["new_usage_events"] <= 6, reseeded
        assert not (reseeded["paid_order"] or reseeded["alert_rule"] or reseeded["calls"] or reseeded["refused_calls"]), reseeded
        pids = _pids(state)
        assert len(pids) == 5
        # `serve --workers` defaults to one worker per core, and one process of consumers (one
        # core: no supervisor, no workers)
        supervisor = int((state / "tollgate.pid").read_text())
        workers, consumers = worker_pids(supervisor), consumers_pids(supervisor)
        assert len(workers) == ((os.cpu_count() or 1) if (os.cpu_count() or 1) > 1 else 0), workers
        assert len(consumers) == (1 if workers else 0), consumers
        pids += workers + consumers
    finally:
        subprocess.run([*cli, "down"], env=env, cwd=REPO, capture_output=True, timeout=120)
        shutil.rmtree(state, ignore_errors=True)
    assert not [pid for pid in pids if _alive(pid)]
