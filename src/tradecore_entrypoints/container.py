"""The composition root: settings from the environment and the dependency-injector containers.

Containers by concern:

* ``Core``: the settings and the runtime ports every part shares (clock, sleeper, randomness).
* ``EmbeddedGateways``: the embedded adapter set (in-memory stores and queues, the paper
  broker, a logging outbox, an in-process worker host) plus the identity adapters (Argon2id,
  JWT, Turnstile) and the HTTP client they use. The Redis/Postgres set arrives as a second
  gateways container with the same provider names; ``gateways_for`` is the one place that
  chooses.
* ``Services``: the core's use cases over those gateways, and the bundle the HTTP app takes.
* ``Application``: the three together and the aiohttp application.

``Settings.from_env`` refuses bad configuration with ``ConfigError`` and a one-line reason.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import timedelta
from decimal import Decimal
from typing import Any, cast
from urllib.parse import urlsplit

import aiohttp
import attrs
from aiohttp import web
from dependency_injector import containers, providers

from tradecore.accounts import TradingAccount
from tradecore.broker import BrokerFactory
from tradecore.limits import PlanCaps
from tradecore.netaddr import IPNetwork, parse_trusted_proxies
from tradecore.ports.identity import CaptchaVerifier, Mailer
from tradecore.services.account_security import AccountSecurity, AccountSettings
from tradecore.services.auth import Authenticator, AuthSettings
from tradecore.services.settings import OrderSettings
from tradecore.services.trading_accounts import TradingAccounts
from tradecore.services.worker_host import DEFAULT_MARK_TTL_S, HostSettings
from tradecore_adapters.brokers.paper import PaperConditions, PaperExchange
from tradecore_adapters.brokers.persistent import PersistentPaperBrokerFactory
from tradecore_adapters.brokers.registry import PaperBrokerFactory, PaperInstrumentDirectory
from tradecore_adapters.captcha import DisabledCaptcha
from tradecore_adapters.captcha.turnstile import SITEVERIFY_URL, TurnstileVerifier
from tradecore_adapters.crypto.cipher import AesGcmCipher, parse_key
from tradecore_adapters.crypto.passwords import Argon2PasswordHasher
from tradecore_adapters.crypto.tokens import MIN_SECRET_BYTES, JwtTokenCodec
from tradecore_adapters.crypto.transport import RsaTransportKey
from tradecore_adapters.http import HttpConfig, Services, create_app
from tradecore_adapters.mail.smtp import SmtpConfigError, SmtpMailer, SmtpSettings
from tradecore_adapters.memory.documents import MemoryDocumentStore
from tradecore_adapters.memory.resets import MemoryPasswordResetTokens
from tradecore_adapters.postgres import PostgresPasswordResetTokens
from tradecore_adapters.system import AsyncioSleeper, SecretsRandom, SystemClock
from tradecore_entrypoints.embedded import EmbeddedSystem, build_embedded
from tradecore_entrypoints.production import (
    WORKER_POLL_S,
    ProductionSystem,
    build_api_system,
)

log = logging.getLogger(__name__)

DEFAULT_ALLOWED_ORIGINS = "http://localhost:5173"
BYPASS_SEPARATOR = "|"


class ConfigError(ValueError):
    """Bad configuration; the message is one line naming the variable."""


# --- settings -------------------------------------------------------------------------------


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def _number(env: Mapping[str, str], name: str, default: float, *, integer: bool = False) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(int(raw)) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{name} must be {kind}, got {raw!r}") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{name} must be positive, got {raw!r}")
    return value


def _non_negative(env: Mapping[str, str], name: str) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if not 0 <= value < float("inf"):
        raise ConfigError(f"{name} must be zero or positive, got {raw!r}")
    return value


MIN_MARK_TTL_S = 3.0
"""The shortest lease WORKER_MARK_TTL_S may set: the heartbeat renews every sixth of it, and
a renewal must come back well within that."""


def _mark_ttl(env: Mapping[str, str]) -> float:
    """WORKER_MARK_TTL_S: the worker lease's time to live, in seconds (at least 3)."""
    ttl_s = _number(env, "WORKER_MARK_TTL_S", DEFAULT_MARK_TTL_S)
    if ttl_s < MIN_MARK_TTL_S:
        raise ConfigError(f"WORKER_MARK_TTL_S must be at least {MIN_MARK_TTL_S:g} s, got {ttl_s:g}")
    return ttl_s


def _origin(text: str) -> str:
    parts = urlsplit(text)
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or "*" in text
    ):
        raise ConfigError(
            f"ALLOWED_ORIGINS: {text!r} is not an origin like https://app.example.com"
        )
    return f"{parts.scheme}://{parts.netloc}"


def _secret_key(env: Mapping[str, str], required: bool) -> str | None:
    secret = env.get("JWT_SECRET") or None
    if secret is None:
        if required:
            raise ConfigError("JWT_SECRET is required in production and with DATABASE_URL")
        return None
    if len(secret.encode("utf-8")) < MIN_SECRET_BYTES:
        raise ConfigError(f"JWT_SECRET must be at least {MIN_SECRET_BYTES} bytes")
    return secret


def _encryption_key(env: Mapping[str, str], required: bool) -> str | None:
    key = env.get("ENCRYPTION_KEY") or None
    if key is None:
        if required:
            raise ConfigError("ENCRYPTION_KEY is required in production and with DATABASE_URL")
        return None
    try:
        parse_key(key)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return key


def _mail_settings(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """SMTP_URL (checked by parsing it) and MAIL_FROM, which SMTP_URL requires."""
    smtp_url = env.get("SMTP_URL") or None
    mail_from = (env.get("MAIL_FROM") or "").strip() or None
    if mail_from is not None and (
        "@" not in mail_from or any(ord(c) < 32 or ord(c) == 127 for c in mail_from)
    ):
        raise ConfigError("MAIL_FROM must be one e-mail address, like alerts@example.com")
    if smtp_url is None:
        return None, mail_from
    try:
        SmtpSettings.from_url(smtp_url)
    except SmtpConfigError as e:
        raise ConfigError(str(e)) from None
    if mail_from is None:
        raise ConfigError("MAIL_FROM is required when SMTP_URL is set")
    return smtp_url, mail_from


@attrs.frozen
class Settings:
    """Everything read from the environment (contract.md, "Configuration")."""

    production: bool = False
    database_url: str | None = attrs.field(default=None, repr=False)
    redis_url: str | None = attrs.field(default=None, repr=False)
    jwt_secret: str | None = attrs.field(default=None, repr=False)
    encryption_key: str | None = attrs.field(default=None, repr=False)
    public_base_url: str | None = None
    trusted_proxies: tuple[IPNetwork, ...] = ()
    allowed_origins: frozenset[str] = frozenset({DEFAULT_ALLOWED_ORIGINS})
    cookie_domain: str | None = None
    captcha_enabled: bool = False
    captcha_bypass_user_agents: frozenset[str] = frozenset()
    turnstile_secret: str | None = attrs.field(default=None, repr=False)
    turnstile_verify_url: str = SITEVERIFY_URL
    smtp_url: str | None = attrs.field(default=None, repr=False)
    mail_from: str | None = None
    access_token_minutes: int = 30
    refresh_token_days: int = 30
    order_wait_s: float = 30.0
    webhook_wait_s: float = 2.5
    worker_start_timeout_s: float = 60.0
    worker_idle_timeout_s: float = 43_200.0
    worker_mark_ttl_s: float = DEFAULT_MARK_TTL_S
    rate_limit_per_minute: int = 60
    plan_caps: str = "free=100,pro=1000"
    terms_version: str = "1"
    paper_latency_ms: float = 0.0
    paper_disconnect_every: int = 0

    @property
    def runtime(self) -> str:
        """``embedded`` without DATABASE_URL and REDIS_URL, else ``production``."""
        return "embedded" if self.database_url is None and self.redis_url is None else "redis"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Parse and check the environment; ConfigError with a one-line reason."""
        env = os.environ if env is None else env
        mode = env.get("TRADECORE_ENV", "development").strip().lower() or "development"
        if mode not in ("development", "production"):
            raise ConfigError(f"TRADECORE_ENV must be development or production, got {mode!r}")
        production = mode == "production"
        database_url = env.get("DATABASE_URL") or None
        redis_url = env.get("REDIS_URL") or None
        if database_url is not None and urlsplit(database_url).scheme not in (
            "postgresql",
            "postgres",
        ):
            raise ConfigError("DATABASE_URL must be a postgresql:// URL")
        if redis_url is not None and urlsplit(redis_url).scheme not in ("redis", "rediss"):
            raise ConfigError("REDIS_URL must be a redis:// or rediss:// URL")
        strict = production or database_url is not None
        jwt_key = _secret_key(env, strict)
        encryption_key = _encryption_key(env, strict)
        base_url = env.get("PUBLIC_BASE_URL") or None
        if base_url is not None:
            parts = urlsplit(base_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError("PUBLIC_BASE_URL must be an http(s) URL")
        try:
            proxies = parse_trusted_proxies(env.get("TRUSTED_PROXIES", ""))
        except ValueError as e:
            raise ConfigError(str(e)) from None
        origins_text = env.get("ALLOWED_ORIGINS", DEFAULT_ALLOWED_ORIGINS)
        origins = frozenset(_origin(o.strip()) for o in origins_text.split(",") if o.strip())
        if production and not origins:
            raise ConfigError("ALLOWED_ORIGINS must name the dashboard's origin in production")
        captcha = _flag(env, "CAPTCHA_ENABLED", production)
        turnstile_secret = env.get("TURNSTILE_SECRET") or None
        if captcha and turnstile_secret is None:
            raise ConfigError("TURNSTILE_SECRET is required when CAPTCHA_ENABLED is on")
        verify_url = env.get("TURNSTILE_VERIFY_URL") or SITEVERIFY_URL
        bypass = frozenset(
            ua.strip()
            for ua in env.get("CAPTCHA_BYPASS_USER_AGENTS", "").split(BYPASS_SEPARATOR)
            if ua.strip()
        )
        caps = env.get("PLAN_DAILY_ORDER_CAPS") or "free=100,pro=1000"
        try:
            PlanCaps.parse(caps)
        except ValueError as e:
            raise ConfigError(f"PLAN_DAILY_ORDER_CAPS: {e}") from None
        terms = (env.get("TERMS_VERSION") or "1").strip()
        if not terms or len(terms) > 32:
            raise ConfigError("TERMS_VERSION must be 1 to 32 characters")
        cookie_domain = (env.get("COOKIE_DOMAIN") or "").strip() or None
        smtp_url, mail_from = _mail_settings(env)
        return cls(
            production=production,
            database_url=database_url,
            redis_url=redis_url,
            jwt_secret=jwt_key,
            encryption_key=encryption_key,
            public_base_url=base_url,
            trusted_proxies=proxies,
            allowed_origins=origins,
            cookie_domain=cookie_domain,
            captcha_enabled=captcha,
            captcha_bypass_user_agents=bypass,
            turnstile_secret=turnstile_secret,
            turnstile_verify_url=verify_url,
            smtp_url=smtp_url,
            mail_from=mail_from,
            access_token_minutes=int(_number(env, "ACCESS_TOKEN_EXPIRE_MINUTES", 30, integer=True)),
            refresh_token_days=int(_number(env, "REFRESH_TOKEN_EXPIRE_DAYS", 30, integer=True)),
            order_wait_s=_number(env, "ORDER_RESPONSE_WAIT_S", 30.0),
            webhook_wait_s=_number(env, "WEBHOOK_RESPONSE_WAIT_S", 2.5),
            worker_start_timeout_s=_number(env, "WORKER_START_TIMEOUT_S", 60.0),
            worker_idle_timeout_s=_number(env, "WORKER_IDLE_TIMEOUT_S", 43_200.0),
            worker_mark_ttl_s=_mark_ttl(env),
            rate_limit_per_minute=int(_number(env, "RATE_LIMIT_PER_MINUTE", 60, integer=True)),
            plan_caps=caps,
            terms_version=terms,
            paper_latency_ms=_non_negative(env, "PAPER_BROKER_LATENCY_MS"),
            paper_disconnect_every=int(_non_negative(env, "PAPER_BROKER_DISCONNECT_EVERY")),
        )

    def base_url(self, host: str = "127.0.0.1", port: int = 8080) -> str:
        """PUBLIC_BASE_URL, or the address being served."""
        if self.public_base_url is not None:
            return self.public_base_url.rstrip("/")
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}"

    def order_settings(self) -> OrderSettings:
        return OrderSettings(
            plan_caps=PlanCaps.parse(self.plan_caps),
            rate_limit_per_minute=self.rate_limit_per_minute,
            terms_version=self.terms_version,
            webhook_wait_s=self.webhook_wait_s,
            order_wait_s=self.order_wait_s,
            worker_start_timeout_s=self.worker_start_timeout_s,
        )

    def host_settings(self) -> HostSettings:
        """A worker host's (embedded, or a ``tradecore worker`` process). A push wakes an idle
        worker at once (in Redis and in memory alike), so its blocking take only needs to look
        at the clock now and then: thousands of idle workers cost no wake-ups of their own."""
        return HostSettings(
            idle_timeout_s=self.worker_idle_timeout_s,
            mark_ttl_s=self.worker_mark_ttl_s,
            poll_s=WORKER_POLL_S,
        )

    def paper_conditions(self) -> PaperConditions:
        return PaperConditions(
            latency_s=self.paper_latency_ms / 1000, disconnect_every=self.paper_disconnect_every
        )

    def auth_settings(self) -> AuthSettings:
        return AuthSettings(
            access_ttl=timedelta(minutes=self.access_token_minutes),
            refresh_ttl=timedelta(days=self.refresh_token_days),
            captcha_enabled=self.captcha_enabled,
            captcha_bypass_user_agents=cast(Any, self.captcha_bypass_user_agents),
        )

    def account_settings(self, base_url: str) -> AccountSettings:
        return AccountSettings(terms_version=self.terms_version, reset_link_base=base_url)

    def http_config(self, base_url: str) -> HttpConfig:
        return HttpConfig(
            production=self.production,
            allowed_origins=self.allowed_origins,
            trusted_proxies=self.trusted_proxies,
            cookie_domain=self.cookie_domain,
            access_ttl=timedelta(minutes=self.access_token_minutes),
            refresh_ttl=timedelta(days=self.refresh_token_days),
            public_base_url=base_url,
            terms_version=self.terms_version,
        )


def jwt_secret(settings: Settings, random: SecretsRandom) -> str:
    """JWT_SECRET, or (embedded default only) a random one for this process."""
    return settings.jwt_secret or random.token_urlsafe(48)


# --- embedded gateway helpers -----------------------------------------------------------------


class HttpClient:
    """The shared outgoing ``aiohttp.ClientSession`` (Turnstile), opened inside the loop."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def __call__(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def make_mailer(settings: Settings) -> Mailer | None:
    """The SMTP mailer when SMTP_URL is set; None means the runtime's logging outbox."""
    if settings.smtp_url is None or settings.mail_from is None:
        return None
    return SmtpMailer(SmtpSettings.from_url(settings.smtp_url), settings.mail_from)


def make_captcha(settings: Settings, client: HttpClient) -> CaptchaVerifier:
    if not settings.captcha_enabled or settings.turnstile_secret is None:
        return DisabledCaptcha()
    return TurnstileVerifier(
        client, settings.turnstile_secret, verify_url=settings.turnstile_verify_url
    )


class PaperAccountBroker:
    """AccountBroker and CredentialVerifier on the paper exchange: a short-lived connection
    per call."""

    def __init__(self, brokers: BrokerFactory) -> None:
        self._brokers = brokers

    async def positions(self, account: TradingAccount) -> Mapping[str, Decimal]:
        broker = self._brokers.open(account.id, account.broker_name, simulation=False)
        await broker.connect()
        return await broker.positions()

    async def verify(self, account: TradingAccount, credentials: Mapping[str, str]) -> str | None:
        """CredentialVerifier: the paper broker needs no credentials and accepts any."""
        try:
            broker = self._brokers.open(account.id, account.broker_name, simulation=False)
            await broker.connect()
        except Exception as e:
            return f"The broker refused the connection ({type(e).__name__})"
        return None


def embedded_brokers(system: EmbeddedSystem) -> BrokerFactory:
    """The embedded system's paper exchanges, read by the API for positions and checks."""
    return PaperBrokerFactory(system.exchange, system.simulation_exchange, system.clock)


def production_brokers(system: ProductionSystem) -> BrokerFactory:
    """Paper books as the worker hosts keep them in Postgres, read by the API."""
    return PersistentPaperBrokerFactory(
        PaperExchange(), PaperExchange(), system.documents, system.clock
    )


class EmbeddedReadiness:
    """In-memory stores always answer."""

    async def ready(self) -> bool:
        return True


def make_cipher(settings: Settings) -> AesGcmCipher:
    """AES-256-GCM for broker credentials at rest under ENCRYPTION_KEY, or (embedded default
    only; ``Settings`` requires the key otherwise) a random key for this process."""
    if settings.encryption_key is None:
        return AesGcmCipher.generate()
    return AesGcmCipher.from_urlsafe_b64(settings.encryption_key)


# --- containers -------------------------------------------------------------------------------


class Core(containers.DeclarativeContainer):
    """Settings and the runtime ports."""

    settings = providers.Dependency(instance_of=Settings)
    base_url = providers.Object("http://127.0.0.1:8080")
    clock = providers.Singleton(SystemClock)
    sleeper = providers.Singleton(AsyncioSleeper)
    random = providers.Singleton(SecretsRandom)
    order_settings = providers.Singleton(Settings.order_settings, settings)
    host_settings = providers.Singleton(Settings.host_settings, settings)
    auth_settings = providers.Singleton(Settings.auth_settings, settings)
    account_settings = providers.Singleton(Settings.account_settings, settings, base_url)
    http_config = providers.Singleton(Settings.http_config, settings, base_url)


class EmbeddedGateways(containers.DeclarativeContainer):
    """The embedded adapter set (memory stores, paper broker, logging outbox or SMTP with
    SMTP_URL, in-process workers) and the identity adapters."""

    core = providers.DependenciesContainer()
    hasher = providers.Singleton(Argon2PasswordHasher)
    mailer = providers.Singleton(make_mailer, core.settings)
    system = providers.Singleton(
        build_embedded,
        clock=core.clock,
        sleeper=core.sleeper,
        random=core.random,
        settings=core.order_settings,
        host_settings=core.host_settings,
        hasher=hasher,
        mailer=mailer,
    )
    resets = providers.Singleton(MemoryPasswordResetTokens)
    http_client = providers.Singleton(HttpClient)
    captcha = providers.Singleton(make_captcha, core.settings, http_client)
    codec = providers.Singleton(
        JwtTokenCodec, providers.Callable(jwt_secret, core.settings, core.random), clock=core.clock
    )
    brokers = providers.Singleton(PaperAccountBroker, providers.Callable(embedded_brokers, system))
    readiness = providers.Singleton(EmbeddedReadiness)
    cipher = providers.Singleton(make_cipher, core.settings)
    key_store = providers.Singleton(MemoryDocumentStore)
    transport_key = providers.Singleton(RsaTransportKey, key_store, cipher)


class ProductionGateways(containers.DeclarativeContainer):
    """The Postgres and Redis adapter set of an API process (workers run in `tradecore
    worker` processes); the same provider names as ``EmbeddedGateways``."""

    core = providers.DependenciesContainer()
    hasher = providers.Singleton(Argon2PasswordHasher)
    mailer = providers.Singleton(make_mailer, core.settings)
    system = providers.Singleton(
        build_api_system,
        core.settings.provided.database_url,
        core.settings.provided.redis_url,
        clock=core.clock,
        sleeper=core.sleeper,
        random=core.random,
        settings=core.order_settings,
        hasher=hasher,
        mailer=mailer,
    )
    resets = providers.Singleton(
        PostgresPasswordResetTokens, system.provided.connections.provided.pool
    )
    http_client = providers.Singleton(HttpClient)
    captcha = providers.Singleton(make_captcha, core.settings, http_client)
    codec = providers.Singleton(
        JwtTokenCodec, providers.Callable(jwt_secret, core.settings, core.random), clock=core.clock
    )
    brokers = providers.Singleton(
        PaperAccountBroker, providers.Callable(production_brokers, system)
    )
    readiness = system.provided.connections
    cipher = providers.Singleton(make_cipher, core.settings)
    key_store = system.provided.documents
    transport_key = providers.Singleton(RsaTransportKey, key_store, cipher)


class ServiceSet(containers.DeclarativeContainer):
    """The use cases over the gateways, and the HTTP layer's bundle of them."""

    core = providers.DependenciesContainer()
    gateways = providers.DependenciesContainer()

    auth = providers.Singleton(
        Authenticator,
        gateways.system.provided.users,
        gateways.system.provided.sessions,
        gateways.system.provided.api_keys,
        gateways.hasher,
        gateways.codec,
        gateways.captcha,
        gateways.system.provided.events,
        core.clock,
        core.random,
        core.auth_settings,
        limiter=gateways.system.provided.limiter,
    )
    account_security = providers.Singleton(
        AccountSecurity,
        gateways.system.provided.users,
        gateways.system.provided.sessions,
        gateways.system.provided.api_keys,
        gateways.system.provided.allowed_ips,
        gateways.resets,
        gateways.hasher,
        gateways.captcha,
        gateways.system.provided.mailer,
        gateways.system.provided.events,
        core.clock,
        core.random,
        core.auth_settings,
        core.account_settings,
        reset_throttle=gateways.system.provided.throttle,
    )
    instruments = providers.Singleton(PaperInstrumentDirectory, gateways.system.provided.exchange)
    trading_accounts = providers.Singleton(
        TradingAccounts,
        gateways.system.provided.accounts,
        gateways.system.provided.provisioning,
        gateways.cipher,
        gateways.transport_key,
        gateways.brokers,
        instruments,
        gateways.system.provided.events,
    )
    http = providers.Singleton(
        Services,
        auth=auth,
        account_security=account_security,
        webhooks=gateways.system.provided.webhooks,
        dashboard=gateways.system.provided.dashboard,
        provisioning=gateways.system.provided.provisioning,
        events=gateways.system.provided.events,
        accounts=gateways.system.provided.accounts,
        orders=gateways.system.provided.orders,
        audit=gateways.system.provided.audit,
        instruments=instruments,
        brokers=gateways.brokers,
        readiness=gateways.readiness,
        clock=core.clock,
        trading_accounts=trading_accounts,
        transport_key=gateways.transport_key,
    )


def gateways_for(settings: Settings) -> type[containers.DeclarativeContainer]:
    """The adapter set for the configured runtime: memory without DATABASE_URL and
    REDIS_URL, Postgres and Redis with both (one without the other is refused)."""
    if settings.runtime == "embedded":
        return EmbeddedGateways
    if settings.database_url is None or settings.redis_url is None:
        raise ConfigError("DATABASE_URL and REDIS_URL go together: set both or neither")
    return ProductionGateways


class Application(containers.DeclarativeContainer):
    """Everything, wired."""

    settings = providers.Dependency(instance_of=Settings)
    core = providers.Container(Core, settings=settings)
    gateways = providers.Container(EmbeddedGateways, core=core)
    services = providers.Container(ServiceSet, core=core, gateways=gateways)


def build_container(settings: Settings, *, base_url: str | None = None) -> Application:
    """The application container for ``settings`` (raises ConfigError for a runtime this
    build cannot run). Override providers (``container.core.clock.override(...)``) before
    the first use."""
    gateways = gateways_for(settings)
    container = Application(settings=settings)
    if gateways is not EmbeddedGateways:
        container.gateways.override(providers.Container(gateways, core=container.core))
    container.core.base_url.override(providers.Object(base_url or settings.base_url()))
    if settings.smtp_url is None and settings.production:
        log.warning("SMTP_URL is not set: security alerts and reset mails are only logged")
    return container


def embedded_system(container: Application) -> EmbeddedSystem:
    """The runtime's parts (the embedded system, or the production system with the same
    attribute names)."""
    system: EmbeddedSystem = container.gateways.system()
    return system


def make_app(container: Application) -> web.Application:
    """The aiohttp application, with the runtime started and stopped by its cleanup_ctx."""
    services: Services = container.services.http()
    system = embedded_system(container)
    client: HttpClient = container.gateways.http_client()
    account_security: AccountSecurity = container.services.account_security()

    async def runtime(_: web.Application) -> AsyncIterator[None]:
        async with system.running():
            yield
            await account_security.drain()

    async def http_client(_: web.Application) -> AsyncIterator[None]:
        yield
        await client.close()

    cleanup: list[Callable[[web.Application], AsyncIterator[None]]] = [http_client, runtime]
    return create_app(services, container.core.http_config(), cleanup=cleanup)
