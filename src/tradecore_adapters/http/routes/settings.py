"""``/settings/*``: API keys, allowed IPs, and the user's security events.

API keys and allowed IPs are credentials: they are managed from a browser session only (an
API key is refused with 403 by the core). ``GET /settings/security-attacks`` pages through
the attack-class audit entries of the last ``days`` days.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from aiohttp import web

from tradecore.audit import AuditAction
from tradecore.security import ATTACK_POLICIES
from tradecore.services.auth import Principal
from tradecore.services.outcomes import Rejected
from tradecore_adapters.http import views
from tradecore_adapters.http.bodies import json_object
from tradecore_adapters.http.principal import audit_refusal, authenticate
from tradecore_adapters.http.problems import Problem, fail, rejected_response
from tradecore_adapters.http.state import SERVICES, request_context

DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100
DEFAULT_DAYS = 30
MAX_DAYS = 365
MAX_PAGE = 10_000
AGGREGATE_LIMIT = 1000

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
    keys = await services.account_security.list_api_keys(principal)
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
    outcome = await services.account_security.create_api_key(
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
    refused = await request.app[SERVICES].account_security.revoke_api_key(
        principal, request.match_info["key_id"], request_context(request)
    )
    if refused is not None:
        return rejected_response(refused)
    return web.Response(status=204)


@routes.get("/settings/allowed-ips")
async def list_allowed_ips(request: web.Request) -> web.Response:
    principal = await authenticate(request, browser_session=True)
    entries = await request.app[SERVICES].account_security.list_allowed_ips(principal)
    if isinstance(entries, Rejected):
        return rejected_response(entries)
    return views.json_response({"items": [views.allowed_ip(e) for e in entries]})


@routes.post("/settings/allowed-ips")
async def add_allowed_ip(request: web.Request) -> web.Response:
    principal = await authenticate(request, browser_session=True)
    body = await _body(request, principal, AuditAction.ALLOWED_IP_ADDED)
    outcome = await request.app[SERVICES].account_security.add_allowed_ip(
        principal, body.get("ip_address"), request_context(request)
    )
    if isinstance(outcome, Rejected):
        return rejected_response(outcome)
    return views.json_response(views.allowed_ip(outcome), status=201)


@routes.delete("/settings/allowed-ips/{entry_id}")
async def remove_allowed_ip(request: web.Request) -> web.Response:
    principal = await authenticate(request, browser_session=True)
    refused = await request.app[SERVICES].account_security.remove_allowed_ip(
        principal, request.match_info["entry_id"], request_context(request)
    )
    if refused is not None:
        return rejected_response(refused)
    return web.Response(status=204)


def _int_query(request: web.Request, name: str, default: int, highest: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= highest:
        raise fail(400, "invalid_request", f"{name} must be an integer from 1 to {highest}")
    return int(raw)


@routes.get("/settings/security-attacks")
async def security_attacks(request: web.Request) -> web.Response:
    """``{counts, items, affected_accounts, page, page_size, total}`` over the attack
    classes (newest first). ``affected_accounts`` and ``counts`` cover the window's newest
    1000 events."""
    principal = await authenticate(request)
    services = request.app[SERVICES]
    page = _int_query(request, "page", 1, MAX_PAGE)
    page_size = _int_query(request, "page_size", DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    days = _int_query(request, "days", DEFAULT_DAYS, MAX_DAYS)
    since = services.clock.now() - timedelta(days=days)
    actions: frozenset[AuditAction] = frozenset(ATTACK_POLICIES)
    items, total = await services.audit.list_for_user(
        principal.user_id,
        actions=actions,
        since=since,
        limit=page_size,
        offset=(page - 1) * page_size,
    )
    recent, _ = await services.audit.list_for_user(
        principal.user_id, actions=actions, since=since, limit=AGGREGATE_LIMIT
    )
    counts = Counter(s.entry.action.value for s in recent)
    by_account = Counter(
        account_id
        for s in recent
        if isinstance(account_id := s.entry.metadata.get("trading_account_id"), str)
    )
    names = {a.id: a.name for a in await services.accounts.list_for_user(principal.user_id)}
    return views.json_response(
        {
            "counts": {action.value: counts.get(action.value, 0) for action in ATTACK_POLICIES},
            "items": [views.security_event(s) for s in items],
            "affected_accounts": [
                {"trading_account_id": account_id, "name": names.get(account_id), "events": n}
                for account_id, n in by_account.most_common()
            ],
            "page": page,
            "page_size": page_size,
            "total": total,
        }
    )
