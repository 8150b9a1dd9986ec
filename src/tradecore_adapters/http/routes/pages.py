"""The dashboard: server-rendered pages under ``/ui/`` and the htmx fragments they load.

Pages call the same use cases as the JSON routes (through ``SERVICES``) and authenticate the
same way: the ``access_token`` cookie, with the session's CSRF token in ``X-CSRF-Token`` on
every unsafe method (``static/app.js`` adds it to htmx requests). ``GET /`` sends a signed-in
browser to its trading accounts and anyone else to the login page. A refusal of a form is
rendered in words inside the fragment (status 200, so htmx swaps it in). None of these routes
is part of the JSON API or its OpenAPI document; every route here is named ``ui.*``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from aiohttp import web

from tradecore.audit import AuditAction
from tradecore.orders import OrderHistoryRecord, OrderStatus, Source
from tradecore.services.audit.attack_report import SecurityReport, SecurityReportPage
from tradecore.services.identity.login import LoginResult
from tradecore.services.orders.dashboard_order import DashboardOrder
from tradecore.services.orders.outcomes import Accepted, OrderOutcome, Queued
from tradecore.services.vocabulary import Principal, Rejected
from tradecore.webhooks.canonical import as_utc
from tradecore_adapters.http import charts, ui
from tradecore_adapters.http.middlewares import ACCESS_COOKIE
from tradecore_adapters.http.problems import Problem
from tradecore_adapters.http.routes.auth import clear_session_cookies, set_session_cookies
from tradecore_adapters.http.routes.orders import checked_order, decode_cursor, encode_cursor
from tradecore_adapters.http.state import CONFIG, SERVICES, request_context

HISTORY_PAGE = 20
_HISTORY_SCAN = 1000
_HISTORY_FILTERS = ("trading_account_id", "symbol", "status", "source")
_ONE_TICK = timedelta(microseconds=1)
_CHART_DAYS = 30
_CHART_SCAN = 1000
SECURITY_PAGE = 20
"""Recent security events on one page of Settings > Security."""

routes = web.RouteTableDef()


async def _form(request: web.Request) -> dict[str, str]:
    """The urlencoded fields of a form post (the last value of each name)."""
    data = await request.post()
    return {k: v for k, v in data.items() if isinstance(v, str)}


def _refused(rejected: Rejected) -> str:
    return rejected.detail


# --- entry, login, logout, terms ----------------------------------------------------------


@routes.get("/", name="ui.root")
async def root(request: web.Request) -> web.Response:
    if request.cookies.get(ACCESS_COOKIE):
        outcome = await request.app[SERVICES].authentication.authenticate(
            request.cookies[ACCESS_COOKIE], None
        )
        if isinstance(outcome, Principal) and outcome.has_browser_session:
            raise web.HTTPSeeOther(ui.HOME_PATH)
    raise web.HTTPSeeOther(ui.LOGIN_PATH)


def _challenge_token(form: Mapping[str, str]) -> str | None:
    """The solved bot challenge's token: ``turnstile_token``, or the field the Turnstile
    widget adds to the form it sits in."""
    return form.get("turnstile_token") or form.get("cf-turnstile-response") or None


def _login_page(
    request: web.Request,
    *,
    email: str = "",
    error: str | None = None,
    message: str | None = None,
    back_to: str | None = None,
) -> web.Response:
    """The login form; ``back_to`` (a dashboard page, ``ui.safe_next``) is where a successful
    login goes."""
    context = {"error": error, "email": email, "message": message, "next": back_to}
    return ui.render(request, "login.html", context)


@routes.get("/ui/login", name="ui.login")
async def login_page(request: web.Request) -> web.Response:
    back_to = ui.safe_next(request.query.get(ui.NEXT_FIELD))
    message = None if back_to is None else "Your session has ended: log in to go on."
    return _login_page(request, back_to=back_to, message=message)


def _signed_in(
    request: web.Request, outcome: LoginResult, back_to: str | None
) -> web.HTTPException:
    """Where a fresh session goes, with its cookies: the terms page while the current terms
    are not accepted, else ``back_to`` (the page whose session had ended) or the trading
    accounts."""
    pending = outcome.user.accepted_terms_version != request.app[CONFIG].terms_version
    response = web.HTTPSeeOther(ui.TERMS_PATH if pending else back_to or ui.HOME_PATH)
    set_session_cookies(request, response, outcome.tokens)
    return response


@routes.post("/ui/login", name="ui.login_post")
async def login_post(request: web.Request) -> web.Response:
    form = await _form(request)
    services = request.app[SERVICES]
    outcome = await services.password_login.login(
        form.get("email"),
        form.get("password"),
        _challenge_token(form),
        request_context(request),
    )
    back_to = ui.safe_next(form.get(ui.NEXT_FIELD))
    if isinstance(outcome, Rejected):
        return _login_page(
            request, email=form.get("email", ""), error=_refused(outcome), back_to=back_to
        )
    raise _signed_in(request, outcome, back_to)


@routes.get("/ui/register", name="ui.register")
async def register_page(request: web.Request) -> web.Response:
    return ui.render(request, "register.html", {"error": None, "email": ""})


@routes.post("/ui/register", name="ui.register_post")
async def register_post(request: web.Request) -> web.Response:
    """The same answer for a new and a taken address (registration reveals no account): the
    login page, asking to check the mail and log in (the terms page comes after the login).
    Nobody is signed in here: that would tell a new address from a taken one."""
    form = await _form(request)
    services, context = request.app[SERVICES], request_context(request)
    email, password = form.get("email", ""), form.get("password", "")
    if password != form.get("password_again", ""):
        return ui.render(
            request, "register.html", {"error": "The passwords differ", "email": email}
        )
    refused = await services.registration.register(email, password, _challenge_token(form), context)
    if refused is not None:
        return ui.render(request, "register.html", {"error": _refused(refused), "email": email})
    message = "Check your mail to continue, then log in."
    return _login_page(request, email=email.strip(), message=message)


@routes.get("/ui/forgot-password", name="ui.forgot_password")
async def forgot_password_page(request: web.Request) -> web.Response:
    return ui.render(request, "forgot_password.html", {"error": None, "message": None})


@routes.post("/ui/forgot-password", name="ui.forgot_password_post")
async def forgot_password_post(request: web.Request) -> web.Response:
    form = await _form(request)
    refused = await request.app[SERVICES].password_reset.forgot_password(
        form.get("email", ""), request_context(request)
    )
    context: dict[str, str | None] = {"error": None, "message": None}
    if refused is not None:
        context["error"] = _refused(refused)
    else:
        context["message"] = (
            "If the address belongs to an account, a reset link is on its way. "
            "Open it within the time the mail says."
        )
    return ui.render(request, "forgot_password.html", context)


@routes.get(ui.RESET_PATH, name="ui.reset_password")
async def reset_password_page(request: web.Request) -> web.Response:
    """The mailed link's page. The token is in the URL's fragment, which no server sees:
    ``app.js`` copies it into the form and drops it from the address bar."""
    return ui.render(request, "reset_password.html", {"error": None})


@routes.post(ui.RESET_PATH, name="ui.reset_password_post")
async def reset_password_post(request: web.Request) -> web.Response:
    form = await _form(request)
    password = form.get("password", "")
    if password != form.get("password_again", ""):
        return ui.render(request, "reset_password.html", {"error": "The passwords differ"})
    refused = await request.app[SERVICES].password_reset.reset_password(
        form.get("token", ""), password, request_context(request)
    )
    if refused is not None:
        return ui.render(request, "reset_password.html", {"error": _refused(refused)})
    message = "Your password was changed and every session ended: log in with the new one."
    return _login_page(request, message=message)


@routes.post("/ui/logout", name="ui.logout")
async def logout(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    await request.app[SERVICES].session_lifetime.logout(principal, request_context(request))
    response = web.Response(text="", headers={"HX-Redirect": ui.LOGIN_PATH})
    clear_session_cookies(request, response)
    return response


@routes.get(ui.TERMS_PATH, name="ui.terms_page")
async def terms_page(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    accepted = principal.user.accepted_terms_version == request.app[CONFIG].terms_version
    context = {"accepted": accepted, "terms_pending": False}
    return ui.render(request, "terms.html", context, principal=principal)


@routes.post(ui.TERMS_PATH, name="ui.terms")
async def accept_terms(request: web.Request) -> web.Response:
    """Accept the current terms; the banner reloads its page, the terms page (``then=home``)
    goes on to the trading accounts."""
    principal = await ui.page_principal(request)
    form = await _form(request)
    outcome = await request.app[SERVICES].registration.accept_terms(
        principal, request.app[CONFIG].terms_version, request_context(request)
    )
    if isinstance(outcome, Rejected):
        return web.Response(text=_refused(outcome), content_type="text/plain")
    if form.get("then") == "home":
        return web.Response(text="", headers={"HX-Redirect": ui.HOME_PATH})
    return web.Response(text="", headers={"HX-Refresh": "true"})


# --- trading accounts ---------------------------------------------------------------------


async def _accounts_panel(
    request: web.Request,
    principal: Principal,
    *,
    issued: Mapping[str, Any] | None = None,
    message: str | None = None,
    error: str | None = None,
) -> web.Response:
    accounts = await request.app[SERVICES].trading_accounts.list_accounts(principal)
    context = {"accounts": accounts, "issued": issued, "message": message, "error": error}
    return ui.render(request, "accounts_panel.html", context, principal=principal)


@routes.get("/ui/accounts", name="ui.accounts")
async def accounts_page(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    accounts = await request.app[SERVICES].trading_accounts.list_accounts(principal)
    context = {
        "accounts": accounts,
        "brokers": ui.BROKERS,
        "issued": None,
        "message": None,
        "error": None,
    }
    return ui.render(request, "accounts.html", context, principal=principal)


def _credentials(form: Mapping[str, str]) -> dict[str, str] | None:
    fields = {
        name: form[name].strip()
        for name in ("api_key", "api_secret", "passphrase")
        if form.get(name, "").strip()
    }
    return fields or None


@routes.post("/ui/accounts", name="ui.accounts_create")
async def create_account(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    form = await _form(request)
    created = await request.app[SERVICES].trading_accounts.create(
        principal,
        form.get("name", "").strip(),
        form.get("broker") or "paper",
        _credentials(form),
        None,
        request_context(request),
        testnet=form.get("testnet") == "on",
    )
    if isinstance(created, Rejected):
        return await _accounts_panel(request, principal, error=_refused(created))
    issued = {
        "account": created.account,
        "webhook_url": created.webhook_url(request.app[CONFIG].public_base_url),
        "webhook_secret": created.webhook_secret,
    }
    message = f"Account {created.account.name} created."
    return await _accounts_panel(request, principal, issued=issued, message=message)


@routes.post("/ui/accounts/{account_id}/verify", name="ui.accounts_verify")
async def verify_account(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    verified = await request.app[SERVICES].account_credentials.verify_credentials(
        principal, request.match_info["account_id"], request_context(request)
    )
    if isinstance(verified, Rejected):
        return await _accounts_panel(request, principal, error=_refused(verified))
    return await _accounts_panel(request, principal, message="The broker accepted the credentials.")


@routes.post("/ui/accounts/{account_id}/rotate", name="ui.accounts_rotate")
async def rotate_account(request: web.Request) -> web.Response:
    """A new webhook URL and a new secret at once: the old ones stop working."""
    principal = await ui.page_principal(request)
    services, context = request.app[SERVICES], request_context(request)
    account_id = request.match_info["account_id"]
    token = await services.account_credentials.rotate_token(principal, account_id, context)
    if isinstance(token, Rejected):
        return await _accounts_panel(request, principal, error=_refused(token))
    secret = await services.account_credentials.regenerate_secret(principal, account_id, context)
    if isinstance(secret, Rejected):
        return await _accounts_panel(request, principal, error=_refused(secret))
    account = await services.trading_accounts.get(principal, account_id)
    issued = {
        "account": None if isinstance(account, Rejected) else account,
        "webhook_url": f"{request.app[CONFIG].public_base_url.rstrip('/')}/webhook/{token}/order",
        "webhook_secret": secret,
    }
    message = "New webhook URL and secret issued; the old ones no longer work."
    return await _accounts_panel(request, principal, issued=issued, message=message)


def _account_changes(form: Mapping[str, str]) -> dict[str, object]:
    changes: dict[str, object] = {}
    if "name" in form:
        changes["name"] = form["name"].strip()
    if "allowed_symbols" in form:
        symbols = form["allowed_symbols"].replace("\n", ",").split(",")
        changes["allowed_symbols"] = [s.strip() for s in symbols if s.strip()]
    if "max_request_age" in form:
        raw = form["max_request_age"].strip()
        changes["max_request_age"] = int(raw) if raw.isascii() and raw.isdigit() else raw
    return changes


@routes.post("/ui/accounts/{account_id}/edit", name="ui.accounts_edit")
async def edit_account(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    form = await _form(request)
    updated = await request.app[SERVICES].trading_accounts.update(
        principal,
        request.match_info["account_id"],
        _account_changes(form),
        request_context(request),
    )
    if isinstance(updated, Rejected):
        return await _accounts_panel(request, principal, error=_refused(updated))
    return await _accounts_panel(request, principal, message=f"Account {updated.name} saved.")


@routes.post("/ui/accounts/{account_id}/delete", name="ui.accounts_delete")
async def delete_account(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    refused = await request.app[SERVICES].trading_accounts.delete(
        principal, request.match_info["account_id"], request_context(request)
    )
    if refused is not None:
        return await _accounts_panel(request, principal, error=_refused(refused))
    return await _accounts_panel(request, principal, message="Account deleted.")


@routes.get("/ui/accounts/{account_id}", name="ui.account")
async def account_page(request: web.Request) -> web.Response:
    """One account's pictures: its position over time per symbol and its orders per day by
    outcome (``charts``), each with its summary and data table."""
    principal = await ui.page_principal(request)
    services = request.app[SERVICES]
    account = await services.trading_accounts.get(principal, request.match_info["account_id"])
    if isinstance(account, Rejected):
        raise Problem(account)
    rows = await services.orders.list_for_user(
        principal.user_id, trading_account_id=account.id, limit=_CHART_SCAN
    )
    now = services.clock.now()
    series = charts.position_series(rows)
    days = charts.orders_per_day(rows, charts.utc(now).date(), _CHART_DAYS)
    context = {
        "account": account,
        "series": series,
        "position_svg": charts.position_svg(series, now),
        "days": [d for d in days if d.total],
        "days_summary": charts.orders_summary(days),
        "days_svg": charts.orders_per_day_svg(days),
    }
    return ui.render(request, "account.html", context, principal=principal)


# --- manual order ---------------------------------------------------------------------------


@routes.get("/ui/order", name="ui.order")
async def order_page(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    accounts = await request.app[SERVICES].trading_accounts.list_accounts(principal)
    return ui.render(request, "order.html", {"accounts": accounts}, principal=principal)


@routes.get("/ui/order/symbols", name="ui.order_symbols")
async def order_symbols(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    account_id = request.query.get("trading_account_id", "")
    listed = await request.app[SERVICES].trading_accounts.instruments(principal, account_id)
    symbols = [] if isinstance(listed, Rejected) else sorted(listed)
    error = listed.detail if isinstance(listed, Rejected) and account_id else None
    return ui.render(
        request, "order_symbols.html", {"symbols": symbols, "error": error}, principal=principal
    )


def _manual_order(form: Mapping[str, str]) -> DashboardOrder | str:
    """The order of the form, checked by the webhook parser's rules, or why it is invalid."""
    account_id = form.get("trading_account_id", "")
    if not account_id:
        return "Choose a trading account"
    document: dict[str, Any] = {
        "action": form.get("action", ""),
        "symbol": form.get("symbol", ""),
        "quantity": form.get("quantity", "").strip(),
        "order_type": form.get("order_type") or "entry",
    }
    return checked_order(account_id, json.dumps(document).encode())


@routes.post("/ui/order", name="ui.order_post")
async def order_post(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    services, context = request.app[SERVICES], request_context(request)
    form = await _form(request)
    order = _manual_order(form)
    if isinstance(order, str):
        await services.events.record(
            AuditAction.DASHBOARD_ORDER,
            context,
            user_id=principal.user_id,
            success=False,
            error_message=order[:200],
        )
        return ui.render(request, "order_result.html", {"refused": order}, principal=principal)
    outcome = await services.dashboard.place(
        principal.user, order, simulation=form.get("simulation") == "on", context=context
    )
    return await _order_answer(request, principal, outcome)


async def _order_answer(
    request: web.Request, principal: Principal, outcome: OrderOutcome
) -> web.Response:
    """An order's answer in words: the refusal, or its status (which polls itself while it is
    not final)."""
    services = request.app[SERVICES]
    headers = {"HX-Trigger": "orders-changed"}
    if isinstance(outcome, Rejected):
        return ui.render(
            request, "order_result.html", {"refused": outcome.detail}, principal=principal
        )
    order_id = outcome.result.order_id if isinstance(outcome, Accepted) else outcome.order_id
    assert isinstance(outcome, Accepted | Queued)
    row = await services.orders.get(order_id) if order_id else None
    return ui.render(
        request,
        "order_result.html",
        {"refused": None, "row": row, "result": outcome, "queued": isinstance(outcome, Queued)},
        principal=principal,
        headers=headers,
    )


@routes.get("/ui/orders/{order_id}/status", name="ui.order_status")
async def order_status(request: web.Request) -> web.Response:
    """The order's status in words; while it is not final the fragment polls itself."""
    principal = await ui.page_principal(request)
    row = await request.app[SERVICES].orders.get(request.match_info["order_id"])
    if row is None or row.user_id != principal.user_id:
        raise web.HTTPNotFound()
    return ui.render(request, "order_status.html", {"row": row}, principal=principal)


# --- alert builder and webhook tester -----------------------------------------------------


def _alert_choices(request: web.Request) -> dict[str, str]:
    return {name: request.query.get(name, "").strip() for name in ui.ALERT_FIELDS}


@routes.get("/ui/alerts", name="ui.alerts")
async def alerts_page(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    accounts = await request.app[SERVICES].trading_accounts.list_accounts(principal)
    choices = _alert_choices(request)
    context = {
        "accounts": accounts,
        "choices": choices,
        "actions": ui.ALERT_ACTIONS,
        "quantity_placeholders": ui.QUANTITY_PLACEHOLDERS,
        "alert": ui.alert_message(choices),
    }
    return ui.render(request, "alerts.html", context, principal=principal)


@routes.get("/ui/alerts/message", name="ui.alerts_message")
async def alerts_message(request: web.Request) -> web.Response:
    """The alert message for the builder's choices (an htmx fragment)."""
    principal = await ui.page_principal(request)
    context = {"alert": ui.alert_message(_alert_choices(request))}
    return ui.render(request, "alert_message.html", context, principal=principal)


@routes.post("/ui/alerts/test", name="ui.alerts_test")
async def alerts_test(request: web.Request) -> web.Response:
    """The webhook tester: the builder's order as a simulation order (nothing reaches the
    broker), answered in words."""
    principal = await ui.page_principal(request)
    services, context = request.app[SERVICES], request_context(request)
    form = await _form(request)
    if form.get("action", "") not in ui.CONCRETE_ACTIONS:
        refused = "Choose a concrete action (not a placeholder) to test the alert"
        return ui.render(request, "order_result.html", {"refused": refused}, principal=principal)
    order = _manual_order(
        {
            "trading_account_id": form.get("trading_account_id", ""),
            "action": form.get("action", ""),
            "symbol": form.get("test_symbol", ""),
            "quantity": form.get("test_quantity", ""),
            "order_type": form.get("order_type", ""),
        }
    )
    if isinstance(order, str):
        return ui.render(request, "order_result.html", {"refused": order}, principal=principal)
    outcome = await services.dashboard.place(
        principal.user, order, simulation=True, context=context
    )
    return await _order_answer(request, principal, outcome)


# --- order history --------------------------------------------------------------------------


def _history_filters(request: web.Request) -> dict[str, str]:
    return {name: request.query.get(name, "").strip() for name in _HISTORY_FILTERS}


def _matches(row: OrderHistoryRecord, filters: Mapping[str, str]) -> bool:
    symbol, status, source = filters["symbol"].upper(), filters["status"], filters["source"]
    return (
        (not symbol or row.symbol.upper() == symbol)
        and (not status or row.status.value == status)
        and (not source or row.source.value == source)
    )


async def _history_page(
    request: web.Request, principal: Principal, filters: Mapping[str, str]
) -> tuple[list[OrderHistoryRecord], str | None]:
    """One page of the user's orders (newest first) that match ``filters``, and the cursor of
    the next page (None on the last)."""
    raw_before = request.query.get("before") or None
    try:
        cursor = None if raw_before is None else decode_cursor(raw_before)
    except Problem:
        cursor = None
    rows = await request.app[SERVICES].orders.list_for_user(
        principal.user_id,
        trading_account_id=filters["trading_account_id"] or None,
        before=None if cursor is None else cursor[0] + _ONE_TICK,
        limit=_HISTORY_SCAN,
    )
    kept = [
        r
        for r in rows
        if (cursor is None or (as_utc(r.created_at), r.id) < cursor) and _matches(r, filters)
    ]
    page = kept[:HISTORY_PAGE]
    more = len(kept) > HISTORY_PAGE
    return page, encode_cursor(page[-1]) if more and page else None


def _history_context(
    request: web.Request,
    rows: list[OrderHistoryRecord],
    next_before: str | None,
    filters: Mapping[str, str],
) -> dict[str, Any]:
    query = {k: v for k, v in filters.items() if v}
    before = request.query.get("before")
    current = dict(query, before=before) if before else query
    return {
        "rows": rows,
        "filters": filters,
        "query": current,
        "first_query": query,
        "next_query": dict(query, before=next_before) if next_before else None,
    }


@routes.get("/ui/orders", name="ui.orders")
async def orders_page(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    filters = _history_filters(request)
    rows, next_before = await _history_page(request, principal, filters)
    accounts = await request.app[SERVICES].trading_accounts.list_accounts(principal)
    context = _history_context(request, rows, next_before, filters)
    context.update(
        accounts=accounts,
        statuses=[s.value for s in OrderStatus],
        sources=[s.value for s in Source],
    )
    return ui.render(request, "orders.html", context, principal=principal)


@routes.get("/ui/orders/rows", name="ui.orders_rows")
async def orders_rows(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    filters = _history_filters(request)
    rows, next_before = await _history_page(request, principal, filters)
    context = _history_context(request, rows, next_before, filters)
    return ui.render(request, "orders_rows.html", context, principal=principal)


@routes.get("/ui/orders/{order_id}", name="ui.order_detail")
async def order_detail(request: web.Request) -> web.Response:
    """One order: its fields and the time it spent in each stage (``charts.order_stages``)."""
    principal = await ui.page_principal(request)
    row = await request.app[SERVICES].orders.get(request.match_info["order_id"])
    if row is None or row.user_id != principal.user_id:
        raise web.HTTPNotFound()
    stages = charts.order_stages(row)
    context = {
        "row": row,
        "stages": stages,
        "stages_summary": charts.stages_summary(stages),
        "stages_svg": charts.stages_svg(stages),
    }
    return ui.render(request, "order_detail.html", context, principal=principal)


# --- settings -------------------------------------------------------------------------------


async def _keys_panel(
    request: web.Request,
    principal: Principal,
    *,
    issued: str | None = None,
    message: str | None = None,
    error: str | None = None,
    template: str = "api_keys_panel.html",
) -> web.Response:
    """The API keys (the panel fragment, or with ``template`` the whole page)."""
    services = request.app[SERVICES]
    keys = await services.api_keys.list_api_keys(principal)
    if isinstance(keys, Rejected):
        raise Problem(keys)
    context = {
        "keys": keys,
        "now": services.clock.now(),
        "issued": issued,
        "message": message,
        "error": error,
    }
    return ui.render(request, template, context, principal=principal)


@routes.get("/ui/settings/api-keys", name="ui.api_keys")
async def api_keys_page(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    return await _keys_panel(request, principal, template="api_keys.html")


@routes.post("/ui/settings/api-keys", name="ui.api_keys_create")
async def api_keys_create(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    form = await _form(request)
    expires = form.get("expires_on", "").strip()
    expires_at: object = None
    if expires:
        try:
            expires_at = as_utc(datetime.fromisoformat(expires))
        except ValueError:
            expires_at = expires
    outcome = await request.app[SERVICES].api_keys.create_api_key(
        principal, form.get("name", "").strip(), expires_at, request_context(request)
    )
    if isinstance(outcome, Rejected):
        return await _keys_panel(request, principal, error=_refused(outcome))
    key, plaintext = outcome
    message = f"API key {key.name} created. Copy it now: it is not shown again."
    return await _keys_panel(request, principal, issued=plaintext, message=message)


@routes.post("/ui/settings/api-keys/{key_id}/revoke", name="ui.api_keys_revoke")
async def api_keys_revoke(request: web.Request) -> web.Response:
    principal = await ui.page_principal(request)
    refused = await request.app[SERVICES].api_keys.revoke_api_key(
        principal, request.match_info["key_id"], request_context(request)
    )
    if refused is not None:
        return await _keys_panel(request, principal, error=_refused(refused))
    return await _keys_panel(request, principal, message="API key revoked.")


def _security_pages(report: SecurityReportPage) -> dict[str, Any]:
    """The pager of the recent events: the page count and the query of the newer and the
    older page (None at either end), each keeping the report's window in days."""
    pages = max(1, -(-report.total // report.page_size))

    def query(page: int) -> dict[str, int] | None:
        return {"page": page, "days": report.days} if 1 <= page <= pages else None

    newer = query(min(report.page - 1, pages))  # past the end: the last page
    return {"pages": pages, "newer": newer, "older": query(report.page + 1)}


@routes.get("/ui/settings/security", name="ui.security")
async def security_page(request: web.Request) -> web.Response:
    """The attacks against the user: counts by type, the accounts concerned and the recent
    events, ``SECURITY_PAGE`` a page (``?page=``, ``?days=`` as the JSON report's). A bad
    page or window is refused in words (400)."""
    principal = await ui.page_principal(request)
    services = request.app[SERVICES]
    report = await SecurityReport(services.audit, services.accounts, services.clock).page(
        principal, request.query.get("page"), SECURITY_PAGE, request.query.get("days")
    )
    if isinstance(report, Rejected):
        if report.status != 400:
            raise Problem(report)
        context: dict[str, Any] = {"report": None, "error": report.detail}
        response = ui.render(request, "security.html", context, principal=principal)
        response.set_status(400)
        return response
    accounts = await services.trading_accounts.list_accounts(principal)
    context = {
        "report": report,
        "error": None,
        "account_names": {} if isinstance(accounts, Rejected) else {a.id: a.name for a in accounts},
        **_security_pages(report),
    }
    return ui.render(request, "security.html", context, principal=principal)


# --- assets ---------------------------------------------------------------------------------


@routes.get("/static/ui/{name}", name="ui.asset")
async def asset(request: web.Request) -> web.Response:
    """Only the listed files: no path from the request reaches the file system."""
    entry = ui.ASSETS.get(request.match_info["name"])
    if entry is None:
        raise web.HTTPNotFound()
    file_name, content_type = entry
    return web.Response(
        body=ui.asset(file_name),
        content_type=content_type,
        charset="utf-8",
        headers={"Cache-Control": "public, max-age=3600"},
    )
