"""The alert rules and the dashboard (docs/operations.md): promtool checks the rules and runs
their unit tests (deploy/prometheus/tests.yml, tests-renewals.yml); every rule links its runbook section; every
metric they name is documented; every metric Tollgate defines names its unit in its HELP and
carries no id in its labels."""

import importlib
import re
import shutil
import subprocess

import pytest
from prometheus_client import REGISTRY

from services.runtime.host.app import SERVICES
from tests.support.monitoring import ALERTS, OPERATIONS, every_metric, metric_names, panel_expressions, rules

PROMETHEUS_DIR = ALERTS.parent
# promtool's unit tests of the rules: the renewal rules' look back days, so they have a file of
# their own evaluated hourly (tests.yml evaluates every minute).
RULE_TESTS = ("tests.yml", "tests-renewals.yml")
# Label names that would carry an account, key or user (or any other unbounded id).
FORBIDDEN_LABELS = re.compile(r"(^|_)(account|key|user|member|token|session|email|id)(_|$)|_id$")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: install Debian's `prometheus` package (deploy/local/prereqs.sh --test)")
    return found


def test_promtool_checks_the_rules():
    result = subprocess.run([promtool(), "check", "rules", ALERTS.name], cwd=PROMETHEUS_DIR, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_runs_the_rules_unit_tests():
    result = subprocess.run([promtool(), "test", "rules", *RULE_TESTS], cwd=PROMETHEUS_DIR, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_rule_links_its_runbook_section_and_every_alert_has_a_test():
    headings = {line[4:].strip().lower() for line in OPERATIONS.read_text().splitlines() if line.startswith("### ")}
    tests = "".join((PROMETHEUS_DIR / name).read_text() for name in RULE_TESTS)
    for rule in rules():
        name = rule["alert"]
        assert rule["annotations"]["runbook_url"] == f"docs/operations.md#{name.lower()}"
        assert name.lower() in headings, f"docs/operations.md has no section {name}"
        assert f"alertname: {name}" in tests, f"no test of {name} in deploy/prometheus/{RULE_TESTS}"


def test_the_issues_alerts_are_there():
    names = {rule["alert"] for rule in rules()}
    assert {
        "TollgateConsumerLagGrowing",
        "TollgateConsumerFailing",
        "TollgateConsumerStalled",
        "TollgateSinkStalled",
        "TollgateDeadLetters",
        "TollgateOutboxBacklogOld",
        "TollgateEdgeOverloaded",
        "TollgateHigh5xxRatio",
        "TollgateRedisFailOpen",
        "TollgateClickHouseUnreachable",
        "TollgatePostgresUnreachable",
        "TollgateKafkaUnreachable",
        "TollgateNotificationsFailing",
        "TollgateWebhooksFailing",
        "TollgateRenewalsDeclined",
        "TollgateRenewalsLapsed",
        "TollgateRenewalsProviderFailing",
    } <= names


def test_every_metric_of_the_rules_and_the_dashboard_is_documented():
    documented = set(re.findall(r"^\| `(tollgate_\w+)`", OPERATIONS.read_text(), re.MULTILINE))
    for name in every_metric():
        family = re.sub(r"_(bucket|count|sum)$", "", name)
        assert family in documented, f"{name} is not in docs/operations.md"


def test_the_dashboard_has_the_issues_panels():
    expressions = " ".join(panel_expressions())
    for metric in (
        "tollgate_http_request_seconds_count",  # calls by outcome
        "tollgate_http_request_seconds_bucket",  # latency by route
        "tollgate_metering_sink_events_total",  # events in vs written
        "tollgate_kafka_consumer_lag",
        "tollgate_dead_lettered_total",
        "tollgate_outbox_unsent_rows",
        "tollgate_quota_states_published_total",
        "tollgate_alerts_notifications_total",
    ):
        assert metric in expressions


def test_metric_names_come_out_of_promql():
    assert metric_names('sum by (route, le) (rate(a_bucket{status=~"5.."}[5m])) / on() b > 0.5 and bool c') == {
        "a_bucket",
        "b",
        "c",
    }


def _tollgate_families() -> list:
    for name in SERVICES:
        importlib.import_module(f"services.{name}.app")
    importlib.import_module("services.runtime.host.app")
    return [family for family in REGISTRY.collect() if family.name.startswith("tollgate_")]


def test_every_help_names_its_unit_and_no_label_carries_an_id():
    families = _tollgate_families()
    assert len(families) >= 25
    documented = set(re.findall(r"^\| `(tollgate_\w+)`", OPERATIONS.read_text(), re.MULTILINE))
    for family in families:
        assert re.search(r"\(unit: [^)]+\)$", family.documentation), f"{family.name}: HELP without its unit"
        exposed = family.name + ("_total" if family.type == "counter" else "")
        assert exposed in documented, f"{exposed} is not in docs/operations.md"
        labels = {label for sample in family.samples for label in sample.labels} - {"le"}
        assert not [label for label in labels if FORBIDDEN_LABELS.search(label)], f"{family.name}: {labels}"
