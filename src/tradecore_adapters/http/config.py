"""What the HTTP layer is told by the composition root: origins, proxies, cookies, limits.

The security headers are fixed here, with the exact values of the specification's table. The
Content-Security-Policy names every source it allows (the service itself, the TradingView chart
widget and, while the bot challenge is on, Cloudflare Turnstile) and never a wildcard.
``HttpConfig.security_headers`` are the headers of one service: the challenge host appears in
its policy only when that service's challenge is on.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import attrs

from tradecore.netaddr import IPNetwork

TRADINGVIEW_SCRIPT_HOST = "https://s3.tradingview.com"
TRADINGVIEW_FRAME_HOSTS = ("https://s.tradingview.com", "https://www.tradingview-widget.com")
CHALLENGE_HOST = "https://challenges.cloudflare.com"
CHALLENGE_SCRIPT_URL = f"{CHALLENGE_HOST}/turnstile/v0/api.js"
"""The Turnstile widget's script (implicit rendering: it fills every ``.cf-turnstile``)."""


def content_security_policy(*, challenge: bool) -> str:
    """The policy; ``challenge`` adds the Turnstile host to ``script-src`` and ``frame-src``
    (its script renders the widget in a frame) and changes nothing else."""
    challenge_source = f" {CHALLENGE_HOST}" if challenge else ""
    return "; ".join(
        (
            "default-src 'self'",
            f"script-src 'self' {TRADINGVIEW_SCRIPT_HOST}{challenge_source}",
            "style-src 'self'",
            "img-src 'self' data:",
            "font-src 'self'",
            "connect-src 'self'",
            f"frame-src {' '.join(TRADINGVIEW_FRAME_HOSTS)}{challenge_source}",
            "object-src 'none'",
            "base-uri 'self'",
            "form-action 'self'",
            "frame-ancestors 'self'",
        )
    )


CONTENT_SECURITY_POLICY = content_security_policy(challenge=True)
"""The policy with the bot challenge on, production's default."""

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

SECURITY_HEADERS_WITHOUT_CHALLENGE: Mapping[str, str] = {
    **SECURITY_HEADERS,
    "Content-Security-Policy": content_security_policy(challenge=False),
}
"""The same headers for a service whose bot challenge is off: no Turnstile host in the policy."""

SERVER_HEADER = "tradecore"
"""Replaces aiohttp's ``Server: Python/x aiohttp/y``: no version is disclosed."""

CORS_ALLOWED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
CORS_ALLOWED_HEADERS = ("Authorization", "Content-Type", "X-CSRF-Token")
CORS_EXPOSED_HEADERS = ("Location", "Retry-After", "WWW-Authenticate", "X-Request-ID")
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
    (host-only cookies). ``public_base_url`` builds webhook URLs. ``challenge_enabled``: login
    and registration need a solved bot challenge; the dashboard shows the Turnstile widget
    for ``challenge_site_key`` (the site's public key; None: no widget can be shown).
    """

    production: bool = False
    allowed_origins: frozenset[str] = frozenset()
    trusted_proxies: tuple[IPNetwork, ...] = ()
    cookie_domain: str | None = None
    access_ttl: timedelta = timedelta(minutes=30)
    refresh_ttl: timedelta = timedelta(days=30)
    public_base_url: str = "http://127.0.0.1:8080"
    terms_version: str = "1"
    challenge_enabled: bool = False
    challenge_site_key: str | None = None

    @property
    def security_headers(self) -> Mapping[str, str]:
        """``SECURITY_HEADERS`` with this service's policy: the challenge host only while
        the challenge is on (both variants are built once, at import)."""
        return SECURITY_HEADERS if self.challenge_enabled else SECURITY_HEADERS_WITHOUT_CHALLENGE
