"""Helpers shared by the Prometheus tests: the deploy files' queries, their metric names, promtool."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
DASHBOARDS = sorted((REPO / "deploy" / "grafana" / "dashboards").glob("*.json"))
RULES = PROMETHEUS_DIR / "rules.yml"
RULES_TEST = PROMETHEUS_DIR / "rules_test.yml"

# Grafana variables and the fixed values the tests evaluate them with.
VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "10m",
    "$job": ".*",
    "$tool": ".*",
}
# Metric names: ours, and the process collector's.
_NAME = re.compile(r"\b((?:mcp_recovery|process)_[a-z0-9_]+)\b")
# What would hide a missing series: a literal vector (`or vector(0)`), absent(), or an `or` whose
# sides read other metrics (a series of one standing in for a missing one of the other).
_STAND_IN = re.compile(r"\bvector\s*\(|\babsent(_over_time)?\s*\(", re.IGNORECASE)
_OR = re.compile(r"\bor\b", re.IGNORECASE)


def hides_missing(expr: str) -> bool:
    """Whether `expr` could answer for a metric that is not there. An `or` between two readings of
    the same metrics (a young series read whole, or an older one's increase) hides nothing: where
    the metric is missing, both sides are empty."""
    if _STAND_IN.search(expr):
        return True
    sides = _OR.split(expr)
    if len(sides) == 1:
        return False
    names = [set(_NAME.findall(side)) for side in sides]
    return not names[0] or any(side_names != names[0] for side_names in names[1:])


def promtool() -> str | None:
    return shutil.which("promtool")


def prometheus() -> str | None:
    return shutil.which("prometheus")


def dashboard_targets() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, expr) for every query of every panel."""
    out = []
    for path in DASHBOARDS:
        board: dict[str, Any] = json.loads(path.read_text())
        for panel in _panels(board["panels"]):
            for target in panel.get("targets", []):
                out.append((path.name, panel["title"], target["expr"]))
    return out


def dashboard_variable_queries() -> list[str]:
    out = []
    for path in DASHBOARDS:
        for var in json.loads(path.read_text())["templating"]["list"]:
            if var.get("type") == "query":
                query = var["query"]
                out.append(query["query"] if isinstance(query, dict) else query)
    return out


def _panels(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for panel in panels:
        out.append(panel)
        out.extend(_panels(panel.get("panels", [])))
    return out


def rule_exprs() -> list[tuple[str, str]]:
    """(rule name, expr) for every alerting and recording rule."""
    doc = yaml.safe_load(RULES.read_text())
    return [(r.get("alert") or r.get("record"), r["expr"]) for g in doc["groups"] for r in g["rules"]]


def rules_test_series() -> list[str]:
    doc = yaml.safe_load(RULES_TEST.read_text())
    return [s["series"] for t in doc["tests"] for s in t.get("input_series", [])]


def substitute(expr: str) -> str:
    for name, value in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown Grafana variable left in {expr!r}"
    return expr


def metric_names(expr: str) -> set[str]:
    return set(_NAME.findall(expr))


def family(sample_name: str) -> str:
    """The family a sample or query name belongs to (histogram and counter suffixes removed)."""
    return re.sub(r"_(bucket|sum|count|total)$", "", sample_name)
