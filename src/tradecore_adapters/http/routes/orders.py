"""Order endpoints: the webhook, dashboard orders, and the order history.

* ``POST /webhook/{token}/order``: JSON in ``application/json`` or ``text/plain`` (TradingView
  sends the latter when it does not recognise the message as JSON), at most 16 KiB,
  ``?simulation=true``. The four layers and the checks run in the core (``WebhookIntake``).
* ``POST /trading/order``: session (+ CSRF) or API key; the webhook's vocabulary.
* ``GET /trading/orders/{id}`` and ``GET /trading/orders`` (newest first, cursor paginated).

Outcomes: 200 OrderResult, 202 ``{order_id, request_id, status: "queued", poll}`` with a
``Location`` header, or a problem response with the core's status.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from tradecore.audit import AuditAction
from tradecore.orders import OrderHistoryRecord
from tradecore.services.orders.dashboard_order import DashboardOrder
from tradecore.services.orders.outcomes import Accepted, OrderOutcome, Queued
from tradecore.services.vocabulary import Rejected
from tradecore.webhooks.canonical import as_utc
from tradecore.webhooks.payload import PayloadInvalid, parse_webhook_body
from tradecore_adapters.http import views
from tradecore_adapters.http.bodies import parse_json_object, read_body
from tradecore_adapters.http.config import JSON_BODY_LIMIT, WEBHOOK_BODY_LIMIT
from tradecore_adapters.http.principal import audit_refusal, authenticate
from tradecore_adapters.http.problems import Problem, fail, rejected_response
from tradecore_adapters.http.state import SERVICES, request_context

WEBHOOK_CONTENT_TYPES = frozenset({"application/json", "text/plain"})
DEFAULT_PAGE = 50
MAX_PAGE = 200
_MAX_SCAN = 5000
_ONE_TICK = timedelta(microseconds=1)

routes = web.RouteTableDef()


def simulation_flag(request: web.Request) -> bool:
    """``?simulation=true`` (also ``1``); ``false``/``0``/absent is a real order; else 400."""
    values = request.query.getall("simulation", [])
    if not values:
        return False
    if len(values) > 1:
        raise fail(400, "invalid_request", "simulation is given more than once")
    value = values[0].strip().lower()
    if value in ("true", "1"):
        return True
    if value in ("false", "0", ""):
        return False
    raise fail(400, "invalid_request", "simulation must be true or false")


def outcome_response(outcome: OrderOutcome) -> web.Response:
    if isinstance(outcome, Accepted):
        return views.json_response(views.order_result(outcome.result))
    if isinstance(outcome, Queued):
        return views.json_response(
            views.queued(outcome), status=202, headers={"Location": outcome.poll}
        )
    return rejected_response(outcome)


@routes.post("/webhook/{token}/order")
async def webhook_order(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    content_type = request.headers.get("Content-Type")
    if content_type is not None and request.content_type not in WEBHOOK_CONTENT_TYPES:
        raise await audit_refusal(
            request,
            AuditAction.WEBHOOK_PAYLOAD_INVALID,
            Rejected(415, "unsupported_media_type", "Send JSON as application/json or text/plain"),
        )
    simulation = simulation_flag(request)
    # An oversized body reaches the parser truncated, which refuses it (400, audited).
    body = await read_body(request, WEBHOOK_BODY_LIMIT, truncate=True)
    outcome = await services.webhooks.handle(
        request.match_info["token"], body, simulation=simulation, context=request_context(request)
    )
    return outcome_response(outcome)


def _dashboard_order(document: dict[str, Any], body: bytes) -> DashboardOrder | str:
    """The order of a ``POST /trading/order`` body, or why it is invalid."""
    account_id = document.get("trading_account_id")
    if not isinstance(account_id, str) or not 1 <= len(account_id) <= 100:
        return "trading_account_id is required and must be a string"
    return checked_order(account_id, body)


def checked_order(account_id: str, body: bytes) -> DashboardOrder | str:
    """The order for ``account_id`` whose ``action``, ``symbol``, ``quantity`` and
    ``order_type`` are in the JSON ``body``, checked by the webhook parser's strict rules
    (the API's and the dashboard form's one way), or why it is invalid."""
    payload = parse_webhook_body(body, simulation=True)
    if isinstance(payload, PayloadInvalid):
        return "Invalid order: " + "; ".join(payload.errors)
    return DashboardOrder(
        trading_account_id=account_id,
        symbol=payload.symbol,
        action=payload.action,
        quantity=payload.quantity,
        order_type=payload.order_type,
    )


@routes.post("/trading/order")
async def dashboard_order(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    context = request_context(request)
    try:
        principal = await authenticate(request)
    except Problem as refused:
        if refused.rejected.status == 401:
            await services.events.record(
                AuditAction.DASHBOARD_ORDER,
                context,
                user_id=None,
                success=False,
                error_message=refused.rejected.detail,
            )
        raise
    simulation = simulation_flag(request)
    if request.content_type != "application/json":
        raise await audit_refusal(
            request,
            AuditAction.DASHBOARD_ORDER,
            Rejected(415, "unsupported_media_type", "Send the body as application/json"),
            user_id=principal.user_id,
        )
    try:
        body = await read_body(request, JSON_BODY_LIMIT)
        document = parse_json_object(body)
    except Problem as e:
        raise await audit_refusal(
            request, AuditAction.DASHBOARD_ORDER, e.rejected, user_id=principal.user_id
        ) from None
    order = _dashboard_order(document, body)
    if isinstance(order, str):
        raise await audit_refusal(
            request,
            AuditAction.DASHBOARD_ORDER,
            Rejected(400, "invalid_order", order),
            user_id=principal.user_id,
        )
    outcome = await services.dashboard.place(
        principal.user, order, simulation=simulation, context=context
    )
    return outcome_response(outcome)


async def _admit_read(request: web.Request, user_id: str) -> None:
    """The per-user history read limit (``HistoryReads``): a 429 Problem when spent."""
    refused = await request.app[SERVICES].history_reads.admit(user_id)
    if refused is not None:
        raise Problem(refused)


@routes.get("/trading/orders/{order_id}")
async def get_order(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    await _admit_read(request, principal.user_id)
    row = await request.app[SERVICES].orders.get(request.match_info["order_id"])
    if row is None or row.user_id != principal.user_id:
        raise fail(404, "not_found", "Order not found")
    return views.json_response(views.history_item(row))


def encode_cursor(row: OrderHistoryRecord) -> str:
    text = f"{as_utc(row.created_at).isoformat()}|{row.id}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[datetime, str]:
    """A cursor from ``next_before``, or an ISO 8601 time (everything strictly before it)."""
    invalid = fail(400, "invalid_request", "before must be a cursor from next_before or a time")
    if len(text) > 300:
        raise invalid
    try:
        return _bounded(as_utc(datetime.fromisoformat(text))), ""
    except ValueError:
        pass
    except OverflowError:  # a time whose UTC form falls outside the calendar
        raise invalid from None
    try:
        decoded = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        when, _, order_id = decoded.partition("|")
        return _bounded(as_utc(datetime.fromisoformat(when))), order_id
    except (ValueError, OverflowError, binascii.Error, UnicodeDecodeError):
        raise invalid from None


def _bounded(when: datetime) -> datetime:
    """``when``, if the page query's bound (``when`` plus one tick) exists; ValueError for
    the calendar's last instant, which no order can follow anyway."""
    if when > datetime.max.replace(tzinfo=UTC) - _ONE_TICK:
        raise ValueError("beyond the last instant")
    return when


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit")
    if raw is None:
        return DEFAULT_PAGE
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_PAGE:
        raise fail(400, "invalid_request", f"limit must be an integer from 1 to {MAX_PAGE}")
    return int(raw)


@routes.get("/trading/orders")
async def list_orders(request: web.Request) -> web.Response:
    """Newest first. Rows sharing a creation time are ordered by id, and the cursor carries
    both, so no row is skipped or repeated across pages."""
    principal = await authenticate(request)
    await _admit_read(request, principal.user_id)
    orders = request.app[SERVICES].orders
    limit = _limit(request)
    account_id = request.query.get("trading_account_id") or None
    raw_before = request.query.get("before")
    cursor = None if raw_before is None else decode_cursor(raw_before)
    fetch = limit + 1
    while True:
        rows = await orders.list_for_user(
            principal.user_id,
            trading_account_id=account_id,
            before=None if cursor is None else cursor[0] + _ONE_TICK,
            limit=fetch,
        )
        kept = [r for r in rows if cursor is None or (as_utc(r.created_at), r.id) < cursor]
        if len(kept) > limit or len(rows) < fetch or fetch >= _MAX_SCAN:
            break
        fetch = min(fetch * 2, _MAX_SCAN)
    page = kept[:limit]
    more = len(kept) > limit
    return views.json_response(
        {
            "items": [views.history_item(r) for r in page],
            "next_before": encode_cursor(page[-1]) if more and page else None,
        }
    )
