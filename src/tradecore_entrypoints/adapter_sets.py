"""The adapter sets: every port of the core bound to one technology.

``AdapterSet`` declares the provider names a set must fill; ``MemoryAdapters`` (the embedded
default: in-memory stores and queues, paper exchanges in memory, in-process workers) and
``PostgresRedisAdapters`` (durable records in Postgres, queues and short-lived protective
state in Redis, paper books in Postgres, workers in ``tradecore worker`` processes) fill
exactly those names, so the services container is the same over either. ``SharedAdapters``
holds the adapters that do not depend on the store technology (password hashing, tokens,
the bot challenge, mail, the credential cipher and transport key).

A new adapter of an existing port goes into the set that uses it; a new port gets a
``Dependency`` in ``AdapterSet`` and a provider in both sets (``tests/unit/test_containers.py``
fails until both have it).
"""

from __future__ import annotations

from typing import Any

from dependency_injector import containers, providers

from tradecore.fills import CHECK_GATHER_S
from tradecore.ports.broker import BrokerFactory, InstrumentDirectory
from tradecore.ports.deployment import SchemaLedger
from tradecore.ports.documents import DocumentStore
from tradecore.ports.identity import CaptchaVerifier, Mailer
from tradecore.ports.messaging import FillTaskQueue, OrderQueue, WorkerDirectory
from tradecore.ports.prices import PriceSource
from tradecore.ports.protection import (
    AlertThrottle,
    DailyOrderCounter,
    RateLimiter,
    ReplayStore,
    WebhookAdmission,
)
from tradecore.ports.repositories import (
    AllowedIpRepository,
    ApiKeyRepository,
    AuditLog,
    OrderHistory,
    SessionRepository,
    TradingAccountRepository,
    UserRepository,
)
from tradecore.ports.resets import PasswordResetTokens
from tradecore.ports.runtime import Clock, RandomSource
from tradecore_adapters.brokers.alpaca_venue import AlpacaVenue
from tradecore_adapters.brokers.ccxt_venue import DIALECTS, CcxtVenue
from tradecore_adapters.brokers.paper import PaperExchange
from tradecore_adapters.brokers.persistent import PersistentPaperBrokerFactory
from tradecore_adapters.brokers.prices import CcxtTickerPrices, StaticPrices
from tradecore_adapters.brokers.registry import PaperBrokerFactory, PaperInstrumentDirectory
from tradecore_adapters.brokers.venues import (
    VenueBrokerFactory,
    VenueConnector,
    VenueInstrumentDirectory,
)
from tradecore_adapters.captcha import DisabledCaptcha
from tradecore_adapters.captcha.client_session import SharedClientSession
from tradecore_adapters.captcha.turnstile import TurnstileVerifier
from tradecore_adapters.crypto.cipher import AesGcmCipher
from tradecore_adapters.crypto.passwords import Argon2PasswordHasher
from tradecore_adapters.crypto.tokens import JwtTokenCodec
from tradecore_adapters.crypto.transport import RsaTransportKey
from tradecore_adapters.mail.outbox import LoggingOutbox
from tradecore_adapters.mail.smtp import SmtpMailer, SmtpSettings
from tradecore_adapters.memory.documents import MemoryDocumentStore
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_adapters.memory.order_queue import MemoryOrderQueue
from tradecore_adapters.memory.protection import (
    MemoryAlertThrottle,
    MemoryDailyOrderCounter,
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
from tradecore_adapters.memory.resets import MemoryPasswordResetTokens
from tradecore_adapters.memory.schema_ledger import MemorySchemaLedger
from tradecore_adapters.memory.stores import InProcessStores
from tradecore_adapters.memory.worker_directory import MemoryWorkerDirectory
from tradecore_adapters.owner_cache import AnnouncingAllowedIps, AnnouncingUsers
from tradecore_adapters.postgres import (
    PostgresAllowedIpRepository,
    PostgresApiKeyRepository,
    PostgresAuditLog,
    PostgresDocumentStore,
    PostgresOrderHistory,
    PostgresPasswordResetTokens,
    PostgresSessionRepository,
    PostgresUserRepository,
)
from tradecore_adapters.postgres.schema_ledger import PostgresSchemaLedger
from tradecore_adapters.redis import (
    RedisAlertThrottle,
    RedisDailyOrderCounter,
    RedisFillTaskQueue,
    RedisOrderQueue,
    RedisRateLimiter,
    RedisReplayStore,
    RedisWebhookAdmission,
    RedisWorkerDirectory,
)
from tradecore_entrypoints.connections import Connections, closed_with, host_identity
from tradecore_entrypoints.settings import Settings
from tradecore_entrypoints.system import FillPolling, Stores
from tradecore_entrypoints.webhook_owners import cached_accounts

EMBEDDED_HOLDER = "embedded"
"""The in-process host is the only one of its in-process directory: a fixed name is unique."""
FILL_POLLING_MEMORY = FillPolling(wait_s=0.0, idle_s=0.2)
"""In process, a receive only looks at the heap and the loop looks again after 0.2 s of
nothing: a waiting receive wakes far more often (docs/decisions.md, "System, the running
process")."""
FILL_POLLING_REDIS = FillPolling(wait_s=5.0, idle_s=0.0, gather_s=CHECK_GATHER_S)
"""On Redis a receive waits for the next due check or a wake-up, up to 5 s, and a round
without a backlog is followed by a pause of ``CHECK_GATHER_S``: without it every check woke
the loop on its own, and each wake-up looks at all 16 shards of the queue (two looks and 33
scripts per order at 50 orders/s; docs/performance.md)."""


def port(kind: Any) -> providers.Dependency[Any]:
    """A provider the adapter set must fill with an instance of ``kind`` (checked when it is
    first provided: the ports are runtime-checkable protocols)."""
    return providers.Dependency(instance_of=kind)


class AdapterSet(containers.DeclarativeContainer):
    """The provider names every adapter set fills, one per port (and the few values that
    differ by runtime). ``core`` is the ``Core`` container (settings, clock, randomness)."""

    core = providers.DependenciesContainer()
    stores: providers.Provider[Stores] = port(
        Stores
    )  # open / ready / close of this set's connections
    users: providers.Provider[UserRepository] = port(UserRepository)
    sessions: providers.Provider[SessionRepository] = port(SessionRepository)
    api_keys: providers.Provider[ApiKeyRepository] = port(ApiKeyRepository)
    allowed_ips: providers.Provider[AllowedIpRepository] = port(AllowedIpRepository)
    accounts: providers.Provider[TradingAccountRepository] = port(TradingAccountRepository)
    orders: providers.Provider[OrderHistory] = port(OrderHistory)
    audit: providers.Provider[AuditLog] = port(AuditLog)
    resets: providers.Provider[PasswordResetTokens] = port(PasswordResetTokens)
    documents: providers.Provider[DocumentStore] = port(DocumentStore)
    schema: providers.Provider[SchemaLedger] = port(SchemaLedger)
    replay: providers.Provider[ReplayStore] = port(ReplayStore)
    limiter: providers.Provider[RateLimiter] = port(RateLimiter)
    daily: providers.Provider[DailyOrderCounter] = port(DailyOrderCounter)
    admission: providers.Provider[WebhookAdmission] = port(WebhookAdmission)
    throttle: providers.Provider[AlertThrottle] = port(AlertThrottle)
    queue: providers.Provider[OrderQueue] = port(OrderQueue)
    directory: providers.Provider[WorkerDirectory] = port(WorkerDirectory)
    fill_tasks: providers.Provider[FillTaskQueue] = port(FillTaskQueue)
    exchange: providers.Provider[PaperExchange] = port(PaperExchange)
    simulation_exchange: providers.Provider[PaperExchange] = port(PaperExchange)
    paper_prices: providers.Provider[PriceSource] = port(
        PriceSource
    )  # PAPER_PRICES: where both paper exchanges take each new order's price
    paper_brokers: providers.Provider[BrokerFactory] = port(
        BrokerFactory
    )  # the paper broker the workers trade through
    api_paper_brokers: providers.Provider[BrokerFactory] = port(
        BrokerFactory
    )  # the paper broker for the API's positions and credential checks
    paper_instruments: providers.Provider[InstrumentDirectory] = port(InstrumentDirectory)
    worker_holder: providers.Provider[str] = port(str)
    in_process_workers: providers.Provider[bool] = port(bool)
    fill_polling: providers.Provider[FillPolling] = port(FillPolling)


def _memory_queue(clock: Clock, directory: MemoryWorkerDirectory) -> MemoryOrderQueue:
    """The memory order queue, linked back to its directory (whose ``retire`` checks it)."""
    queue = MemoryOrderQueue(clock, directory)
    directory.attach_queue(queue)
    return queue


def make_paper_prices(settings: Settings) -> PriceSource:
    """PAPER_PRICES: the catalogue's fixed prices, or a ccxt venue's public ticker (at the
    venue's BROKER_ENDPOINTS entry when there is one, with BROKER_TIMEOUT_MS)."""
    venue = settings.paper_price_venue
    if venue is None:
        return StaticPrices()
    return CcxtTickerPrices(
        venue,
        endpoint=settings.broker_endpoints.get(venue),
        timeout_ms=int(settings.broker_timeout_ms),
    )


class MemoryAdapters(AdapterSet):
    """Everything in this process's memory; gone when it stops."""

    stores = providers.Singleton(InProcessStores)
    users = providers.Singleton(MemoryUserRepository)
    sessions = providers.Singleton(MemorySessionRepository)
    api_keys = providers.Singleton(MemoryApiKeyRepository)
    allowed_ips = providers.Singleton(MemoryAllowedIpRepository)
    orders = providers.Singleton(MemoryOrderHistory)
    accounts = providers.Singleton(MemoryTradingAccountRepository, users, allowed_ips, orders)
    audit = providers.Singleton(MemoryAuditLog)
    resets = providers.Singleton(MemoryPasswordResetTokens)
    documents = providers.Singleton(MemoryDocumentStore)
    schema = providers.Singleton(MemorySchemaLedger)
    replay = providers.Singleton(MemoryReplayStore, AdapterSet.core.clock)
    limiter = providers.Singleton(MemoryRateLimiter, AdapterSet.core.clock)
    daily = providers.Singleton(MemoryDailyOrderCounter, AdapterSet.core.clock)
    admission = providers.Singleton(MemoryWebhookAdmission, replay, limiter, daily)
    throttle = providers.Singleton(MemoryAlertThrottle, AdapterSet.core.clock)
    directory = providers.Singleton(MemoryWorkerDirectory, AdapterSet.core.clock)
    queue = providers.Singleton(_memory_queue, AdapterSet.core.clock, directory)
    fill_tasks = providers.Singleton(MemoryFillTaskQueue, AdapterSet.core.clock)
    exchange = providers.Singleton(PaperExchange)
    simulation_exchange = providers.Singleton(PaperExchange)
    paper_prices = providers.Singleton(make_paper_prices, AdapterSet.core.settings)
    paper_brokers = providers.Singleton(
        PaperBrokerFactory,
        exchange,
        simulation_exchange,
        AdapterSet.core.clock,
        conditions=AdapterSet.core.paper_conditions,
        sleeper=AdapterSet.core.sleeper,
        prices=paper_prices,
    )
    # its own provider (over the same exchanges): a container override maps providers by
    # name, and one provider under two names would take the override of the last one
    api_paper_brokers = providers.Singleton(
        PaperBrokerFactory,
        exchange,
        simulation_exchange,
        AdapterSet.core.clock,
        prices=paper_prices,
    )
    paper_instruments = providers.Singleton(PaperInstrumentDirectory, exchange)
    worker_holder = providers.Object(EMBEDDED_HOLDER)
    in_process_workers = providers.Object(True)
    fill_polling = providers.Object(FILL_POLLING_MEMORY)


class PostgresRedisAdapters(AdapterSet):
    """Durable records in Postgres, queues and protective state in Redis; the API and the
    worker hosts are separate processes over the same stores. (Only ``AdapterSet``'s names
    may be declared here: the container swaps whole sets by name.)"""

    stores = providers.Singleton(
        Connections.create,
        AdapterSet.core.settings.provided.database_url,
        AdapterSet.core.settings.provided.redis_url,
        queue_shards=AdapterSet.core.settings.provided.redis_queue_shards,
    )
    # the webhook owner lookup is cached per process; every write of what it returns is
    # announced to the other processes (webhook_owners.py)
    accounts = providers.Singleton(cached_accounts, stores, AdapterSet.core.settings)
    users = providers.Singleton(
        AnnouncingUsers,
        providers.Factory(PostgresUserRepository, stores.provided.pool),
        accounts.provided.announcer,
    )
    sessions = providers.Singleton(PostgresSessionRepository, stores.provided.pool)
    api_keys = providers.Singleton(PostgresApiKeyRepository, stores.provided.pool)
    allowed_ips = providers.Singleton(
        AnnouncingAllowedIps,
        providers.Factory(PostgresAllowedIpRepository, stores.provided.pool),
        accounts.provided.announcer,
    )
    orders = providers.Singleton(PostgresOrderHistory, stores.provided.pool)
    audit = providers.Singleton(PostgresAuditLog, stores.provided.pool)
    resets = providers.Singleton(PostgresPasswordResetTokens, stores.provided.pool)
    documents = providers.Singleton(PostgresDocumentStore, stores.provided.pool)
    schema = providers.Singleton(PostgresSchemaLedger, stores.provided.pool)
    replay = providers.Singleton(RedisReplayStore, stores.provided.redis.commands)
    limiter = providers.Singleton(RedisRateLimiter, stores.provided.redis.commands)
    daily = providers.Singleton(RedisDailyOrderCounter, stores.provided.redis.commands)
    admission = providers.Singleton(RedisWebhookAdmission, stores.provided.redis.commands)
    throttle = providers.Singleton(RedisAlertThrottle, stores.provided.redis.commands)
    queue = providers.Singleton(
        closed_with, stores, providers.Factory(RedisOrderQueue, stores.provided.redis)
    )
    directory = providers.Singleton(
        closed_with, stores, providers.Factory(RedisWorkerDirectory, stores.provided.redis)
    )
    fill_tasks = providers.Singleton(
        closed_with,
        stores,
        providers.Factory(
            RedisFillTaskQueue,
            stores.provided.redis.commands,
            shards=stores.provided.redis.queue_shards,
        ),
    )
    exchange = providers.Singleton(PaperExchange)
    simulation_exchange = providers.Singleton(PaperExchange)
    paper_prices = providers.Singleton(make_paper_prices, AdapterSet.core.settings)
    paper_brokers = providers.Singleton(
        PersistentPaperBrokerFactory,
        exchange,
        simulation_exchange,
        documents,
        AdapterSet.core.clock,
        conditions=AdapterSet.core.paper_conditions,
        sleeper=AdapterSet.core.sleeper,
        prices=paper_prices,
        # a placement's book commits with the order's outcome (one commit fewer per order)
        with_order=orders,
    )
    # The API reads the books the workers keep, without the simulated latency and faults
    # (PAPER_BROKER_*) that are there to test the workers.
    api_paper_brokers = providers.Singleton(
        PersistentPaperBrokerFactory,
        exchange,
        simulation_exchange,
        documents,
        AdapterSet.core.clock,
        prices=paper_prices,
    )
    paper_instruments = providers.Singleton(PaperInstrumentDirectory, exchange)
    worker_holder = providers.Singleton(host_identity)
    in_process_workers = providers.Object(False)
    fill_polling = providers.Object(FILL_POLLING_REDIS)


def make_mailer(settings: Settings, outbox: LoggingOutbox) -> Mailer:
    """SMTP when SMTP_URL is set, else the outbox that logs each mail."""
    if settings.smtp_url is None or settings.mail_from is None:
        return outbox
    return SmtpMailer(SmtpSettings.from_url(settings.smtp_url), settings.mail_from)


def make_captcha(settings: Settings, session: SharedClientSession) -> CaptchaVerifier:
    """Turnstile when CAPTCHA_ENABLED is on, else a verifier that lets every token pass."""
    if not settings.captcha_enabled or settings.turnstile_secret is None:
        return DisabledCaptcha()
    return TurnstileVerifier(
        session, settings.turnstile_secret, verify_url=settings.turnstile_verify_url
    )


def make_cipher(settings: Settings) -> AesGcmCipher:
    """AES-256-GCM for broker credentials at rest under ENCRYPTION_KEY, or (the embedded
    default only: the settings require the key otherwise) a random key for this process."""
    if settings.encryption_key is None:
        return AesGcmCipher.generate()
    return AesGcmCipher.from_urlsafe_b64(settings.encryption_key)


def make_venues(settings: Settings) -> dict[str, VenueConnector]:
    """The real venues by broker name: the ccxt ones and Alpaca, each pointed at its
    BROKER_ENDPOINTS entry when there is one, with BROKER_TIMEOUT_MS."""
    endpoints = settings.broker_endpoints
    timeout_ms = int(settings.broker_timeout_ms)
    venues: dict[str, VenueConnector] = {
        name: CcxtVenue(dialect, endpoint=endpoints.get(name), timeout_ms=timeout_ms)
        for name, dialect in DIALECTS.items()
    }
    venues["alpaca"] = AlpacaVenue(endpoint=endpoints.get("alpaca"), timeout_s=timeout_ms / 1000)
    return venues


def jwt_secret(settings: Settings, random: RandomSource) -> str:
    """JWT_SECRET, or (the embedded default only) a random one for this process."""
    return settings.jwt_secret or random.token_urlsafe(48)


class SharedAdapters(containers.DeclarativeContainer):
    """The adapters both sets share: they hold no data of their own (the transport key keeps
    its key pair in the set's document store)."""

    core = providers.DependenciesContainer()
    adapters = providers.DependenciesContainer()

    hasher = providers.Singleton(Argon2PasswordHasher)
    codec = providers.Singleton(
        JwtTokenCodec, providers.Callable(jwt_secret, core.settings, core.random), clock=core.clock
    )
    client_session = providers.Singleton(SharedClientSession)
    captcha = providers.Singleton(make_captcha, core.settings, client_session)
    outbox = providers.Singleton(LoggingOutbox)
    mailer = providers.Singleton(make_mailer, core.settings, outbox)
    cipher = providers.Singleton(make_cipher, core.settings)
    transport_key = providers.Singleton(RsaTransportKey, adapters.documents, cipher)
    venues = providers.Singleton(make_venues, core.settings)
    brokers = providers.Singleton(VenueBrokerFactory, adapters.paper_brokers, venues)
    api_brokers = providers.Singleton(VenueBrokerFactory, adapters.api_paper_brokers, venues)
    instruments = providers.Singleton(VenueInstrumentDirectory, adapters.paper_instruments, venues)
