"""Metrics for one tradecore process: put the recorders in place and serve the operators' port.

``instrument(container)`` turns a container's metrics on before its first use: the adapter
set is replaced by a subclass whose ``orders`` and ``audit`` are the recording decorators
around the set's own adapters (everything else, the stores included, is the set's own), and
``Core.metrics`` gives ``make_app`` the HTTP middleware. The core is not touched: it sees the
same ports. ``metrics_endpoint`` then serves ``/metrics`` (and, on a worker host, the health
checks) on METRICS_HOST:METRICS_PORT while the process runs.

``tradecore serve`` and ``tradecore worker`` call both when METRICS_PORT is set; with it
unset nothing is wrapped, counted or served.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping

from dependency_injector import providers

from tradecore.account_rules import DEFAULT_BROKER
from tradecore_adapters.brokers.ccxt_venue import DIALECTS
from tradecore_adapters.metrics import (
    MetricsServer,
    ProcessMetrics,
    RecordingAuditLog,
    RecordingOrderHistory,
    StateGauges,
)
from tradecore_adapters.redis.snapshots import RedisSnapshot
from tradecore_entrypoints.adapter_sets import AdapterSet
from tradecore_entrypoints.connections import Connections
from tradecore_entrypoints.container import Application, adapter_set_for
from tradecore_entrypoints.settings import ConfigError, Settings
from tradecore_entrypoints.system import System

log = logging.getLogger(__name__)

KNOWN_VENUES = frozenset({DEFAULT_BROKER, "alpaca", *DIALECTS})
"""The broker names a venue label may take; any other counts as ``other``."""


def instrumented(base: type[AdapterSet], metrics: ProcessMetrics) -> type[AdapterSet]:
    """``base`` with its order history and audit log behind the recording decorators (the
    set's other providers, and the set's own adapters inside the decorators, are shared:
    one container instance copies them once)."""

    class Instrumented(base):  # type: ignore[valid-type,misc]
        orders = providers.Singleton(
            RecordingOrderHistory, base.orders, providers.Object(metrics), base.core.clock
        )
        audit = providers.Singleton(RecordingAuditLog, base.audit, providers.Object(metrics))

    Instrumented.__name__ = Instrumented.__qualname__ = f"Instrumented{base.__name__}"
    return Instrumented


def instrument(container: Application) -> ProcessMetrics:
    """Turn on the metrics of ``container`` (call it before anything is built from it);
    returns them, in their own registry."""
    settings: Settings = container.settings()
    metrics = ProcessMetrics(venues=KNOWN_VENUES)
    container.core.metrics.override(providers.Object(metrics))
    base = adapter_set_for(settings)
    container.adapters.override(
        providers.Container(instrumented(base, metrics), core=container.core)
    )
    return metrics


QUEUE_COUNTS_KEY = "metrics:queue-counts"
"""The Redis key where the processes share their last read of the queue gauges."""


def state_gauges(system: System, *, worker_host: bool) -> StateGauges:
    """The scrape-time gauges of ``system``'s queues; with ``worker_host``, also the
    workers and leases of its host. On Redis the processes share their reads
    (``StateGauges``'s ``shared``): a read scans every key, and every process would
    otherwise scan for the same counts."""
    host = system.host
    counted = (host.holder, lambda: len(host.active_users)) if worker_host else None
    stores = system.stores
    shared = (
        RedisSnapshot(stores.redis.commands, QUEUE_COUNTS_KEY)
        if isinstance(stores, Connections)
        else None
    )
    return StateGauges(system.queue, system.directory, system.fill_tasks, counted, shared=shared)


async def worker_readiness(system: System) -> Mapping[str, bool]:
    """A worker host is ready when its worker-host loop runs and its stores answer."""
    try:
        stores = await system.stores.ready()
    except Exception:  # a readiness probe answers 503, it never fails the request
        log.warning("readiness: the stores could not be checked", exc_info=True)
        stores = False
    return {"workers": system.workers_running, "stores": stores}


def metrics_for(container: Application, settings: Settings) -> ProcessMetrics | None:
    """``instrument(container)`` when METRICS_PORT is set, else None (metrics off)."""
    return None if settings.metrics_port is None else instrument(container)


@contextlib.asynccontextmanager
async def serving_metrics(
    metrics: ProcessMetrics | None, system: System, settings: Settings, *, worker_host: bool
) -> AsyncIterator[MetricsServer | None]:
    """``metrics_endpoint`` while the block runs, or nothing when ``metrics`` is None."""
    if metrics is None:
        yield None
        return
    async with metrics_endpoint(metrics, system, settings, worker_host=worker_host) as server:
        yield server


@contextlib.asynccontextmanager
async def metrics_endpoint(
    metrics: ProcessMetrics, system: System, settings: Settings, *, worker_host: bool
) -> AsyncIterator[MetricsServer]:
    """Serve ``metrics`` on METRICS_HOST:METRICS_PORT while the block runs (a worker host
    also serves ``/health/live`` and ``/health/ready``; port 0 when METRICS_PORT is unset:
    a free one, for tests). A port that cannot be bound raises ConfigError naming the
    variables."""
    # the embedded `tradecore serve` runs its worker host in process: count its workers too
    gauges = state_gauges(system, worker_host=worker_host or system.in_process_workers)
    metrics.registry.register(gauges)

    async def readiness() -> Mapping[str, bool]:
        return await worker_readiness(system)

    server = MetricsServer(
        metrics.registry,
        before_scrape=gauges.refresh,
        readiness=readiness if worker_host else None,
    )
    port = settings.metrics_port if settings.metrics_port is not None else 0
    try:
        bound = await server.start(settings.metrics_host, port)
    except OSError as e:
        metrics.registry.unregister(gauges)
        where = f"{settings.metrics_host}:{port}"
        raise ConfigError(
            f"METRICS_HOST:METRICS_PORT: cannot listen on {where} ({e.strerror or e})"
        ) from e
    log.warning("metrics on http://%s:%d/metrics", settings.metrics_host, bound)
    try:
        yield server
    finally:
        await server.stop()
        metrics.registry.unregister(gauges)
