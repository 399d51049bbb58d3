"""The README's "Reporting usage" example runs as written on a stock machine: its shell block,
taken from the README itself, is run by bash against a real `tollgate serve` holding the demo
account, and reports its event (202, accepted 1). It needs no `<account id>` filled in by hand
(it asks `GET /api/account`) and no tool beyond curl, python3 and date (no `uuidgen`)."""

import json
import os
import re
import subprocess
import uuid

import httpx
import pytest

from services.runtime.host.cli import DEMO_EMAIL, DEMO_PASSWORD
from tests.support.apps import REPO, serve_process
from tests.support.service_tokens import ADMIN_PATH, admin_headers

pytestmark = pytest.mark.integration
README_URL = "http://127.0.0.1:8080"


def usage_example() -> str:
    section = (REPO / "README.md").read_text().split("## Reporting usage", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert match, "the README's usage example"
    return match.group(1)


def test_the_readme_usage_example_reports_an_event_as_written(settings):
    with serve_process(settings) as serve:
        body = {"email": DEMO_EMAIL, "password": DEMO_PASSWORD, "name": "Demo", "user_type": "individual"}
        demo = httpx.post(f"{serve.base_url}/api/auth/register", json=body, timeout=10)
        assert demo.status_code == 201, demo.text
        made = httpx.post(
            f"{serve.base_url}{ADMIN_PATH}",
            json={"name": f"demo-{uuid.uuid4().hex[:6]}", "scopes": ["usage:write"]},
            headers=admin_headers(settings),
            timeout=10,
        )
        assert made.status_code == 201, made.text
        script = usage_example().replace(README_URL, serve.base_url)
        assert README_URL not in script
        env = {"PATH": os.environ["PATH"], "SERVICE_TOKEN": made.json()["token"]}
        ran = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert ran.returncode == 0, ran.stderr
        answer = json.loads(ran.stdout.strip().splitlines()[-1])
        assert answer == {"accepted": 1, "duplicates": 0}, ran.stdout
