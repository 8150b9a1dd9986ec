"""The operators' port: ``/metrics`` in the Prometheus text format and, on a worker host,
``/health/live`` and ``/health/ready``.

It is a small aiohttp server of its own, bound to METRICS_HOST:METRICS_PORT (127.0.0.1 unless
an operator says otherwise), apart from the public API: nothing on it is reachable through
the edge, and the public app has no metrics route to protect.

* ``/metrics``: ``before_scrape`` runs first (the gauges read the stores then), then the
  registry is rendered in the format the scraper's ``Accept`` asks for (the Prometheus text
  format 0.0.4 by default, 1.0.0 or OpenMetrics when asked).
* ``/health/live``: 200 while the process's event loop answers (this handler runs on it).
* ``/health/ready``: 200 when ``readiness`` says so (on a worker host: the worker-host loop
  runs and the stores answer), else 503; the body says which part is not ready.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

Readiness = Callable[[], Awaitable[Mapping[str, bool]]]
"""Each part's readiness by name (``{"workers": True, "stores": False}``)."""


async def _nothing() -> None:
    return None


class MetricsServer:
    """Serves ``registry`` (and the health checks when ``readiness`` is given)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        before_scrape: Callable[[], Awaitable[None]] = _nothing,
        readiness: Readiness | None = None,
    ) -> None:
        self._registry = registry
        self._before_scrape = before_scrape
        self._readiness = readiness
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        if self._readiness is not None:
            app.router.add_get("/health/live", self._live)
            app.router.add_get("/health/ready", self._ready)
        return app

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host``:``port`` (0: a free port); returns the port bound."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family)
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()
        self.port = int(sock.getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, request: web.Request) -> web.Response:
        await self._before_scrape()
        # the format the scraper asks for (OpenMetrics, or the text format's versions)
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        response = web.Response(body=encode(self._registry))
        response.headers["Content-Type"] = content_type
        return response

    async def _live(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _ready(self, _: web.Request) -> web.Response:
        assert self._readiness is not None
        parts = dict(await self._readiness())
        ready = all(parts.values())
        body = {"status": "ready" if ready else "not ready", "checks": parts}
        return web.json_response(body, status=200 if ready else 503)
