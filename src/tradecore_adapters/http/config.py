"""What the HTTP layer is told by the composition root: origins, proxies, cookies, limits.

The security headers are fixed here, with the exact values of the specification's table. The
Content-Security-Policy names every source it allows (the service itself, the TradingView chart
widget and the Cloudflare Turnstile bot challenge) and never a wildcard.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import attrs

from tradecore.netaddr import IPNetwork

TRADINGVIEW_SCRIPT_HOST = "https://s3.tradingview.com"
TRADINGVIEW_FRAME_HOSTS = ("https://s.tradingview.com", "https://www.tradingview-widget.com")
CHALLENGE_HOST = "https://challenges.cloudflare.com"

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        f"script-src 'self' {TRADINGVIEW_SCRIPT_HOST} {CHALLENGE_HOST}",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        f"frame-src {' '.join(TRADINGVIEW_FRAME_HOSTS)} {CHALLENGE_HOST}",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'self'",
    )
)

SECURITY_HEADERS: Mapping[str, str] = {
    "Strict-Transport-Security": "max-age=31536000; includeSubDomains; preload",
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "SAMEORIGIN",
    "X-XSS-Protection": "1; mode=block",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "unsafe-none",
    "Referrer-Policy": "strict-origin-when-cross-origin",
    "Permissions-Policy": "geolocation=(), microphone=(), camera=(), payment=()",
}

SERVER_HEADER = "tradecore"
"""Replaces aiohttp's ``Server: Python/x aiohttp/y``: no version is disclosed."""

CORS_ALLOWED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
CORS_ALLOWED_HEADERS = ("Authorization", "Content-Type", "X-CSRF-Token")
CORS_EXPOSED_HEADERS = ("Location", "Retry-After", "WWW-Authenticate")
CORS_MAX_AGE_S = 600

WEBHOOK_BODY_LIMIT = 16 * 1024
JSON_BODY_LIMIT = 64 * 1024
CLIENT_MAX_SIZE = 1024 * 1024

BODY_READ_TIMEOUT_S = 10.0
"""The whole request body must arrive within this time once a route starts reading it; a
client still sending after it gets 408 (``bodies.read_body``)."""
KEEPALIVE_TIMEOUT_S = 75.0
"""aiohttp closes a connection that has not completed a request's headers this long after it
opened, or after the previous answer (aiohttp has no separate header-read timeout; its own
default is 3630 s). Longer than a load balancer's usual idle timeout (60 s), so the balancer,
not the service, ends an idle keep-alive connection."""
CLIENT_CLOSED_REQUEST = 499
"""The status the access log shows for a request whose client left before the answer (nginx's
convention); no client ever receives it."""


@attrs.frozen
class HttpConfig:
    """Settings of the HTTP adapter.

    ``production`` turns on BrowserOnly. ``allowed_origins`` are full origins
    (``https://app.example.com``). ``cookie_domain`` None leaves the Domain attribute out
    (host-only cookies). ``public_base_url`` builds webhook URLs.
    """

    production: bool = False
    allowed_origins: frozenset[str] = frozenset()
    trusted_proxies: tuple[IPNetwork, ...] = ()
    cookie_domain: str | None = None
    access_ttl: timedelta = timedelta(minutes=30)
    refresh_ttl: timedelta = timedelta(days=30)
    public_base_url: str = "http://127.0.0.1:8080"
    terms_version: str = "1"
