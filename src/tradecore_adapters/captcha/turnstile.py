"""CaptchaVerifier on Cloudflare Turnstile's siteverify API.

One form-encoded POST of ``secret``, ``response`` (the client's token) and ``remoteip`` per
check. The verifier fails closed: a timeout, a connection error, a non-200 answer, a redirect,
an oversized or malformed body, or anything but ``"success": true`` is a failed challenge.
Neither the secret nor the token is ever logged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from urllib.parse import urlsplit

import aiohttp

from tradecore.netaddr import UNKNOWN_CLIENT_IP, normalize_ip

log = logging.getLogger(__name__)

SITEVERIFY_URL = "https://challenges.cloudflare.com/turnstile/v0/siteverify"
DEFAULT_TIMEOUT_S = 5.0
MAX_TOKEN_CHARS = 2048  # Turnstile's documented maximum
MAX_RESPONSE_BYTES = 64 * 1024
_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname in _LOOPBACK_HOSTS:
        return  # a local stand-in (tests); the secret never leaves the host
    raise ValueError("TURNSTILE_VERIFY_URL must be an https URL")


class TurnstileVerifier:
    """Verifies Turnstile tokens server-side.

    ``session`` is an open ``aiohttp.ClientSession`` owned by the caller, or a callable that
    returns it (so it can be created later, inside the running loop). ``timeout_s`` bounds each
    verification as a whole.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession | Callable[[], aiohttp.ClientSession],
        secret: str,
        *,
        verify_url: str = SITEVERIFY_URL,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if not isinstance(secret, str) or not secret:
            raise ValueError("TURNSTILE_SECRET must not be empty")
        if not timeout_s > 0:
            raise ValueError("timeout_s must be positive")
        _check_url(verify_url)
        self._session = session
        self._secret = secret
        self._url = verify_url
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    def __repr__(self) -> str:
        return f"TurnstileVerifier(verify_url={self._url!r}, secret=<redacted>)"

    def _client(self) -> aiohttp.ClientSession:
        if isinstance(self._session, aiohttp.ClientSession):
            return self._session
        return self._session()

    async def verify(self, token: str, client_ip: str) -> bool:
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
            return False
        form = {"secret": self._secret, "response": token}
        ip = normalize_ip(client_ip) if isinstance(client_ip, str) else None
        if ip is not None and ip != UNKNOWN_CLIENT_IP:
            form["remoteip"] = ip
        try:
            async with self._client().post(
                self._url, data=form, timeout=self._timeout, allow_redirects=False
            ) as response:
                if response.status != 200:
                    log.warning("bot challenge: siteverify answered HTTP %s", response.status)
                    return False
                body = await response.content.read(MAX_RESPONSE_BYTES + 1)
        except Exception as e:  # fail closed on anything: timeout, connection, closed session
            log.warning("bot challenge: siteverify unreachable (%s)", type(e).__name__)
            return False
        if len(body) > MAX_RESPONSE_BYTES:
            log.warning("bot challenge: siteverify answer too large")
            return False
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):
            log.warning("bot challenge: siteverify answer is not JSON")
            return False
        if not isinstance(answer, dict):
            return False
        if answer.get("success") is not True:
            codes = answer.get("error-codes")
            log.info("bot challenge refused: %s", codes if isinstance(codes, list) else "-")
            return False
        return True
