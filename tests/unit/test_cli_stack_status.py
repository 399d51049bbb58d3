"""`tollgate stack status` prints what the README ("What `make run` does") says it prints: what
`tollgate up` printed (base URL, console, demo login, demo service token, the analyst's DSNs and
the /play page), and whether Tollgate answers. The stack's processes are faked (no I/O beyond a
temporary state folder)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from services.runtime.host import cli, stack

SHOWN = {
    "base_url": "http://127.0.0.1:8080",
    "console": "http://127.0.0.1:8080/console",
    "docs": "http://127.0.0.1:8080/docs",
    "demo_login": {"email": "demo@tollgate.local", "password": "demo-password-123"},
    "demo_service_token": "st-" + "x" * 43,
    "logs": ".tollgate/logs",
    "clickhouse_analyst": {
        "http": "http://analyst:pw@127.0.0.1:18123",
        "native": "clickhouse://analyst:pw@127.0.0.1:19000/tollgate",
    },
    "clickhouse_play": "http://127.0.0.1:18123/play",
}


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(cli, "STATE_DIR", tmp_path)
    monkeypatch.setattr(stack, "status", lambda cfg: {"kafka": "running (pid 1)", "redis": "running (pid 2)"})
    monkeypatch.setattr(stack.StackConfig, "analyst_dsns", lambda self: SHOWN["clickhouse_analyst"])
    return tmp_path


def status() -> str:
    result = CliRunner().invoke(cli.app, ["stack", "status"])
    assert result.exit_code == 0, result.output
    return result.output


def test_status_prints_what_up_printed(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "_is_ready", lambda base_url: True)
    cli._remember_what_up_printed(SHOWN)  # what `up` does before it prints
    assert (state / "up.json").stat().st_mode & 0o777 == 0o600  # it holds the demo service token
    printed = status()
    assert "kafka       running (pid 1)" in printed and "redis       running (pid 2)" in printed
    assert f"tollgate    ready at {SHOWN['base_url']}" in printed
    assert json.loads(printed[printed.index("{") :]) == SHOWN  # every item of the README's list
    assert SHOWN["clickhouse_analyst"]["http"] in printed and SHOWN["clickhouse_play"] in printed


def test_status_says_when_tollgate_is_not_up(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    printed = status()
    assert "tollgate    not started (tollgate up)" in printed
    assert "http://analyst:pw@127.0.0.1:18123" in printed and "/play" in printed  # the stack's own, still
    cli._remember_what_up_printed(SHOWN)
    monkeypatch.setattr(cli, "_is_ready", lambda base_url: False)
    assert "tollgate    NOT answering /readyz at http://127.0.0.1:8080" in status()
