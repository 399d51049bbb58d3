"""The monitoring files (deploy/prometheus/alerts.yml, deploy/grafana/tollgate.json) read for the
tests: their PromQL expressions and the metric names those use."""

import json
import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "tollgate.json"
OPERATIONS = REPO / "docs" / "operations.md"

# PromQL's words that look like names: aggregation modifiers, set and vector-matching operators.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}
# Series Prometheus makes itself, never on a target's /metrics.
SYNTHETIC = {"up"}


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def panel_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: strings, label matchers, ranges and grouping
    clauses taken out, then every name that is not a function call or a keyword."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        name = match.group(0)
        if text[match.end() :].lstrip().startswith("(") or name in KEYWORDS:
            continue  # a function or an aggregation
        names.add(name)
    return names


def every_metric() -> set[str]:
    """Every metric named by a rule or a panel (Prometheus's own `up` aside)."""
    expressions = [rule["expr"] for rule in rules()] + panel_expressions()
    return {name for expr in expressions for name in metric_names(expr)} - SYNTHETIC
