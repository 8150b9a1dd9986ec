"""The metric names and labels follow the Prometheus conventions, every metric is documented,
and the Grafana dashboard queries only metrics and labels that exist."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase

from tradecore.testing.clock import FakeClock
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_adapters.memory.order_queue import MemoryOrderQueue
from tradecore_adapters.memory.worker_directory import MemoryWorkerDirectory
from tradecore_adapters.metrics import ProcessMetrics, StateGauges

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "tradecore.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"
SNAKE = re.compile(r"tradecore_[a-z][a-z0-9]*(_[a-z0-9]+)*")
LABEL = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
BOUNDED_LABELS = {
    "source",
    "outcome",
    "code",
    "status",
    "stage",
    "venue",
    "attack_class",
    "route",
    "method",
}
"""Each takes its values from a closed set (docs/metrics.md); nothing else may be a label."""
PROMETHEUS_LABELS = {"le", "instance", "job"}
UNIT_SUFFIXES = ("_seconds", "_bytes")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}


def full_registry() -> tuple[ProcessMetrics, StateGauges]:
    clock = FakeClock()
    directory = MemoryWorkerDirectory(clock)
    queue = MemoryOrderQueue(clock, directory)
    gauges = StateGauges(queue, directory, MemoryFillTaskQueue(clock), ("host", lambda: 0))
    metrics = ProcessMetrics()
    metrics.registry.register(gauges)
    return metrics, gauges


def families() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Family name -> (type, label names), every metric of a worker host's registry."""
    metrics, gauges = full_registry()
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            # the declared label names (a metric with no series yet has no samples to read)
            family = next(iter(metric.describe()))
            found[family.name] = (family.type, tuple(metric._labelnames))
    for family in gauges.describe():
        found[family.name] = (family.type, ())
    return found


def exposed_names() -> dict[str, tuple[str, ...]]:
    """Every sample name a scrape may show, with its metric's labels."""
    return {
        name + suffix: labels
        for name, (kind, labels) in families().items()
        for suffix in SUFFIXES[kind]
    }


@pytest.mark.parametrize("name", sorted(families()))
def test_names_are_snake_case_with_the_prefix_and_their_unit(name: str) -> None:
    kind, labels = families()[name]
    assert SNAKE.fullmatch(name), name
    if kind == "histogram":
        assert name.endswith(UNIT_SUFFIXES), f"{name}: a histogram names its unit"
    if kind == "gauge":
        assert not name.endswith(("_total", "_count", "_sum", "_bucket")), name
    for label in labels:
        assert LABEL.fullmatch(label), label
        assert label in BOUNDED_LABELS, f"{name}: label {label} has no closed set of values"


def test_counters_are_exposed_with_the_total_suffix() -> None:
    metrics, _ = full_registry()
    metrics.login_failures.inc()
    text = "\n".join(s.name for family in metrics.registry.collect() for s in family.samples)
    assert "tradecore_login_failures_total" in text
    for name, (kind, _) in families().items():
        if kind == "counter":
            assert not name.endswith("_total"), "the family name drops _total; samples add it"


def test_every_metric_is_documented() -> None:
    page = METRICS_DOC.read_text(encoding="utf-8")
    missing = [
        name + ("_total" if kind == "counter" else "")
        for name, (kind, _) in families().items()
        if f"`{name}{'_total' if kind == 'counter' else ''}`" not in page
    ]
    assert missing == []


def dashboard_expressions() -> list[str]:
    document = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [t["expr"] for panel in document["panels"] for t in panel["targets"]]


def test_the_dashboard_queries_only_metrics_that_exist() -> None:
    exposed = exposed_names()
    used = {m for expr in dashboard_expressions() for m in SNAKE_IN_TEXT.findall(expr)}
    assert used, "the dashboard queries no tradecore metric"
    assert sorted(used - set(exposed)) == []


def test_the_dashboard_groups_and_filters_only_by_labels_of_its_metrics() -> None:
    exposed = exposed_names()
    for expr in dashboard_expressions():
        labels = set(PROMETHEUS_LABELS)
        for metric in SNAKE_IN_TEXT.findall(expr):
            labels |= set(exposed.get(metric, ()))
        grouped = {
            label.strip()
            for clause in re.findall(r"\bby \(([^)]*)\)", expr)
            for label in clause.split(",")
        }
        filtered = set(re.findall(r"([a-z_]+)=~?\"", expr))
        assert grouped | filtered <= labels, expr


def test_the_dashboard_covers_what_operators_watch() -> None:
    used = {m for expr in dashboard_expressions() for m in SNAKE_IN_TEXT.findall(expr)}
    for needed in (
        "tradecore_orders_total",
        "tradecore_order_stage_duration_seconds_bucket",
        "tradecore_order_requests_waiting",
        "tradecore_fill_dead_letters",
        "tradecore_worker_host_workers",
        "tradecore_users_waiting_without_worker",
        "tradecore_broker_errors_total",
        "tradecore_attacks_total",
        "tradecore_login_failures_total",
        "tradecore_http_requests_total",
    ):
        assert needed in used, needed


SNAKE_IN_TEXT = re.compile(r"\btradecore_[a-z0-9_]+")
