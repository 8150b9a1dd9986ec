"""An access log that never holds a webhook token, a query string, a cookie or a header value.

One line per request: client IP (through the trusted proxies), method, path with the webhook
token redacted, status, response size and duration. The same values travel as the record's
own fields (``client_ip``, ``method``, ``path``, ``status``, ``size``, ``duration_ms``), so a
structured log keeps them apart; the request id and the user, account and order ids come with
every line of the request (``tradecore_adapters.http.middlewares.request_ids``).
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
        path = redact_path(request.path)
        duration_ms = round(time * 1000, 1)
        self.logger.info(
            '%s "%s %s" %s %s %.1fms',
            client,
            request.method,
            path,
            response.status,
            response.body_length,
            duration_ms,
            extra={
                "client_ip": client,
                "method": request.method,
                "path": path,
                "status": response.status,
                "size": response.body_length,
                "duration_ms": duration_ms,
            },
        )
