"""Every environment variable the service reads, parsed once into ``Settings``.

``VARIABLES`` is the table: one ``Variable`` per name, with the ``Settings`` field it sets, the
text an unset variable stands for, a one-line meaning and its parser (settings_parsers.py).
``Settings.from_env`` reads every row, then checks ``RULES``, the rules between variables.
Every refusal is a ``ConfigError`` with a one-line message that names the variable and never a
secret's value. docs/configuration.md lists the same table for operators;
tests/unit/test_configuration_doc.py fails when the two disagree.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Generic, TypeVar, cast

import attrs

from tradecore.limits import PlanCaps
from tradecore.netaddr import IPNetwork
from tradecore.services.execution.worker_host import (
    DEFAULT_MARK_TTL_S,
    DEFAULT_RECOVERY_GRACE_S,
    HostSettings,
)
from tradecore.services.identity.password_reset import ResetSettings
from tradecore.services.identity.settings import AuthSettings
from tradecore.services.orders.settings import OrderSettings
from tradecore_adapters.brokers.paper import PaperConditions
from tradecore_adapters.captcha.turnstile import SITEVERIFY_URL
from tradecore_adapters.http import HttpConfig
from tradecore_adapters.redis.keys import DEFAULT_SHARDS
from tradecore_entrypoints.logs import LogFormat, parse_log_format
from tradecore_entrypoints.settings_parsers import (
    count,
    database_url,
    encryption_key,
    flag,
    http_url,
    jwt_secret,
    mail_from,
    mark_ttl,
    non_negative,
    origins,
    paper_prices,
    plan_caps,
    positive,
    positive_integer,
    queue_shards,
    redis_url,
    runtime_mode,
    smtp_url,
    terms_version,
    text,
    trusted_proxies,
    user_agents,
    venue_endpoints,
)

T = TypeVar("T")

WORKER_POLL_S = 30.0
"""How often an idle worker looks at its request list and its idle clock. A push wakes it at
once and the host's heartbeat keeps its lease, so this is rare: thousands of idle workers
cost (almost) no wake-ups or round trips."""


class ConfigError(ValueError):
    """Bad configuration; the message is one line naming the variable."""


@attrs.frozen
class Variable(Generic[T]):
    """One environment variable: its ``name``, the ``Settings`` ``field`` it sets, the
    ``default`` text an unset variable stands for (None: no value), its one-line ``meaning``
    and ``parse(name, text)`` (settings_parsers.py).

    ``strip``: surrounding blanks are dropped first, so a blank value counts as unset.
    ``empty_is_unset``: an empty value counts as unset; when False it is parsed
    (``ALLOWED_ORIGINS=`` allows no origin at all).
    ``secret``: the value may instead be given in a file named by ``<name>_FILE``
    (``secret_text``), as container secrets are mounted.
    """

    name: str
    field: str
    default: str | None
    meaning: str
    parse: Callable[[str, str], T]
    strip: bool = False
    empty_is_unset: bool = True
    secret: bool = False

    def read(self, env: Mapping[str, str]) -> T | None:
        """The parsed value from ``env``; ConfigError with the parser's one-line reason."""
        raw = secret_text(self.name, env) if self.secret else env.get(self.name)
        if raw is not None and self.strip:
            raw = raw.strip()
        if raw is None or (raw == "" and self.empty_is_unset):
            raw = self.default
        if raw is None:
            return None
        try:
            return self.parse(self.name, raw)
        except ValueError as e:
            raise ConfigError(str(e)) from None


def secret_text(name: str, env: Mapping[str, str]) -> str | None:
    """A secret variable's text: ``env[name]``, or the content of the file ``env[name_FILE]``
    names with one trailing line break dropped (a Docker or Kubernetes secret). An empty
    variable counts as not given. ConfigError when both are given, or when the file cannot
    be read as UTF-8; the message names the variable and the path, never the content."""
    file_variable = f"{name}_FILE"
    path = env.get(file_variable) or None
    if path is None:
        return env.get(name)
    if env.get(name):
        raise ConfigError(f"set {name} or {file_variable}, not both")
    try:
        with open(path, encoding="utf-8", newline="") as secret_file:
            content = secret_file.read()
    except OSError as e:
        raise ConfigError(f"{file_variable}: cannot read {path} ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{file_variable}: {path} is not UTF-8 text") from None
    for line_break in ("\r\n", "\n"):
        if content.endswith(line_break):
            return content[: -len(line_break)]
    return content


DEFAULT_ALLOWED_ORIGINS = "http://localhost:5173"
DEFAULT_METRICS_HOST = "127.0.0.1"


def tcp_port(name: str, value: str) -> int:
    """A TCP port to listen on, 1 to 65535."""
    port = positive_integer(name, value)
    if port > 65535:
        raise ValueError(f"{name} must be a TCP port from 1 to 65535, got {value!r}")
    return port


VARIABLES: tuple[Variable[Any], ...] = (
    # runtime and stores
    Variable("TRADECORE_ENV", "production", "development",
             "development or production; production turns on BrowserOnly and requires the "
             "secrets", runtime_mode, strip=True),
    Variable("DATABASE_URL", "database_url", None,
             "postgresql:// URL of the durable store; with REDIS_URL, the production runtime",
             database_url, secret=True),
    Variable("REDIS_URL", "redis_url", None,
             "redis:// or rediss:// URL of the queues, leases and short-lived keys; "
             "redis+cluster:// or rediss+cluster:// with host:port nodes for a Redis Cluster",
             redis_url, secret=True),
    Variable("REDIS_QUEUE_SHARDS", "redis_queue_shards", str(DEFAULT_SHARDS),
             "shards of the shared Redis queues (worker-control, order-tasks), 1 to 256; "
             "the same in every process", queue_shards),
    # secrets
    Variable("JWT_SECRET", "jwt_secret", None,
             "HS256 key of the session tokens, at least 32 bytes, the same in every API process",
             jwt_secret, secret=True),
    Variable("ENCRYPTION_KEY", "encryption_key", None,
             "32 random bytes in URL-safe base64; encrypts broker credentials at rest",
             encryption_key, secret=True),
    # HTTP and cookies
    Variable("PUBLIC_BASE_URL", "public_base_url", None,
             "http(s) URL webhook and reset links start with; unset: the address served",
             http_url),
    Variable("TRUSTED_PROXIES", "trusted_proxies", "",
             "comma-separated addresses or CIDR blocks whose X-Forwarded-For is believed",
             trusted_proxies),
    Variable("ALLOWED_ORIGINS", "allowed_origins", DEFAULT_ALLOWED_ORIGINS,
             "comma-separated browser origins allowed by CORS; set but empty allows none",
             origins, empty_is_unset=False),
    Variable("COOKIE_DOMAIN", "cookie_domain", None,
             "Domain attribute of the session cookies; unset means the serving host only",
             text, strip=True),
    Variable("ACCESS_TOKEN_EXPIRE_MINUTES", "access_token_minutes", "30",
             "lifetime of the access token and its cookie, in minutes",
             positive_integer, strip=True),
    Variable("REFRESH_TOKEN_EXPIRE_DAYS", "refresh_token_days", "30",
             "lifetime of the refresh token and its cookie, in days",
             positive_integer, strip=True),
    # bot challenge
    Variable("CAPTCHA_ENABLED", "captcha_enabled", None,
             "bot challenge on login and registration; unset: on in production, off in "
             "development", flag, strip=True),
    Variable("TURNSTILE_SECRET", "turnstile_secret", None,
             "secret key of the Turnstile site, sent with each challenge check", text,
             secret=True),
    Variable("TURNSTILE_VERIFY_URL", "turnstile_verify_url", SITEVERIFY_URL,
             "where challenge tokens are verified", text),
    Variable("TURNSTILE_SITE_KEY", "turnstile_site_key", None,
             "public site key of the Turnstile widget on the dashboard's login and "
             "registration pages", text, strip=True),
    Variable("CAPTCHA_BYPASS_USER_AGENTS", "captcha_bypass_user_agents", "",
             "User-Agent values, separated by |, that skip the challenge (test clients)",
             user_agents),
    # mail
    Variable("SMTP_URL", "smtp_url", None,
             "smtp:// or smtps:// server for alerts and reset mails (?starttls=1); unset: "
             "mails are only logged", smtp_url, secret=True),
    Variable("MAIL_FROM", "mail_from", None,
             "sender address of every mail", mail_from, strip=True),
    # order flow waits and limits
    Variable("ORDER_RESPONSE_WAIT_S", "order_wait_s", "30",
             "how long a dashboard or API order waits for its result before answering 202",
             positive, strip=True),
    Variable("WEBHOOK_RESPONSE_WAIT_S", "webhook_wait_s", "2.5",
             "how long a webhook waits for its result before answering 202",
             positive, strip=True),
    Variable("RATE_LIMIT_PER_MINUTE", "rate_limit_per_minute", "60",
             "orders per user in any 60 s window", positive_integer, strip=True),
    Variable("PLAN_DAILY_ORDER_CAPS", "plan_caps", "free=100,pro=1000",
             "orders per user and day, one plan=count pair for every plan", plan_caps),
    Variable("TERMS_VERSION", "terms_version", "1",
             "the terms version a user must have accepted to trade (1 to 32 characters)",
             terms_version),
    Variable("WEBHOOK_OWNER_CACHE_SIZE", "webhook_owner_cache_size", "10000",
             "webhook owners (account, owner, allowed IPs) each API process caches; 0: none",
             count, strip=True),
    Variable("WEBHOOK_OWNER_CACHE_TTL_S", "webhook_owner_cache_ttl_s", "60",
             "the longest a cached webhook owner is served: a change stops a token, account "
             "or IP everywhere within it", positive, strip=True),
    # workers
    Variable("WORKER_START_TIMEOUT_S", "worker_start_timeout_s", "60",
             "how long an order waits for its user's worker to start before 503",
             positive, strip=True),
    Variable("WORKER_IDLE_TIMEOUT_S", "worker_idle_timeout_s", "43200",
             "a worker with no order for this long shuts down", positive, strip=True),
    Variable("WORKER_MARK_TTL_S", "worker_mark_ttl_s", f"{DEFAULT_MARK_TTL_S:g}",
             "time to live of a worker's lease, at least 3 s; renewed every sixth of it",
             mark_ttl, strip=True),
    Variable("QUEUED_ORDER_GRACE_S", "queued_order_grace_s", f"{DEFAULT_RECOVERY_GRACE_S:g}",
             "an order still queued this long after its intent was written (its API died "
             "before handing it over) is handed to a worker again", positive, strip=True),
    # paper broker
    Variable("PAPER_BROKER_LATENCY_MS", "paper_latency_ms", "0",
             "the paper broker waits this long before every call", non_negative, strip=True),
    Variable("PAPER_BROKER_DISCONNECT_EVERY", "paper_disconnect_every", "0",
             "the paper broker drops the connection on every N-th call; 0 never",
             count, strip=True),
    Variable("PAPER_PRICES", "paper_prices", "static",
             "where paper orders take their prices: static (the catalogue's) or "
             "ccxt:<venue> (that venue's public ticker, for the crypto perpetuals)",
             paper_prices, strip=True),
    # real venues
    Variable("BROKER_ENDPOINTS", "broker_endpoints", "",
             "venue=URL pairs, comma-separated: calls to that venue go to URL instead "
             "(a proxy, or a local venue emulator in tests)", venue_endpoints, strip=True),
    Variable("BROKER_TIMEOUT_MS", "broker_timeout_ms", "10000",
             "a call to a real venue that takes longer fails (the worker reconnects)",
             positive, strip=True),
    # logs
    Variable("LOG_FORMAT", "log_format", None,
             "json (one JSON object a line) or console (readable lines); unset: console when "
             "standard error is a terminal, json otherwise", parse_log_format, strip=True),
    # metrics
    Variable("METRICS_PORT", "metrics_port", None,
             "port of the operators' /metrics (and a worker host's /health/*); unset: off",
             tcp_port, strip=True),
    Variable("METRICS_HOST", "metrics_host", DEFAULT_METRICS_HOST,
             "address the metrics port listens on", text, strip=True),
)  # fmt: skip


@attrs.frozen
class Settings:
    """Everything read from the environment: one field per row of ``VARIABLES``; the
    defaults are what an empty environment gives."""

    production: bool = False
    database_url: str | None = attrs.field(default=None, repr=False)
    redis_url: str | None = attrs.field(default=None, repr=False)
    redis_queue_shards: int = DEFAULT_SHARDS
    jwt_secret: str | None = attrs.field(default=None, repr=False)
    encryption_key: str | None = attrs.field(default=None, repr=False)
    public_base_url: str | None = None
    trusted_proxies: tuple[IPNetwork, ...] = ()
    allowed_origins: frozenset[str] = frozenset({DEFAULT_ALLOWED_ORIGINS})
    cookie_domain: str | None = None
    access_token_minutes: int = 30
    refresh_token_days: int = 30
    captcha_enabled: bool = False
    turnstile_secret: str | None = attrs.field(default=None, repr=False)
    turnstile_verify_url: str = SITEVERIFY_URL
    turnstile_site_key: str | None = None
    captcha_bypass_user_agents: frozenset[str] = frozenset()
    smtp_url: str | None = attrs.field(default=None, repr=False)
    mail_from: str | None = None
    order_wait_s: float = 30.0
    webhook_wait_s: float = 2.5
    rate_limit_per_minute: int = 60
    plan_caps: str = "free=100,pro=1000"
    terms_version: str = "1"
    webhook_owner_cache_size: int = 10_000
    webhook_owner_cache_ttl_s: float = 60.0
    worker_start_timeout_s: float = 60.0
    worker_idle_timeout_s: float = 43_200.0
    worker_mark_ttl_s: float = DEFAULT_MARK_TTL_S
    queued_order_grace_s: float = DEFAULT_RECOVERY_GRACE_S
    paper_latency_ms: float = 0.0
    paper_disconnect_every: int = 0
    paper_prices: str = "static"
    broker_endpoints: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    broker_timeout_ms: float = 10_000.0
    log_format: LogFormat | None = None
    metrics_port: int | None = None
    metrics_host: str = DEFAULT_METRICS_HOST

    @property
    def runtime(self) -> str:
        """``embedded`` without DATABASE_URL and REDIS_URL, else ``redis`` (production)."""
        return "embedded" if self.database_url is None and self.redis_url is None else "redis"

    @property
    def secrets_required(self) -> bool:
        """In production or with DATABASE_URL, JWT_SECRET and ENCRYPTION_KEY must be set
        (the embedded default draws random ones per process)."""
        return self.production or self.database_url is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Parse every row of ``VARIABLES`` (``os.environ`` when ``env`` is None), then check
        ``RULES``. Raises ConfigError with a one-line reason: a value's own fault first, in
        table order, then the first broken rule."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {variable.field: variable.read(env) for variable in VARIABLES}
        if values["captcha_enabled"] is None:
            values["captcha_enabled"] = values["production"]
        settings = cls(**values)
        for rule in RULES:
            if rule.broken(settings):
                raise ConfigError(rule.message)
        return settings

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
            recovery_grace_s=self.queued_order_grace_s,
        )

    def venue_check_timeout_s(self) -> float:
        """How long the API's own venue calls (a credential check, a positions read) may take
        in all: a few of BROKER_TIMEOUT_MS, since each makes a few requests."""
        return 3 * self.broker_timeout_ms / 1000

    def paper_conditions(self) -> PaperConditions:
        return PaperConditions(
            latency_s=self.paper_latency_ms / 1000, disconnect_every=self.paper_disconnect_every
        )

    @property
    def paper_price_venue(self) -> str | None:
        """The ccxt venue whose ticker PAPER_PRICES names, None for the static prices."""
        kind, _, venue = self.paper_prices.partition(":")
        return venue if kind == "ccxt" else None

    def auth_settings(self) -> AuthSettings:
        return AuthSettings(
            access_ttl=timedelta(minutes=self.access_token_minutes),
            refresh_ttl=timedelta(days=self.refresh_token_days),
            captcha_enabled=self.captcha_enabled,
            captcha_bypass_user_agents=cast(Any, self.captcha_bypass_user_agents),
        )

    def reset_settings(self, base_url: str) -> ResetSettings:
        return ResetSettings(link_base=base_url)

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
            challenge_enabled=self.captcha_enabled,
            challenge_site_key=self.turnstile_site_key,
        )


@attrs.frozen
class Rule:
    """A rule between variables: ``from_env`` refuses settings for which ``broken`` is true,
    with ``message``."""

    message: str
    broken: Callable[[Settings], bool]


RULES: tuple[Rule, ...] = (
    Rule(
        "JWT_SECRET is required in production and with DATABASE_URL",
        lambda s: s.secrets_required and s.jwt_secret is None,
    ),
    Rule(
        "ENCRYPTION_KEY is required in production and with DATABASE_URL",
        lambda s: s.secrets_required and s.encryption_key is None,
    ),
    Rule(
        "ALLOWED_ORIGINS must name the dashboard's origin in production",
        lambda s: s.production and not s.allowed_origins,
    ),
    Rule(
        "TURNSTILE_SECRET is required when CAPTCHA_ENABLED is on",
        lambda s: s.captcha_enabled and s.turnstile_secret is None,
    ),
    Rule(
        "MAIL_FROM is required when SMTP_URL is set",
        lambda s: s.smtp_url is not None and s.mail_from is None,
    ),
)
"""Checked in this order after every value parsed. DATABASE_URL and REDIS_URL going together
is checked where a runtime is built (``migrate`` needs only DATABASE_URL)."""
