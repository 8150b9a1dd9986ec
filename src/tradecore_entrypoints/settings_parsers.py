"""Parsers of environment values: ``parse(name, text) -> value``, one per kind of variable.

Each returns the typed value or raises ValueError with a one-line message that names the
variable (``name``) and never repeats a secret. ``settings.Variable`` calls them with the
variable's text, or with its default text when it is unset, and turns the ValueError into a
``ConfigError``.
"""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit

from tradecore.limits import PlanCaps
from tradecore.netaddr import IPNetwork, parse_trusted_proxies
from tradecore_adapters.brokers.ccxt_venue import DIALECTS
from tradecore_adapters.crypto.cipher import parse_key
from tradecore_adapters.crypto.tokens import MIN_SECRET_BYTES
from tradecore_adapters.mail.smtp import SmtpSettings
from tradecore_adapters.redis.client import cluster_nodes, is_cluster_url
from tradecore_adapters.redis.keys import MAX_SHARDS

MIN_MARK_TTL_S = 3.0
"""The shortest lease WORKER_MARK_TTL_S may set: the heartbeat renews every sixth of it, and
a renewal must come back well within that."""

STATIC_PRICES = "static"
"""PAPER_PRICES for the catalogue's fixed prices; ``ccxt:<venue>`` reads a venue's ticker."""

BYPASS_SEPARATOR = "|"
"""Separates CAPTCHA_BYPASS_USER_AGENTS entries (a User-Agent may hold commas)."""


def text(name: str, value: str) -> str:
    """Any text, as given."""
    return value


def runtime_mode(name: str, value: str) -> bool:
    """TRADECORE_ENV: ``development`` or ``production`` (any case); True for production."""
    mode = value.lower()
    if mode not in ("development", "production"):
        raise ValueError(f"{name} must be development or production, got {mode!r}")
    return mode == "production"


def flag(name: str, value: str) -> bool:
    """1/true/yes/on or 0/false/no/off, in any case."""
    raw = value.lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, got {raw!r}")


def _number(name: str, value: str, *, integer: bool) -> float:
    try:
        number = float(int(value)) if integer else float(value)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{name} must be {kind}, got {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise ValueError(f"{name} must be positive, got {value!r}")
    return number


def positive(name: str, value: str) -> float:
    """A finite number above zero."""
    return _number(name, value, integer=False)


def positive_integer(name: str, value: str) -> int:
    """A decimal integer above zero."""
    return int(_number(name, value, integer=True))


def non_negative(name: str, value: str) -> float:
    """A finite number, zero or above."""
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if not 0 <= number < float("inf"):
        raise ValueError(f"{name} must be zero or positive, got {value!r}")
    return number


def count(name: str, value: str) -> int:
    """A non-negative number, its fraction dropped (``2.5`` is 2)."""
    return int(non_negative(name, value))


def mark_ttl(name: str, value: str) -> float:
    """WORKER_MARK_TTL_S: a positive number of seconds, at least ``MIN_MARK_TTL_S``."""
    ttl_s = positive(name, value)
    if ttl_s < MIN_MARK_TTL_S:
        raise ValueError(f"{name} must be at least {MIN_MARK_TTL_S:g} s, got {ttl_s:g}")
    return ttl_s


def _split(value: str) -> SplitResult | None:
    try:
        return urlsplit(value)
    except ValueError:  # a malformed IPv6 host
        return None


def _scheme(value: str) -> str | None:
    parts = _split(value)
    return None if parts is None else parts.scheme


def database_url(name: str, value: str) -> str:
    """A ``postgresql://`` (or ``postgres://``) URL."""
    if _scheme(value) not in ("postgresql", "postgres"):
        raise ValueError(f"{name} must be a postgresql:// URL")
    return value


def redis_url(name: str, value: str) -> str:
    """A ``redis://`` or ``rediss://`` URL of one server, or a ``redis+cluster://`` or
    ``rediss+cluster://`` URL naming one or more ``host:port`` nodes of a Redis Cluster."""
    if is_cluster_url(value):
        try:
            cluster_nodes(value)
        except ValueError as e:  # says what is wrong without repeating the URL (a secret)
            raise ValueError(f"{name}: {e}") from None
        return value
    if _scheme(value) not in ("redis", "rediss"):
        raise ValueError(
            f"{name} must be a redis://, rediss://, redis+cluster:// or rediss+cluster:// URL"
        )
    return value


def queue_shards(name: str, value: str) -> int:
    """REDIS_QUEUE_SHARDS: a whole number from 1 to ``MAX_SHARDS``."""
    shards = positive_integer(name, value)
    if shards > MAX_SHARDS:
        raise ValueError(f"{name} must be from 1 to {MAX_SHARDS}, got {value!r}")
    return shards


def http_url(name: str, value: str) -> str:
    """An ``http://`` or ``https://`` URL with a host."""
    parts = _split(value)
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{name} must be an http(s) URL")
    return value


def jwt_secret(name: str, value: str) -> str:
    """At least ``MIN_SECRET_BYTES`` bytes in UTF-8."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:  # undecodable bytes in the environment
        raise ValueError(f"{name} must be UTF-8 text") from None
    if size < MIN_SECRET_BYTES:
        raise ValueError(f"{name} must be at least {MIN_SECRET_BYTES} bytes")
    return value


def encryption_key(name: str, value: str) -> str:
    """32 bytes in URL-safe base64 (``secrets.token_urlsafe(32)``); kept as text."""
    parse_key(value)  # its ValueError names ENCRYPTION_KEY, never the value
    return value


def trusted_proxies(name: str, value: str) -> tuple[IPNetwork, ...]:
    """Comma-separated addresses and CIDR blocks (no host bits set); blanks are skipped."""
    return parse_trusted_proxies(value)


def _origin(name: str, value: str) -> str:
    parts = _split(value)
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or "*" in value
    ):
        raise ValueError(f"{name}: {value!r} is not an origin like https://app.example.com")
    return f"{parts.scheme}://{parts.netloc}"


def origins(name: str, value: str) -> frozenset[str]:
    """Comma-separated origins (``scheme://host[:port]``, no path, no wildcard)."""
    return frozenset(_origin(name, item.strip()) for item in value.split(",") if item.strip())


def venue_endpoints(name: str, value: str) -> dict[str, str]:
    """Comma-separated ``venue=URL`` pairs (a venue id, an http(s) URL with a host)."""
    endpoints: dict[str, str] = {}
    for item in value.split(","):
        if not item.strip():
            continue
        venue, sep, url = item.partition("=")
        if not sep or not venue.strip().isidentifier():
            raise ValueError(f"{name} holds {item.strip()!r}, not a venue=URL pair")
        endpoints[venue.strip()] = http_url(name, url.strip())
    return endpoints


def paper_prices(name: str, value: str) -> str:
    """``static``, or ``ccxt:`` and a built-in ccxt venue (``DIALECTS``: ``binanceusdm``,
    ``binance``, ``bybit``), in any case; returned in lower case."""
    choice = value.lower()
    kind, sep, venue = choice.partition(":")
    if choice == STATIC_PRICES or (kind == "ccxt" and sep and venue in DIALECTS):
        return choice
    venues = ", ".join(f"ccxt:{venue}" for venue in DIALECTS)
    raise ValueError(f"{name} must be {STATIC_PRICES} or one of {venues}, got {value!r}")


def user_agents(name: str, value: str) -> frozenset[str]:
    """User-Agent values separated by ``BYPASS_SEPARATOR``; blanks are skipped."""
    return frozenset(ua.strip() for ua in value.split(BYPASS_SEPARATOR) if ua.strip())


def plan_caps(name: str, value: str) -> str:
    """``plan=count`` pairs, one per plan (``PlanCaps.parse``); kept as text."""
    try:
        PlanCaps.parse(value)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    return value


def terms_version(name: str, value: str) -> str:
    """1 to 32 characters once surrounding blanks are dropped."""
    version = value.strip()
    if not version or len(version) > 32:
        raise ValueError(f"{name} must be 1 to 32 characters")
    return version


def smtp_url(name: str, value: str) -> str:
    """``smtp://`` or ``smtps://`` with a host (``SmtpSettings.from_url``); kept as text."""
    SmtpSettings.from_url(value)  # SmtpConfigError, a ValueError naming SMTP_URL
    return value


def mail_from(name: str, value: str) -> str:
    """One e-mail address: an ``@`` and no control characters (no header injection)."""
    if "@" not in value or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{name} must be one e-mail address, like alerts@example.com")
    return value
