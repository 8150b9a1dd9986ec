"""The production runtime: Postgres for durable records, Redis for the queues and short-lived
protective state, API and worker hosts in separate processes.

``build_api_system`` composes what ``tradecore serve`` needs with ``DATABASE_URL`` and
``REDIS_URL`` set; it exposes the same attribute names as the embedded system, so the HTTP
service and its container are the same in both modes. ``build_worker_system`` composes what
``tradecore worker`` runs: the worker host (per-user workers under leases), the fill verifier,
and the paper broker with its books in Postgres. Connections are made lazily and opened by
``start()`` inside the event loop; ``stop()`` closes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
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
from tradecore_adapters.brokers.paper import PaperConditions, PaperExchange
from tradecore_adapters.brokers.persistent import PersistentPaperBrokerFactory
from tradecore_adapters.brokers.registry import PaperInstrumentDirectory
from tradecore_adapters.crypto.passwords import Argon2PasswordHasher
from tradecore_adapters.mail.outbox import LoggingOutbox
from tradecore_adapters.postgres import (
    Pool,
    PostgresAllowedIpRepository,
    PostgresApiKeyRepository,
    PostgresAuditLog,
    PostgresDocumentStore,
    PostgresOrderHistory,
    PostgresSessionRepository,
    PostgresTradingAccountRepository,
    PostgresUserRepository,
    make_pool,
)
from tradecore_adapters.redis import (
    RedisAlertThrottle,
    RedisConnections,
    RedisFillTaskQueue,
    RedisOrderQueue,
    RedisRateLimiter,
    RedisReplayStore,
    RedisWorkerDirectory,
    open_connections,
)
from tradecore_adapters.redis.protection import RedisWebhookAdmission
from tradecore_adapters.system import AsyncioSleeper, SecretsRandom, SystemClock
from tradecore_entrypoints.wiring import order_flows

log = logging.getLogger(__name__)

DATABASE_TIMEOUT_S = 5.0
# How long a request waits for a database connection: short, so that with Postgres down a
# webhook gets its 503 well inside TradingView's 3 s and the sender can resend.
CONNECTION_WAIT_S = 1.5
REDIS_TIMEOUT_S = 2.0
FILL_POLL_S = 5.0  # a receive waits for the next due check or a wake-up, not for this
FILL_RETRY_S = 0.5
# A push wakes an idle worker at once and the host's heartbeat keeps its lease, so this only
# bounds how often an idle worker looks at its request list and its idle clock: rarely, so
# thousands of idle workers cost (almost) no round trips.
WORKER_POLL_S = 30.0


@attrs.define
class Connections:
    """One process's pool and Redis clients."""

    pool: Pool
    redis: RedisConnections

    @classmethod
    def create(cls, database_url: str, redis_url: str, *, pool_size: int) -> Connections:
        pool = make_pool(
            database_url,
            min_size=1,
            max_size=pool_size,
            timeout_s=CONNECTION_WAIT_S,
            statement_timeout_s=DATABASE_TIMEOUT_S,
        )
        return cls(pool, open_connections(redis_url, socket_timeout_s=REDIS_TIMEOUT_S))

    async def open(self) -> None:
        """Open the pool (raises DatabaseUnavailable when Postgres cannot be reached) and
        check Redis (raises KeyValueStoreUnavailable)."""
        from tradecore_adapters.postgres.errors import database_errors

        with database_errors():
            await self.pool.open(wait=True, timeout=DATABASE_TIMEOUT_S)
        await self.redis.check()

    async def ready(self) -> bool:
        """True when both stores answer now (``/health/ready``)."""
        try:
            async with asyncio.timeout(DATABASE_TIMEOUT_S):
                async with self.pool.connection() as conn:
                    await conn.execute("SELECT 1")
                await self.redis.check()
        except Exception:
            return False
        return True

    async def close(self) -> None:
        await self.redis.aclose()
        await self.pool.close()


@attrs.define
class ProductionSystem:
    """The API process's parts; attribute names match ``EmbeddedSystem``."""

    clock: Clock
    sleeper: Sleeper
    random: RandomSource
    settings: OrderSettings
    connections: Connections
    users: PostgresUserRepository
    sessions: PostgresSessionRepository
    api_keys: PostgresApiKeyRepository
    allowed_ips: PostgresAllowedIpRepository
    accounts: PostgresTradingAccountRepository
    orders: PostgresOrderHistory
    audit: PostgresAuditLog
    documents: PostgresDocumentStore
    replay: RedisReplayStore
    limiter: RedisRateLimiter
    admission: RedisWebhookAdmission  # the webhook's replay claim and rate-limit hit in one
    throttle: RedisAlertThrottle
    outbox: Mailer
    mailer: Mailer
    queue: RedisOrderQueue
    directory: RedisWorkerDirectory
    fill_tasks: RedisFillTaskQueue
    exchange: PaperExchange
    simulation_exchange: PaperExchange
    events: SecurityEvents
    provisioning: Provisioning
    webhooks: WebhookIntake
    dashboard: DashboardOrders

    async def start(self, *, verify_fills: bool = True) -> None:
        """Open the connections (``verify_fills`` is accepted for symmetry with the embedded
        system: fill verification runs in the worker processes)."""
        await self.connections.open()

    async def stop(self) -> None:
        await self.events.drain()
        await self.queue.aclose()
        await self.fill_tasks.aclose()
        await self.connections.close()

    @contextlib.asynccontextmanager
    async def running(self, *, verify_fills: bool = True) -> AsyncIterator[ProductionSystem]:
        await self.start(verify_fills=verify_fills)
        try:
            yield self
        finally:
            await self.stop()


def build_api_system(
    database_url: str,
    redis_url: str,
    *,
    clock: Clock | None = None,
    sleeper: Sleeper | None = None,
    random: RandomSource | None = None,
    settings: OrderSettings | None = None,
    hasher: PasswordHasher | None = None,
    mailer: Mailer | None = None,
    pool_size: int = 10,
) -> ProductionSystem:
    """The API process on Postgres and Redis, not yet started."""
    clock = clock or SystemClock()
    sleeper = sleeper or AsyncioSleeper()
    random = random or SecretsRandom()
    settings = settings or OrderSettings()
    connections = Connections.create(database_url, redis_url, pool_size=pool_size)
    pool, commands = connections.pool, connections.redis.commands

    users = PostgresUserRepository(pool)
    accounts = PostgresTradingAccountRepository(pool)
    orders = PostgresOrderHistory(pool)
    audit = PostgresAuditLog(pool)
    allowed_ips = PostgresAllowedIpRepository(pool)
    replay = RedisReplayStore(commands)
    limiter = RedisRateLimiter(commands)
    admission = RedisWebhookAdmission(commands)
    throttle = RedisAlertThrottle(commands)
    outbox: Mailer = mailer or LoggingOutbox()
    queue = RedisOrderQueue(connections.redis)
    directory = RedisWorkerDirectory(connections.redis)
    exchange = PaperExchange()

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
        mailer=outbox,
        queue=queue,
        directory=directory,
        instruments=PaperInstrumentDirectory(exchange),
        hasher=hasher or Argon2PasswordHasher(),
        clock=clock,
        random=random,
        settings=settings,
    )
    return ProductionSystem(
        clock=clock,
        sleeper=sleeper,
        random=random,
        settings=settings,
        connections=connections,
        users=users,
        sessions=PostgresSessionRepository(pool),
        api_keys=PostgresApiKeyRepository(pool),
        allowed_ips=allowed_ips,
        accounts=accounts,
        orders=orders,
        audit=audit,
        documents=PostgresDocumentStore(pool),
        replay=replay,
        limiter=limiter,
        admission=admission,
        throttle=throttle,
        outbox=outbox,
        mailer=outbox,
        queue=queue,
        directory=directory,
        fill_tasks=RedisFillTaskQueue(commands),
        exchange=exchange,
        simulation_exchange=PaperExchange(),
        events=flows.events,
        provisioning=flows.provisioning,
        webhooks=flows.webhooks,
        dashboard=flows.dashboard,
    )


def host_identity() -> str:
    """This worker host's lease holder name: host, process and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{SecretsRandom().token_urlsafe(6)}"


@attrs.define
class WorkerSystem:
    """A worker host process: per-user workers and the fill verifier."""

    connections: Connections
    queue: RedisOrderQueue
    fill_tasks: RedisFillTaskQueue
    host: WorkerHost
    verifier: FillVerifier
    _verifier_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.connections.open()
        await self.host.start()
        self._verifier_task = asyncio.create_task(self._verify_forever(), name="fills")

    async def stop(self) -> None:
        if self._verifier_task is not None:
            self._verifier_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._verifier_task
        await self.host.stop()
        await self.queue.aclose()
        await self.fill_tasks.aclose()
        await self.connections.close()

    async def _verify_forever(self) -> None:
        while True:
            try:
                await self.verifier.run_once(FILL_POLL_S)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("fill verification failed; retrying")
                await asyncio.sleep(FILL_RETRY_S)


def build_worker_system(
    database_url: str,
    redis_url: str,
    *,
    host_settings: HostSettings | None = None,
    holder: str | None = None,
    clock: Clock | None = None,
    sleeper: Sleeper | None = None,
    conditions: PaperConditions | None = None,
    pool_size: int = 10,
) -> WorkerSystem:
    """A worker host on Postgres and Redis, not yet started."""
    clock = clock or SystemClock()
    sleeper = sleeper or AsyncioSleeper()
    connections = Connections.create(database_url, redis_url, pool_size=pool_size)
    orders = PostgresOrderHistory(connections.pool)
    documents = PostgresDocumentStore(connections.pool)
    fill_tasks = RedisFillTaskQueue(connections.redis.commands)
    brokers = PersistentPaperBrokerFactory(
        PaperExchange(), PaperExchange(), documents, clock, conditions=conditions, sleeper=sleeper
    )
    queue = RedisOrderQueue(connections.redis)
    directory = RedisWorkerDirectory(connections.redis)

    def make_worker(user_id: str) -> UserWorker:
        return UserWorker(user_id, orders, brokers, fill_tasks, clock, sleeper)

    settings = host_settings or HostSettings(poll_s=WORKER_POLL_S)
    host = WorkerHost(
        directory, queue, make_worker, clock, sleeper, settings, holder=holder or host_identity()
    )
    verifier = FillVerifier(fill_tasks, orders, host.check_order_status, clock)
    return WorkerSystem(connections, queue, fill_tasks, host, verifier)
