"""A running tradecore process: the parts the container built, started and stopped together.

``System`` is what every entry point runs: ``tradecore serve`` (with the workers in process
in the embedded runtime, without them over Postgres and Redis), ``tradecore worker`` (the
worker host and the fill verifier), the admin commands (the stores only), the demo, the
benchmarks and the tests. Its attribute names are the same in both adapter sets, so a test
or a script reaches ``system.webhooks`` or ``system.orders`` whatever the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol, runtime_checkable

import attrs

from tradecore.ports.identity import Mailer
from tradecore.ports.messaging import FillTaskQueue, OrderQueue, WorkerDirectory
from tradecore.ports.protection import AlertThrottle, RateLimiter, ReplayStore, WebhookAdmission
from tradecore.ports.repositories import (
    AllowedIpRepository,
    ApiKeyRepository,
    AuditLog,
    OrderHistory,
    SessionRepository,
    TradingAccountRepository,
    UserRepository,
)
from tradecore.ports.runtime import Clock, RandomSource, Sleeper
from tradecore.services.accounts.provisioning import Provisioning
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.execution.cancellation import raise_if_cancelled
from tradecore.services.execution.fill_verifier import FillVerifier
from tradecore.services.execution.worker_host import WorkerHost
from tradecore.services.orders.dashboard_order import DashboardOrders
from tradecore.services.orders.settings import OrderSettings
from tradecore.services.orders.webhook_intake import WebhookIntake
from tradecore_adapters.brokers.paper import PaperExchange
from tradecore_adapters.mail.outbox import LoggingOutbox

log = logging.getLogger(__name__)

FILL_RETRY_S = 0.5
"""The pause after a fill-verification round that failed (a store outage) before the next."""
FILL_BATCH_LIMIT = 64
"""Most fill checks one round of the fill-verifier loop takes (``FillVerifier.run_batch``).
At 400 orders/s, 64 checks fall due every 160 ms, longer than a round (a receive, a read,
the broker checks, a commit, the settles) usually takes, so a round takes all that fell due
since the last one: its row read is one query, and its writes and settles fit in one group
commit and one Redis pipeline each (both batchers send up to 128 at once, which leaves room
for the placements under way meanwhile). The limit also bounds the checks - and so the
broker calls through the users' workers - that one process has under way at once."""


@runtime_checkable
class Stores(Protocol):
    """The lifecycle of an adapter set's connections."""

    async def open(self) -> None:
        """Connect; raises ``StoreUnavailable`` when a store cannot be reached."""

    async def ready(self) -> bool:
        """Whether every store answers now."""
        ...

    async def close(self) -> None:
        """Release every connection; the set is not used again."""


@attrs.frozen
class FillPolling:
    """How the fill-verifier loop asks for work: each receive waits up to ``wait_s``; after
    one that brought nothing the loop pauses ``idle_s`` before the next; after a round that
    took fewer checks than it could (no backlog), it pauses ``gather_s`` through the system's
    sleeper, so the checks falling due meanwhile are taken together in the next round."""

    wait_s: float
    idle_s: float
    gather_s: float = 0.0


@attrs.define
class System:
    """The parts of one process, by name, typed by their ports (tests of the memory set also
    reach the memory adapters' own helpers, such as ``audit.all()``)."""

    clock: Clock
    sleeper: Sleeper
    random: RandomSource
    settings: OrderSettings
    stores: Stores
    users: UserRepository
    sessions: SessionRepository
    api_keys: ApiKeyRepository
    allowed_ips: AllowedIpRepository
    accounts: TradingAccountRepository
    orders: OrderHistory
    audit: AuditLog
    replay: ReplayStore
    limiter: RateLimiter
    admission: WebhookAdmission
    throttle: AlertThrottle
    outbox: LoggingOutbox
    mailer: Mailer
    queue: OrderQueue
    directory: WorkerDirectory
    fill_tasks: FillTaskQueue
    exchange: PaperExchange
    simulation_exchange: PaperExchange
    events: SecurityEvents
    provisioning: Provisioning
    webhooks: WebhookIntake
    dashboard: DashboardOrders
    host: WorkerHost
    verifier: FillVerifier
    in_process_workers: bool
    fill_polling: FillPolling
    drains: Sequence[Callable[[], Awaitable[None]]] = ()
    """Mail still being sent when the process stops (alerts, reset mails), awaited on stop."""
    _workers_started: bool = False
    _verifier_task: asyncio.Task[None] | None = None

    async def start(self, *, workers: bool | None = None, verify_fills: bool = True) -> None:
        """Open the stores; with ``workers`` (default: whether this runtime runs its workers
        in process) start the worker host and, unless ``verify_fills`` is false (tests drive
        ``verifier.run_once`` themselves), the fill-verifier loop."""
        await self.stores.open()
        if self.in_process_workers if workers is None else workers:
            await self.host.start()
            self._workers_started = True
            if verify_fills:
                self._verifier_task = asyncio.create_task(self._verify_forever(), name="fills")

    @property
    def workers_running(self) -> bool:
        """Whether this process runs its worker host now: started, not stopped, and its
        fill-verifier loop (when started) still alive (it only ends when cancelled)."""
        verifier = self._verifier_task
        return self._workers_started and (verifier is None or not verifier.done())

    async def stop(self) -> None:
        """Stop the fill verifier and the workers, let the mail in flight go, close the
        stores."""
        if self._verifier_task is not None:
            self._verifier_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._verifier_task
            self._verifier_task = None
        if self._workers_started:
            await self.host.stop()
            self._workers_started = False
        await self.events.drain()
        for drain in self.drains:
            await drain()
        await self.stores.close()

    @contextlib.asynccontextmanager
    async def running(
        self, *, workers: bool | None = None, verify_fills: bool = True
    ) -> AsyncIterator[System]:
        """``start`` on entry, ``stop`` on exit."""
        await self.start(workers=workers, verify_fills=verify_fills)
        try:
            yield self
        finally:
            await self.stop()

    async def _verify_forever(self) -> None:
        while True:
            raise_if_cancelled()
            try:
                batch = await self.verifier.run_batch(FILL_BATCH_LIMIT, self.fill_polling.wait_s)
                if batch.failed:  # logged by run_batch; paced as a round that raised
                    await asyncio.sleep(FILL_RETRY_S)
                elif not batch.received:
                    await asyncio.sleep(self.fill_polling.idle_s)
                elif batch.received < FILL_BATCH_LIMIT and self.fill_polling.gather_s > 0:
                    await self.sleeper.sleep(self.fill_polling.gather_s)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("fill verification failed; retrying")
                await asyncio.sleep(FILL_RETRY_S)
