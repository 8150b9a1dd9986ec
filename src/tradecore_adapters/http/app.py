"""The aiohttp application factory.

``create_app`` wires the routes, the middleware chain in the specification's order, the
security-header hook and the given resources (opened and closed through ``cleanup_ctx``).
Serve it with ``runner_options()`` so the access log redacts webhook tokens.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from importlib import resources
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from tradecore_adapters.http.access_log import RedactingAccessLogger
from tradecore_adapters.http.config import CLIENT_MAX_SIZE, KEEPALIVE_TIMEOUT_S, HttpConfig
from tradecore_adapters.http.middlewares import MIDDLEWARES, security_headers
from tradecore_adapters.http.routes import (
    accounts,
    auth,
    operator,
    orders,
    pages,
    public,
    settings,
    system,
)
from tradecore_adapters.http.state import CONFIG, OPENAPI, SERVICES, Services
from tradecore_adapters.http.ui import setup_templates

CleanupContext = Callable[[web.Application], AsyncIterator[None]]


def openapi_document() -> bytes:
    """The hand-written OpenAPI 3.1 document shipped with this package (validated JSON)."""
    raw = resources.files("tradecore_adapters.http").joinpath("openapi.json").read_bytes()
    json.loads(raw)
    return raw


def create_app(
    services: Services,
    config: HttpConfig,
    *,
    cleanup: Sequence[CleanupContext] = (),
    outer_middlewares: Sequence[Middleware] = (),
) -> web.Application:
    """The HTTP service over ``services``. ``cleanup`` contexts run in order at startup (up
    to their ``yield``) and in reverse order at shutdown. ``outer_middlewares`` run around
    the whole chain (the metrics middleware: it must see the status the client gets)."""
    middlewares = (*outer_middlewares, *MIDDLEWARES)
    app = web.Application(middlewares=middlewares, client_max_size=CLIENT_MAX_SIZE)
    app[SERVICES] = services
    app[CONFIG] = config
    app[OPENAPI] = openapi_document()
    for module in (system, auth, accounts, orders, settings, operator, public, pages):
        app.add_routes(module.routes)
    setup_templates(app)
    app.on_response_prepare.append(security_headers)
    app.cleanup_ctx.extend(cleanup)
    return app


def runner_options() -> dict[str, Any]:
    """Keyword arguments for ``web.AppRunner`` (and aiohttp's ``TestServer``): the redacting
    access log, and the keep-alive timeout that also bounds the time to send a request's
    headers (``KEEPALIVE_TIMEOUT_S``)."""
    return {"access_log_class": RedactingAccessLogger, "keepalive_timeout": KEEPALIVE_TIMEOUT_S}
