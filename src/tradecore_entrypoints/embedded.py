"""The embedded runtime: the whole system in one process, on in-memory adapters.

``build_embedded()`` wires every port to its memory adapter, the paper broker, a logging mail
outbox, an in-process worker host and the fill verifier. It is what ``tradecore serve`` runs
with neither ``DATABASE_URL`` nor ``REDIS_URL`` set, what ``tradecore demo`` walks through,
and what the core's flow tests run against::

    system = build_embedded()
    async with system.running():
        user = await system.provisioning.create_user(
            "ada@example.com", "correct horse battery", plan=Plan.PRO, terms_version="1"
        )
        new = await system.provisioning.create_account(user, "Main", credentials_verified=True)
        outcome = await system.webhooks.handle(new.webhook_token, body, simulation=False,
                                               context=context)

Time and randomness are injectable so tests can drive the same wiring with a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import attrs

from tradecore.ports.identity import Mailer, PasswordHasher
from tradecore.ports.runtime import Clock, RandomSource, Sleeper
from tradecore.services.dashboard_order import DashboardOrders
from tradecore.services.fill_verifier import FillVerifier
from tradecore.services.provisioning import Provisioning
from tradecore.services.security_events import SecurityEvents
from tradecore.services.settings import OrderSettings
from tradecore.services.webhook_intake import WebhookIntake
from tradecore.services.worker import UserWorker
from tradecore.services.worker_host import HostSettings, WorkerHost
from tradecore_adapters.brokers.paper import PaperExchange
from tradecore_adapters.brokers.registry import PaperBrokerFactory, PaperInstrumentDirectory
from tradecore_adapters.crypto.passwords import Argon2PasswordHasher
from tradecore_adapters.mail.outbox import LoggingOutbox
from tradecore_adapters.memory.messaging import (
    MemoryFillTaskQueue,
    MemoryOrderQueue,
    MemoryWorkerDirectory,
)
from tradecore_adapters.memory.protection import (
    MemoryAlertThrottle,
    MemoryRateLimiter,
    MemoryReplayStore,
    MemoryWebhookAdmission,
)
from tradecore_adapters.memory.repositories import (
    MemoryAllowedIpRepository,
    MemoryApiKeyRepository,
    MemoryAuditLog,
    MemoryOrderHistory,
    MemorySessionRepository,
    MemoryTradingAccountRepository,
    MemoryUserRepository,
)
from tradecore_adapters.system import AsyncioSleeper, SecretsRandom, SystemClock
from tradecore_entrypoints.wiring import order_flows

FILL_POLL_S = 0.2


@attrs.define
class EmbeddedSystem:
    """Every part of the embedded runtime, reachable by name for tests and the demo."""

    clock: Clock
    sleeper: Sleeper
    random: RandomSource
    settings: OrderSettings
    users: MemoryUserRepository
    sessions: MemorySessionRepository
    api_keys: MemoryApiKeyRepository
    allowed_ips: MemoryAllowedIpRepository
    accounts: MemoryTradingAccountRepository
    orders: MemoryOrderHistory
    audit: MemoryAuditLog
    replay: MemoryReplayStore
    limiter: MemoryRateLimiter
    admission: MemoryWebhookAdmission  # the webhook's replay claim and rate-limit hit in one
    throttle: MemoryAlertThrottle
    outbox: LoggingOutbox
    mailer: Mailer  # what sends mail: ``outbox`` unless another mailer was given
    queue: MemoryOrderQueue
    directory: MemoryWorkerDirectory
    fill_tasks: MemoryFillTaskQueue
    exchange: PaperExchange
    simulation_exchange: PaperExchange
    events: SecurityEvents
    provisioning: Provisioning
    webhooks: WebhookIntake
    dashboard: DashboardOrders
    host: WorkerHost
    verifier: FillVerifier
    _verifier_task: asyncio.Task[None] | None = None

    async def start(self, *, verify_fills: bool = True) -> None:
        """Start the worker host and, unless told not to, the fill-verifier loop (tests drive
        ``verifier.run_once`` themselves)."""
        await self.host.start()
        if verify_fills and self._verifier_task is None:
            self._verifier_task = asyncio.create_task(self._verify_forever(), name="fills")

    async def stop(self) -> None:
        """Stop the fill verifier, the workers and the alerts in flight."""
        if self._verifier_task is not None:
            self._verifier_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._verifier_task
            self._verifier_task = None
        await self.host.stop()
        await self.events.drain()

    @contextlib.asynccontextmanager
    async def running(self, *, verify_fills: bool = True) -> AsyncIterator[EmbeddedSystem]:
        """Start on entry, stop on exit."""
        await self.start(verify_fills=verify_fills)
        try:
            yield self
        finally:
            await self.stop()

    async def _verify_forever(self) -> None:
        while True:
            if await self.verifier.run_once(0) is None:
                await asyncio.sleep(FILL_POLL_S)


def build_embedded(
    *,
    clock: Clock | None = None,
    sleeper: Sleeper | None = None,
    random: RandomSource | None = None,
    settings: OrderSettings | None = None,
    host_settings: HostSettings | None = None,
    hasher: PasswordHasher | None = None,
    mailer: Mailer | None = None,
) -> EmbeddedSystem:
    """The embedded system, not yet started (see ``EmbeddedSystem.running``). Mail goes to
    ``mailer``, or to the logging outbox without one."""
    clock = clock or SystemClock()
    sleeper = sleeper or AsyncioSleeper()
    random = random or SecretsRandom()
    settings = settings or OrderSettings()

    users = MemoryUserRepository()
    orders = MemoryOrderHistory()
    audit = MemoryAuditLog()
    allowed_ips = MemoryAllowedIpRepository()
    accounts = MemoryTradingAccountRepository(users, allowed_ips, orders)
    replay = MemoryReplayStore(clock)
    limiter = MemoryRateLimiter(clock)
    admission = MemoryWebhookAdmission(replay, limiter)
    throttle = MemoryAlertThrottle(clock)
    outbox = LoggingOutbox()
    directory = MemoryWorkerDirectory(clock)
    queue = MemoryOrderQueue(clock, directory)
    directory.attach_queue(queue)
    fill_tasks = MemoryFillTaskQueue(clock)
    exchange = PaperExchange()
    simulation_exchange = PaperExchange()
    brokers = PaperBrokerFactory(exchange, simulation_exchange, clock)

    mailer = mailer or outbox
    flows = order_flows(
        users=users,
        accounts=accounts,
        orders=orders,
        audit=audit,
        allowed_ips=allowed_ips,
        replay=replay,
        limiter=limiter,
        admission=admission,
        throttle=throttle,
        mailer=mailer,
        queue=queue,
        directory=directory,
        instruments=PaperInstrumentDirectory(exchange),
        hasher=hasher or Argon2PasswordHasher(),
        clock=clock,
        random=random,
        settings=settings,
    )

    def make_worker(user_id: str) -> UserWorker:
        return UserWorker(user_id, orders, brokers, fill_tasks, clock, sleeper)

    # The only host of its in-process directory, so a fixed holder name is unique there.
    host = WorkerHost(
        directory, queue, make_worker, clock, sleeper, host_settings, holder="embedded"
    )
    return EmbeddedSystem(
        clock=clock,
        sleeper=sleeper,
        random=random,
        settings=settings,
        users=users,
        sessions=MemorySessionRepository(),
        api_keys=MemoryApiKeyRepository(),
        allowed_ips=allowed_ips,
        accounts=accounts,
        orders=orders,
        audit=audit,
        replay=replay,
        limiter=limiter,
        admission=admission,
        throttle=throttle,
        outbox=outbox,
        mailer=mailer,
        queue=queue,
        directory=directory,
        fill_tasks=fill_tasks,
        exchange=exchange,
        simulation_exchange=simulation_exchange,
        events=flows.events,
        provisioning=flows.provisioning,
        webhooks=flows.webhooks,
        dashboard=flows.dashboard,
        host=host,
        verifier=FillVerifier(fill_tasks, orders, host.check_order_status, clock),
    )
