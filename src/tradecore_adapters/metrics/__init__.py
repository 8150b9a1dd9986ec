"""Prometheus metrics (prometheus-client): a registry per process, recording decorators of
the ports, the HTTP middleware, the scrape-time gauges and the operators' port.

Nothing of the core imports this package; the composition root puts its pieces in place
(``tradecore_entrypoints.observability``). docs/metrics.md lists every metric.
"""

from __future__ import annotations

from tradecore_adapters.metrics.gauges import StateGauges
from tradecore_adapters.metrics.http_metrics import metrics_middleware
from tradecore_adapters.metrics.recorders import RecordingAuditLog, RecordingOrderHistory
from tradecore_adapters.metrics.registry import ProcessMetrics
from tradecore_adapters.metrics.server import MetricsServer

__all__ = [
    "MetricsServer",
    "ProcessMetrics",
    "RecordingAuditLog",
    "RecordingOrderHistory",
    "StateGauges",
    "metrics_middleware",
]
