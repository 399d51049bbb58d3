"""A console session is an HMAC of SESSION_SECRET: with a secret everybody can read (the settings'
dev default, docker-compose's fallback) anyone forges a session of any account. `serve` refuses
one off loopback (the image serves on 0.0.0.0), and docker-compose has no fallback."""

from typing import Any

import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from services.runtime.host import cli
from services.runtime.platform.settings import PUBLIC_SESSION_SECRETS, Settings
from tests.unit.test_compose import _compose


class Started(Exception):
    """Tollgate's processes were about to start."""


@pytest.fixture
def serving(monkeypatch: pytest.MonkeyPatch) -> None:
    def started(target: str, *, consumers: bool = True) -> None:
        raise Started

    monkeypatch.setattr(cli, "worker_app", started)


def serve(monkeypatch: pytest.MonkeyPatch, host: str, **settings: Any) -> Any:
    monkeypatch.setattr("services.runtime.platform.settings.get_settings", lambda: Settings(**settings))
    monkeypatch.setattr("services.runtime.host.restore_marker.pending", lambda cfg: False)
    return CliRunner().invoke(cli.app, ["serve", "--workers", "1", "--host", host])


@pytest.mark.parametrize("secret", sorted(PUBLIC_SESSION_SECRETS))
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_serve_off_loopback_with_a_public_session_secret_is_refused(
    serving: None, monkeypatch: pytest.MonkeyPatch, secret: str, host: str
) -> None:
    refused = serve(monkeypatch, host, session_secret=SecretStr(secret))
    assert refused.exit_code == 1 and not isinstance(refused.exception, Started), refused.output
    assert "SESSION_SECRET" in refused.stderr


def test_the_settings_default_is_a_public_secret() -> None:
    assert Settings().session_secret.get_secret_value() in PUBLIC_SESSION_SECRETS


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_serve_on_loopback_with_the_dev_default_starts(serving: None, monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    started = serve(monkeypatch, host)  # `make run`, `tollgate up`, the tests: only this machine reaches it
    assert isinstance(started.exception, Started), started.output


def test_serve_off_loopback_with_a_secret_of_its_own_starts(serving: None, monkeypatch: pytest.MonkeyPatch) -> None:
    started = serve(monkeypatch, "0.0.0.0", session_secret=SecretStr("a-secret-of-this-deployment-0f3a9c"))
    assert isinstance(started.exception, Started), started.output


def test_compose_has_no_session_secret_fallback() -> None:
    for name, service in _compose()["services"].items():
        value = service.get("environment", {}).get("SESSION_SECRET")
        if value is None:
            continue
        assert ":-" not in value and ":?" in value, f"{name}: SESSION_SECRET falls back to a public value: {value}"
