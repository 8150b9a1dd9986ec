"""The HTTP middleware that counts requests and order answers.

It runs outside every other middleware, so it sees the status the client gets (the error
middlewares have already turned exceptions into problem responses). Requests are labelled by
the route's template (``/trading/orders/{order_id}``), never by the raw path; a path no route
matches is ``unmatched``. The two order routes also count ``tradecore_orders_total`` from the
answer: 200 is ``executed`` (with the result's error code), 202 ``queued``, 4xx ``refused``
and 5xx ``failed`` (with the problem's code). It sets ``REQUEST_STARTED`` for the request, so
the order history's recorder can time the admission stage up to the durable intent.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from tradecore.orders import RejectionCode
from tradecore_adapters.metrics.recorders import REQUEST_STARTED
from tradecore_adapters.metrics.registry import ProcessMetrics, bounded, problem_code

UNMATCHED = "unmatched"
CLIENT_CLOSED = 499
"""Counted when the client went away before its answer (the nginx convention)."""
ORDER_ROUTES = {
    ("POST", "/webhook/{token}/order"): "webhook",
    ("POST", "/trading/order"): "dashboard",
}
_ERROR_CODES = frozenset(c.value for c in RejectionCode)


def route_template(request: web.Request) -> str:
    """The matched route's template, or ``unmatched``."""
    match_info = request.match_info
    if match_info.http_exception is not None:
        return UNMATCHED
    resource = match_info.route.resource
    return UNMATCHED if resource is None else resource.canonical


def _json_body(response: web.StreamResponse | None) -> dict[str, Any]:
    if not isinstance(response, web.Response) or not isinstance(response.body, bytes):
        return {}
    try:
        document = json.loads(response.body)
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}


def order_outcome(status: int, response: web.StreamResponse | None) -> tuple[str, str]:
    """(outcome, code) of an order route's answer."""
    body = _json_body(response)
    if status == 200:
        error = body.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        return "executed", bounded(code if isinstance(code, str) else None, _ERROR_CODES)
    if status == 202:
        return "queued", "none"
    outcome = "failed" if status >= 500 else "refused"
    return outcome, problem_code(body.get("code"), status)


def metrics_middleware(metrics: ProcessMetrics) -> Middleware:
    """The middleware recording into ``metrics`` (see the module docstring)."""

    @web.middleware
    async def record_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        token = REQUEST_STARTED.set(started)
        response: web.StreamResponse | None = None
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as e:
            status = e.status
            raise
        except asyncio.CancelledError:
            status = CLIENT_CLOSED
            raise
        finally:
            REQUEST_STARTED.reset(token)
            route = route_template(request)
            metrics.http_answered(route, request.method, status, time.perf_counter() - started)
            source = ORDER_ROUTES.get((request.method, route))
            if source is not None and status != CLIENT_CLOSED:
                metrics.order_answered(source, *order_outcome(status, response))

    return record_metrics
