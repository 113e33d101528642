"""The Grafana dashboard and the Prometheus alert rules use only metrics the code defines.

No Prometheus or Grafana runs here: the files are parsed, and every metric and label in every
query is cross-checked against the collectors of ``worker/metrics.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.metrics import MetricWrapperBase

from worker import metrics

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "memworker-dashboard.json"
# Where the docs name the files: the site's page on metrics and alerts.
METRICS_PAGE = REPO / "docs" / "guides" / "metrics.md"

SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}
TARGET_LABELS = {"instance", "job"}
"""Labels Prometheus adds to every series it scrapes."""


def defined_series() -> dict[str, set[str]]:
    """Every series name the code can export, with the labels it carries."""
    series: dict[str, set[str]] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            name, kind = value._name, str(value._type)
            labels = set(value._labelnames) | TARGET_LABELS
            if kind == "histogram":
                labels.add("le")
            for suffix in SUFFIXES[kind]:
                series[name + suffix] = labels
    return series


METRIC = re.compile(r"\bmemworker_[a-z_]+")
SELECTOR = re.compile(r"(memworker_[a-z_]+)\{([^}]*)\}")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def problems(expr: str) -> list[str]:
    """What in a PromQL expression the code does not define: metric names, and labels that
    none of the expression's metrics carry."""
    series = defined_series()
    used = set(METRIC.findall(expr))
    found = [f"unknown metric {name}" for name in sorted(used - set(series))]
    for name, matchers in SELECTOR.findall(expr):
        for matcher in filter(None, (m.strip() for m in matchers.split(","))):
            label = re.split(r"[=!~]", matcher, maxsplit=1)[0].strip()
            if label not in series.get(name, set()):
                found.append(f"{name} has no label {label}")
    carried = set().union(*(series.get(name, set()) for name in used)) if used else set()
    for group in GROUPING.findall(expr):
        for label in filter(None, (g.strip() for g in group.split(","))):
            if label not in carried:
                found.append(f"no metric of {expr!r} has label {label}")
    return found


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def test_the_cross_check_catches_an_unknown_metric_or_label() -> None:
    assert problems("rate(memworker_commands_total[1m])") == []
    assert problems("memworker_no_such_thing > 0") == ["unknown metric memworker_no_such_thing"]
    assert problems('memworker_stream_lag{queue="x"}') == [
        "memworker_stream_lag has no label queue"
    ]
    assert problems("sum by (reason) (memworker_stream_lag)") != []


def test_every_alert_rule_uses_only_metrics_and_labels_the_code_defines() -> None:
    rules = alert_rules()
    assert rules
    for rule in rules:
        assert problems(str(rule["expr"])) == [], rule["alert"]


def test_every_dashboard_query_uses_only_metrics_and_labels_the_code_defines() -> None:
    queries = dashboard_queries()
    assert queries
    for title, expr in queries:
        assert problems(expr) == [], title


def test_the_alerts_cover_dead_letters_lag_memory_headroom_time_to_full_and_readiness() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), "alert names are unique"
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
    used = " ".join(str(rule["expr"]) for rule in rules)
    for metric in (
        "memworker_dead_letters_total",
        "memworker_stream_lag",
        "memworker_redis_used_memory_bytes",
        "memworker_redis_max_memory_bytes",
        "memworker_redis_seconds_until_full",
        "memworker_ready",
    ):
        assert metric in used, f"no alert watches {metric}"
    headroom = next(r for r in rules if "memworker_redis_max_memory_bytes" in str(r["expr"]))
    assert "0.8" in str(headroom["expr"]), "headroom below 20 % alerts"


def test_the_dashboard_shows_lag_pending_throughput_dead_letters_and_memory() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    used = " ".join(expr for _title, expr in dashboard_queries())
    for metric in (
        "memworker_stream_lag",
        "memworker_stream_pending",
        "memworker_commands_total",
        "memworker_dead_letters_total",
        "memworker_redis_used_memory_bytes",
        "memworker_redis_max_memory_bytes",
        "memworker_redis_seconds_until_full",
    ):
        assert metric in used, f"the dashboard does not show {metric}"


def test_the_metrics_page_names_both_files() -> None:
    text = METRICS_PAGE.read_text()
    assert "deploy/grafana/memworker-dashboard.json" in text
    assert "deploy/prometheus/alerts.yml" in text
