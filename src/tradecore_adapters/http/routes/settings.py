"""``/settings/*``: API keys, allowed IPs, and the user's security events.

API keys and allowed IPs are credentials: they are managed from a browser session only (an
API key is refused with 403 by the core). ``GET /settings/security-attacks`` renders the
``SecurityReport`` use case (``tradecore.services.audit.attack_report``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aiohttp import web

from tradecore.audit import AuditAction
from tradecore.services.audit.attack_report import SecurityReport, SecurityReportPage
from tradecore.services.vocabulary import Principal, Rejected
from tradecore_adapters.http import views
from tradecore_adapters.http.bodies import json_object
from tradecore_adapters.http.principal import audit_refusal, authenticate
from tradecore_adapters.http.problems import Problem, rejected_response
from tradecore_adapters.http.state import SERVICES, request_context

routes = web.RouteTableDef()


async def _body(request: web.Request, principal: Principal, action: AuditAction) -> dict[str, Any]:
    try:
        return await json_object(request)
    except Problem as e:
        raise await audit_refusal(request, action, e.rejected, user_id=principal.user_id) from None


def _expiry(value: object) -> object:
    """An ISO 8601 string becomes a datetime; anything else goes to the core as it is (which
    accepts None and refuses the rest)."""
    if isinstance(value, str) and len(value) <= 64:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return value
    return value


@routes.get("/settings/api-keys")
async def list_api_keys(request: web.Request) -> web.Response:
    principal = await authenticate(request, browser_session=True)
    services = request.app[SERVICES]
    keys = await services.api_keys.list_api_keys(principal)
    if isinstance(keys, Rejected):
        return rejected_response(keys)
    now = services.clock.now()
    return views.json_response({"items": [views.api_key(k, now) for k in keys]})


@routes.post("/settings/api-keys")
async def create_api_key(request: web.Request) -> web.Response:
    """201 with the key's record and, this once, the key itself (``key``)."""
    principal = await authenticate(request, browser_session=True)
    services = request.app[SERVICES]
    body = await _body(request, principal, AuditAction.API_KEY_CREATED)
    outcome = await services.api_keys.create_api_key(
        principal, body.get("name"), _expiry(body.get("expires_at")), request_context(request)
    )
    if isinstance(outcome, Rejected):
        return rejected_response(outcome)
    key, plaintext = outcome
    return views.json_response(
        {**views.api_key(key, services.clock.now()), "key": plaintext}, status=201
    )


@routes.delete("/settings/api-keys/{key_id}")
async def revoke_api_key(request: web.Request) -> web.Response:
    principal = await authenticate(request, browser_session=True)
    refused = await request.app[SERVICES].api_keys.revoke_api_key(
        principal, request.match_info["key_id"], request_context(request)
    )
    if refused is not None:
        return rejected_response(refused)
    return web.Response(status=204)


@routes.get("/settings/allowed-ips")
async def list_allowed_ips(request: web.Request) -> web.Response:
    principal = await authenticate(request, browser_session=True)
    entries = await request.app[SERVICES].allowed_ips.list_allowed_ips(principal)
    if isinstance(entries, Rejected):
        return rejected_response(entries)
    return views.json_response({"items": [views.allowed_ip(e) for e in entries]})


@routes.post("/settings/allowed-ips")
async def add_allowed_ip(request: web.Request) -> web.Response:
    principal = await authenticate(request, browser_session=True)
    body = await _body(request, principal, AuditAction.ALLOWED_IP_ADDED)
    outcome = await request.app[SERVICES].allowed_ips.add_allowed_ip(
        principal, body.get("ip_address"), request_context(request)
    )
    if isinstance(outcome, Rejected):
        return rejected_response(outcome)
    return views.json_response(views.allowed_ip(outcome), status=201)


@routes.delete("/settings/allowed-ips/{entry_id}")
async def remove_allowed_ip(request: web.Request) -> web.Response:
    principal = await authenticate(request, browser_session=True)
    refused = await request.app[SERVICES].allowed_ips.remove_allowed_ip(
        principal, request.match_info["entry_id"], request_context(request)
    )
    if refused is not None:
        return rejected_response(refused)
    return web.Response(status=204)


def _report_body(report: SecurityReportPage) -> dict[str, Any]:
    return {
        "counts": {action.value: n for action, n in report.counts.items()},
        "items": [
            {
                "id": event.id,
                "action": event.action.value,
                "ip_address": event.ip_address,
                "user_agent": event.user_agent,
                "request_path": event.request_path,
                "created_at": views.timestamp(event.created_at),
                "trading_account_id": event.trading_account_id,
                "metadata": dict(event.metadata),
            }
            for event in report.items
        ],
        "affected_accounts": [
            {"trading_account_id": a.trading_account_id, "name": a.name, "events": a.events}
            for a in report.affected_accounts
        ],
        "page": report.page,
        "page_size": report.page_size,
        "total": report.total,
    }


@routes.get("/settings/security-attacks")
async def security_attacks(request: web.Request) -> web.Response:
    """The user's attack events (``tradecore.services.audit.attack_report``): ``{counts, items,
    affected_accounts, page, page_size, total}``; 400 on a bad ``page``, ``page_size`` or
    ``days``."""
    principal = await authenticate(request)
    services = request.app[SERVICES]
    report = await SecurityReport(services.audit, services.accounts, services.clock).page(
        principal,
        request.query.get("page"),
        request.query.get("page_size"),
        request.query.get("days"),
    )
    if isinstance(report, Rejected):
        return rejected_response(report)
    return views.json_response(_report_body(report))
