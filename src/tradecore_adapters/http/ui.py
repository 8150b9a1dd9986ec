"""The server-rendered dashboard's plumbing: templates, the page principal, static assets.

Pages and fragments (``tradecore_adapters.http.routes.pages``) render Jinja2 templates from
``templates/`` with autoescaping. Every page carries the session's CSRF token in
``<meta name="csrf-token">``; ``static/app.js`` sends it as ``X-CSRF-Token`` on every htmx
request that changes state, so the UI passes the same CSRF check as any cookie client. The
assets (htmx, pinned and vendored with its license, ``app.js``, ``app.css``) are served from
``/static/ui/`` by name only; nothing runs inline, so the pages live under the service's CSP.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from importlib import resources
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp_jinja2
import attrs
import jinja2
from aiohttp import web

from tradecore.orders import OrderError, OrderStatus
from tradecore.services.vocabulary import Principal
from tradecore.webhooks.payload import PayloadInvalid, parse_webhook_body
from tradecore_adapters.http.config import CHALLENGE_SCRIPT_URL
from tradecore_adapters.http.principal import authenticate
from tradecore_adapters.http.problems import Problem
from tradecore_adapters.http.state import CONFIG
from tradecore_adapters.http.views import decimal

LOGIN_PATH = "/ui/login"
HOME_PATH = "/ui/accounts"
TERMS_PATH = "/ui/terms"
RESET_PATH = "/reset-password"
"""The mailed reset link is ``{PUBLIC_BASE_URL}/reset-password#token=...``
(``tradecore.services.identity.password_reset``)."""
HTMX_VERSION = "2.0.11"
NEXT_FIELD = "next"
"""The login page's query parameter and form field: the page to return to."""
SESSION_HEADER = "Tradecore-Session"
"""Set to ``expired`` on an htmx answer whose request had no valid session (``to_login``)."""
_MAX_NEXT_CHARS = 2048

ASSETS: Mapping[str, tuple[str, str]] = {
    # name in the URL -> (file under static/, content type)
    "htmx.min.js": ("htmx.min.js", "text/javascript"),
    "htmx-LICENSE.txt": ("htmx-LICENSE.txt", "text/plain"),
    "app.js": ("app.js", "text/javascript"),
    "app.css": ("app.css", "text/css"),
}

STATUS_WORDS: Mapping[OrderStatus, str] = {
    OrderStatus.QUEUED: "Queued: waiting for the worker",
    OrderStatus.SUBMITTED: "Submitted to the broker",
    OrderStatus.PENDING: "Pending at the broker",
    OrderStatus.PARTIALLY_FILLED: "Partially filled",
    OrderStatus.FILLED: "Filled",
    OrderStatus.CANCELLED: "Cancelled",
    OrderStatus.REJECTED: "Rejected",
    OrderStatus.FAILED: "Failed",
    OrderStatus.EXPIRED: "Expired",
    OrderStatus.NO_POSITION: "Nothing to close: no position",
}

BROKERS = (
    ("paper", "Paper (simulated)"),
    ("binanceusdm", "Binance USDⓈ-M futures"),
    ("binance", "Binance spot"),
    ("bybit", "Bybit linear"),
    ("alpaca", "Alpaca"),
)


# --- the alert-message builder --------------------------------------------------------------

ALERT_FIELDS = ("trading_account_id", "action", "quantity", "order_type", "symbol")
CONCRETE_ACTIONS = ("buy", "sell", "close_long", "close_short")
ACTION_PLACEHOLDER = "{{strategy.order.action}}"
ALERT_ACTIONS = (
    ("buy", "Buy"),
    ("sell", "Sell"),
    ("close_long", "Close long"),
    ("close_short", "Close short"),
    (ACTION_PLACEHOLDER, "The strategy's action (buy or sell)"),
)
TICKER = "{{ticker}}"
TIME_NOW = "{{timenow}}"
QUANTITY_PLACEHOLDERS = ("{{strategy.order.contracts}}",)
# what the message holds in place of the webhook secret, which the user pastes there
PASTE_HERE = "PASTE-THE-ACCOUNT-WEBHOOK-SECRET-HERE"
# what TradingView puts in place of each placeholder, to check the message as it will arrive
_SAMPLES = {
    TICKER: "BTCUSDT",
    TIME_NOW: "2026-01-05T14:30:00Z",
    ACTION_PLACEHOLDER: "buy",
    QUANTITY_PLACEHOLDERS[0]: "1",
}


@attrs.frozen
class AlertMessage:
    """The JSON an alert should send for the builder's choices (``text``, pretty-printed),
    or why the choices cannot make one (``errors``)."""

    text: str
    errors: tuple[str, ...] = ()


def alert_message(choices: Mapping[str, str]) -> AlertMessage:
    """The alert message for ``choices`` (``ALERT_FIELDS``): TradingView placeholders for
    the symbol and the time, the secret as a placeholder the user replaces (the secret is
    never in the page). A fixed quantity is a JSON number; a placeholder is quoted, since
    TradingView substitutes text (``"0.5"`` is the same quantity to the webhook)."""
    action = choices.get("action") or "buy"
    quantity = choices.get("quantity") or "1"
    order_type = choices.get("order_type") or "entry"
    symbol = choices.get("symbol") or TICKER
    document: dict[str, Any] = {"action": action, "symbol": symbol, "quantity": quantity}
    if action not in ("close_long", "close_short"):
        document["order_type"] = order_type
    document |= {"timestamp": TIME_NOW, "secret": PASTE_HERE}
    errors = _alert_errors(document)
    text = json.dumps(document, indent=2, ensure_ascii=False)
    if quantity not in QUANTITY_PLACEHOLDERS and not errors:
        text = text.replace(f'"quantity": {json.dumps(quantity)}', f'"quantity": {quantity}')
    return AlertMessage(text=text, errors=errors)


def _alert_errors(document: Mapping[str, Any]) -> tuple[str, ...]:
    """What the webhook would refuse in ``document`` once TradingView filled it in."""
    if document["action"] not in (*CONCRETE_ACTIONS, ACTION_PLACEHOLDER):
        return ("Choose an action",)
    sample = {k: _SAMPLES.get(v, v) if isinstance(v, str) else v for k, v in document.items()}
    parsed = parse_webhook_body(json.dumps(sample).encode(), simulation=True)
    if isinstance(parsed, PayloadInvalid):
        return tuple(parsed.errors)
    return ()


def asset(name: str) -> bytes:
    return resources.files("tradecore_adapters.http").joinpath("static", name).read_bytes()


def setup_templates(app: web.Application) -> None:
    """Install the Jinja2 environment (autoescaped, undefined names fail) on ``app``."""
    env = aiohttp_jinja2.setup(
        app,
        loader=jinja2.PackageLoader("tradecore_adapters.http", "templates"),
        autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = when
    env.filters["qty"] = quantity
    env.filters["status_words"] = status_words
    env.filters["error_words"] = error_words
    env.globals["htmx_version"] = HTMX_VERSION
    env.globals["challenge_script_url"] = CHALLENGE_SCRIPT_URL


def when(value: datetime | None) -> str:
    if value is None:
        return ""
    aware = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return aware.strftime("%Y-%m-%d %H:%M:%S UTC")


def quantity(value: Decimal | None) -> str:
    return "" if value is None else decimal(value)


def status_words(status: OrderStatus | str) -> str:
    try:
        return STATUS_WORDS[OrderStatus(status)]
    except ValueError:
        return str(status)


def error_words(error: OrderError | None) -> str:
    if error is None:
        return ""
    words = error.message
    if error.broker_message:
        words += f" (the broker said: {error.broker_message})"
    if error.retry_after is not None:
        words += f"; retry after {error.retry_after:g} s"
    return words


def is_htmx(request: web.Request) -> bool:
    return request.headers.get("HX-Request") == "true"


def login_url(back_to: str | None = None) -> str:
    """The login page, which returns to ``back_to`` (a dashboard path) after logging in."""
    if back_to is None or safe_next(back_to) is None:
        return LOGIN_PATH
    return f"{LOGIN_PATH}?{urlencode({NEXT_FIELD: back_to})}"


def safe_next(value: str | None) -> str | None:
    """``value`` when it is a path of a dashboard page to return to after logging in, else
    None: only this site's ``/ui/`` pages (never another host, never the login page), so the
    login page cannot be made to send a user elsewhere."""
    if not value or len(value) > _MAX_NEXT_CHARS or not value.isprintable() or "\\" in value:
        return None
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or not parts.path.startswith("/ui/"):
        return None
    if parts.path == LOGIN_PATH or parts.fragment:
        return None
    return value


def to_login(request: web.Request) -> web.HTTPException:
    """The answer to a page request without a valid session.

    A page (a navigation) goes to the login page, which brings the user back to it. An htmx
    request answers 200 (a 4xx would show as an error in the browser's console) with
    ``SESSION_HEADER: expired`` and nothing to swap: ``app.js`` then renews the session
    (``POST /auth/silent-refresh``; the refresh cookie reaches ``/auth`` only) and sends the
    request again once, or opens the login page for the page the user is on."""
    if is_htmx(request):
        return web.HTTPOk(headers={SESSION_HEADER: "expired", "HX-Reswap": "none"})
    back_to = request.path_qs if request.method == "GET" else None
    return web.HTTPSeeOther(login_url(back_to))


async def page_principal(request: web.Request) -> Principal:
    """The principal of a page or fragment request: a browser session (cookie; CSRF checked
    on unsafe methods by ``authenticate``). Without one, the browser is sent to the login
    page; a failed CSRF check stays a 403 problem."""
    try:
        return await authenticate(request, browser_session=True)
    except Problem as refused:
        if refused.rejected.status == 401:
            raise to_login(request) from None
        raise


def render(
    request: web.Request,
    template: str,
    context: Mapping[str, Any],
    *,
    principal: Principal | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """``template`` rendered with ``context`` plus what the layout needs (the user, the CSRF
    token, whether the current terms are accepted) and what the login and registration forms
    need (whether the bot challenge is on, the widget's site key)."""
    config = request.app[CONFIG]
    full: dict[str, Any] = dict(context)
    full.setdefault("user", None if principal is None else principal.user)
    full.setdefault("path", request.path)
    session = None if principal is None else principal.session
    full.setdefault("csrf_token", "" if session is None else session.csrf_token)
    terms = config.terms_version
    full.setdefault(
        "terms_pending",
        principal is not None and principal.user.accepted_terms_version != terms,
    )
    full.setdefault("terms_version", terms)
    full.setdefault("challenge_enabled", config.challenge_enabled)
    full.setdefault("challenge_site_key", config.challenge_site_key)
    response = aiohttp_jinja2.render_template(template, request, full)
    if headers:
        response.headers.update(headers)
    return response
