"""An access log that never holds a webhook token, a query string, a cookie or a header value.

One line per request: client IP (through the trusted proxies), method, path with the webhook
token redacted, status, response size and duration.
"""

from __future__ import annotations

import logging

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

from tradecore_adapters.http.state import CLIENT_IP, redact_path


class RedactingAccessLogger(AbstractAccessLogger):
    """Access logger for ``AppRunner(access_log_class=...)``; the format is fixed."""

    @property
    def enabled(self) -> bool:
        """Lines are logged at INFO: below that level (``tradecore serve`` runs at WARNING
        unless ``--log-level`` says otherwise) aiohttp skips the logger and the timing of each
        request altogether. aiohttp reads this once per connection."""
        return self.logger.isEnabledFor(logging.INFO)

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        client = request.get(CLIENT_IP) or request.remote or "-"
        self.logger.info(
            '%s "%s %s" %s %s %.1fms',
            client,
            request.method,
            redact_path(request.path),
            response.status,
            response.body_length,
            time * 1000,
        )
