"""Gauges read at scrape time: the queues, the leases, the dead letters, and this host's workers.

prometheus-client asks a collector for its values synchronously, while the stores are read
with ``await``; so the metrics endpoint awaits ``StateGauges.refresh()`` right before it
renders the registry, and ``collect`` reports what that read found. A read that failed (the
store is down) reports ``tradecore_queue_gauges_up 0`` and leaves the queue gauges out, instead
of showing stale counts as current.

The counts come from the operators' reads of the ports (``OrderQueue.depths``,
``WorkerDirectory.leases``, ``FillTaskQueue.pending_count`` and ``dead_letters``), over at
most ``MAX_USERS`` users each. On Redis the first two scan every key of the server, so the
counts are system-wide and the same in every process: given a ``SharedCounts``, a process
stores what it read there for ``SHARED_TTL_S``, and the processes scraped meanwhile report
that read instead of scanning again (each its own worker host's leases from it), so the
scans do not grow with the number of processes scraped.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import attrs
import cattrs
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tradecore.errors import StoreUnavailable
from tradecore.ports.messaging import FillTaskQueue, OrderQueue, WorkerDirectory

log = logging.getLogger(__name__)

MAX_USERS = 100_000
"""The most users one scrape reads the lists and leases of (a bound on its cost)."""
SHARED_TTL_S = 10.0
"""How long one process's read of the counts serves the other processes' scrapes."""


@attrs.frozen
class QueueCounts:
    """One read of the queues (docs/metrics.md says what each counts); ``held_by``: the
    live leases of each worker host, by holder name."""

    requests_waiting: int
    requests_in_flight: int
    users_without_worker: int
    leases: int
    fill_tasks: int
    dead_letters: int
    held_by: Mapping[str, int] = attrs.field(factory=dict)


class SharedCounts(Protocol):
    """Where the processes share their last read of the counts: one small document, replaced
    whole and lapsing after its time to live. Raises StoreUnavailable."""

    async def load(self) -> dict[str, Any] | None:
        """The document stored last, or None once it lapsed."""
        ...

    async def store(self, document: Mapping[str, Any], ttl_s: float) -> None:
        """Replace the document; it lapses after ``ttl_s``."""
        ...


_converter = cattrs.Converter()


async def read_counts(
    queue: OrderQueue, directory: WorkerDirectory, fill_tasks: FillTaskQueue
) -> QueueCounts:
    """The counts now (each read a moment apart: the queues are not frozen while read)."""
    depths = await queue.depths(MAX_USERS)
    leases = await directory.leases(MAX_USERS)
    leased = {lease.user_id for lease in leases}
    return QueueCounts(
        requests_waiting=sum(d.waiting for d in depths),
        requests_in_flight=sum(d.in_flight for d in depths),
        users_without_worker=sum(1 for d in depths if d.user_id not in leased),
        leases=len(leased),
        fill_tasks=await fill_tasks.pending_count(),
        dead_letters=len(await fill_tasks.dead_letters()),
        held_by=dict(Counter(lease.holder for lease in leases)),
    )


QUEUE_GAUGES: tuple[tuple[str, str, str], ...] = (
    (
        "requests_waiting",
        "tradecore_order_requests_waiting",
        "Order requests in the users' lists that no worker has taken yet.",
    ),
    (
        "requests_in_flight",
        "tradecore_order_requests_in_flight",
        "Order requests a worker took and has not completed.",
    ),
    (
        "fill_tasks",
        "tradecore_fill_tasks_pending",
        "Fill checks queued, delayed or running (order-tasks messages not settled).",
    ),
    (
        "dead_letters",
        "tradecore_fill_dead_letters",
        "Fill checks that gave up (the order-tasks dead-letter queue).",
    ),
    (
        "leases",
        "tradecore_worker_leases",
        "Users whose worker holds a live lease, on any worker host.",
    ),
    (
        "users_without_worker",
        "tradecore_users_waiting_without_worker",
        "Users with an order waiting or in flight and no worker holding their lease.",
    ),
)
"""(``QueueCounts`` field, metric name, help) of each queue gauge."""

UP = "tradecore_queue_gauges_up"
UP_HELP = "1 when the last scrape read the queue gauges, 0 when a store did not answer."
HOST_WORKERS = "tradecore_worker_host_workers"
HOST_WORKERS_HELP = "Per-user workers running in this worker host."
HOST_LEASES = "tradecore_worker_host_leases"
HOST_LEASES_HELP = "Leases this worker host holds (users it serves)."


class StateGauges(Collector):
    """The queue gauges (system-wide: every process reports the same counts) and, for a
    process that runs a worker host (``host`` given: its holder name and a count of its
    running workers), the workers running here and the leases this host holds. With
    ``shared``, a read younger than ``SHARED_TTL_S`` stored there by any process is reported
    instead of reading the stores again (module doc)."""

    def __init__(
        self,
        queue: OrderQueue,
        directory: WorkerDirectory,
        fill_tasks: FillTaskQueue,
        host: tuple[str, Callable[[], int]] | None = None,
        *,
        shared: SharedCounts | None = None,
    ) -> None:
        self._ports = (queue, directory, fill_tasks)
        self._host = host
        self._shared = shared
        self._last: QueueCounts | None = None
        self._read = False

    async def refresh(self) -> None:
        """Read the queues now (or take a recent read another process shared); a store
        outage is reported as ``UP`` 0, never raised."""
        self._read = True
        try:
            self._last = await self._counts()
        except StoreUnavailable as e:
            log.warning("queue gauges could not be read: %s", e)
            self._last = None

    async def _counts(self) -> QueueCounts:
        shared = self._shared
        if shared is not None:
            document = await shared.load()
            if document is not None:
                return _converter.structure(document, QueueCounts)
        counts = await read_counts(*self._ports)
        if shared is not None:
            await shared.store(_converter.unstructure(counts), SHARED_TTL_S)
        return counts

    def describe(self) -> Iterable[Metric]:
        """The families with no samples, so registering reads no store."""
        yield GaugeMetricFamily(UP, UP_HELP)
        for _, name, help_text in QUEUE_GAUGES:
            yield GaugeMetricFamily(name, help_text)
        if self._host is not None:
            yield GaugeMetricFamily(HOST_WORKERS, HOST_WORKERS_HELP)
            yield GaugeMetricFamily(HOST_LEASES, HOST_LEASES_HELP)

    def collect(self) -> Iterator[Metric]:
        last = self._last
        if self._read:
            yield GaugeMetricFamily(UP, UP_HELP, value=0 if last is None else 1)
        if last is not None:
            for field, name, help_text in QUEUE_GAUGES:
                yield GaugeMetricFamily(name, help_text, value=getattr(last, field))
        if self._host is not None:
            yield GaugeMetricFamily(HOST_WORKERS, HOST_WORKERS_HELP, value=self._host[1]())
            if last is not None:
                held_here = last.held_by.get(self._host[0], 0)
                yield GaugeMetricFamily(HOST_LEASES, HOST_LEASES_HELP, value=held_here)
