"""``/trading/accounts``: the user's trading accounts, their webhook URL and secret, broker
credential verification and positions.

An account's webhook token and secret are shown once, when the account is created (and again
only when regenerated or rotated); every other answer omits them. Another user's account is
404, revealing nothing. Issuing webhook credentials (create, regenerate, rotate) needs a
browser session, as the other credential endpoints do (contract.md).
"""

from __future__ import annotations

from typing import Any

import attrs
from aiohttp import web

from tradecore.accounts import TradingAccount
from tradecore.audit import AuditAction
from tradecore.services.auth import Principal
from tradecore.services.provisioning import ProvisioningError, webhook_url
from tradecore.webhook_payload import SYMBOL_PATTERN, canonical_symbol
from tradecore_adapters.http import views
from tradecore_adapters.http.bodies import json_object
from tradecore_adapters.http.principal import audit_refusal, authenticate
from tradecore_adapters.http.problems import Problem, fail
from tradecore_adapters.http.state import CONFIG, SERVICES, request_context

MAX_NAME_CHARS = 100
MIN_REQUEST_AGE_S = 1
MAX_REQUEST_AGE_S = 86_400
MAX_ALLOWED_SYMBOLS = 500
MAX_CREDENTIAL_CHARS = 8192

routes = web.RouteTableDef()


async def _audit(
    request: web.Request,
    action: AuditAction,
    principal: Principal,
    account_id: str,
    metadata: dict[str, Any] | None = None,
) -> None:
    await request.app[SERVICES].events.record(
        action,
        request_context(request),
        user_id=principal.user_id,
        success=True,
        resource_type="trading_account",
        resource_id=account_id,
        metadata={"trading_account_id": account_id, **(metadata or {})},
    )


async def _own_account(request: web.Request, principal: Principal) -> TradingAccount:
    account = await request.app[SERVICES].accounts.get(request.match_info["account_id"])
    if account is None or account.user_id != principal.user_id:
        raise fail(404, "not_found", "Trading account not found")
    return account


async def _body(request: web.Request, principal: Principal, action: AuditAction) -> dict[str, Any]:
    try:
        return await json_object(request)
    except Problem as e:
        raise await audit_refusal(request, action, e.rejected, user_id=principal.user_id) from None


async def _invalid(
    request: web.Request, principal: Principal, action: AuditAction, detail: str
) -> Problem:
    return await audit_refusal(
        request,
        action,
        fail(400, "invalid_request", detail).rejected,
        user_id=principal.user_id,
    )


def _name(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    name = value.strip()
    if not 1 <= len(name) <= MAX_NAME_CHARS or not name.isprintable():
        return None
    return name


def _credentials_ok(value: object) -> bool:
    """Credentials are an encrypted string (JWE compact) or an object of strings. The paper
    broker needs none, so they are checked for shape only."""
    if value is None:
        return True
    if isinstance(value, str):
        return len(value) <= MAX_CREDENTIAL_CHARS
    if isinstance(value, dict):
        return len(value) <= 20 and all(
            isinstance(v, str) and len(v) <= MAX_CREDENTIAL_CHARS for v in value.values()
        )
    return False


@routes.get("/trading/accounts")
async def list_accounts(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    accounts = await request.app[SERVICES].accounts.list_for_user(principal.user_id)
    return views.json_response({"items": [views.account(a) for a in accounts]})


@routes.post("/trading/accounts")
async def create_account(request: web.Request) -> web.Response:
    principal = await authenticate(request, browser_session=True)
    services, config = request.app[SERVICES], request.app[CONFIG]
    action = AuditAction.ACCOUNT_CREATED
    body = await _body(request, principal, action)
    name = _name(body.get("name"))
    if name is None:
        raise await _invalid(request, principal, action, "name must be 1 to 100 characters")
    broker = body.get("broker", "paper")
    if not isinstance(broker, str) or not await services.instruments.symbols(broker):
        raise await _invalid(request, principal, action, "broker is not supported")
    if not _credentials_ok(body.get("credentials")):
        raise await _invalid(
            request, principal, action, "credentials must be an encrypted string or an object"
        )
    try:
        created = await services.provisioning.create_account(
            principal.user, name, broker_name=broker
        )
    except ProvisioningError as e:
        raise await _invalid(request, principal, action, str(e)) from None
    await _audit(request, action, principal, created.account.id, {"broker": broker})
    return views.json_response(
        {
            "account": views.account(created.account),
            "webhook_url": created.webhook_url(config.public_base_url),
            "webhook_secret": created.webhook_secret,
        },
        status=201,
    )


@routes.get("/trading/accounts/{account_id}")
async def get_account(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    return views.json_response(views.account(await _own_account(request, principal)))


async def _changes(
    request: web.Request, principal: Principal, account: TradingAccount, body: dict[str, Any]
) -> dict[str, Any]:
    action = AuditAction.ACCOUNT_UPDATED
    changes: dict[str, Any] = {}
    if "name" in body:
        name = _name(body["name"])
        if name is None:
            raise await _invalid(request, principal, action, "name must be 1 to 100 characters")
        changes["name"] = name
    if "max_request_age" in body:
        age = body["max_request_age"]
        if (
            isinstance(age, bool)
            or not isinstance(age, int)
            or not MIN_REQUEST_AGE_S <= age <= MAX_REQUEST_AGE_S
        ):
            raise await _invalid(
                request,
                principal,
                action,
                f"max_request_age must be an integer from {MIN_REQUEST_AGE_S} "
                f"to {MAX_REQUEST_AGE_S}",
            )
        changes["max_request_age"] = age
    if "allowed_symbols" in body:
        symbols = body["allowed_symbols"]
        listed = await request.app[SERVICES].instruments.symbols(account.broker_name)
        if (
            not isinstance(symbols, list)
            or len(symbols) > MAX_ALLOWED_SYMBOLS
            or not all(isinstance(s, str) for s in symbols)
        ):
            raise await _invalid(
                request, principal, action, "allowed_symbols must be a list of symbols"
            )
        wanted = {canonical_symbol(s) for s in symbols}
        if any(SYMBOL_PATTERN.fullmatch(s) is None or s not in listed for s in wanted):
            raise await _invalid(
                request,
                principal,
                action,
                "allowed_symbols holds a symbol the broker does not list",
            )
        changes["allowed_symbols"] = frozenset(wanted)
    return changes


@routes.patch("/trading/accounts/{account_id}")
async def update_account(request: web.Request) -> web.Response:
    """Change ``name``, ``max_request_age`` (1 to 86400 s) and ``allowed_symbols`` (symbols
    the broker lists; empty means all of them)."""
    principal = await authenticate(request)
    account = await _own_account(request, principal)
    body = await _body(request, principal, AuditAction.ACCOUNT_UPDATED)
    changes = await _changes(request, principal, account, body)
    updated = attrs.evolve(account, **changes)
    await request.app[SERVICES].accounts.save(updated)
    await _audit(
        request, AuditAction.ACCOUNT_UPDATED, principal, account.id, {"fields": sorted(changes)}
    )
    return views.json_response(views.account(updated))


@routes.delete("/trading/accounts/{account_id}")
async def delete_account(request: web.Request) -> web.Response:
    """The account stops at once: its webhook URL answers 404 from now on."""
    principal = await authenticate(request)
    account = await _own_account(request, principal)
    await request.app[SERVICES].accounts.save(attrs.evolve(account, deleted=True))
    await _audit(request, AuditAction.ACCOUNT_DELETED, principal, account.id)
    return web.Response(status=204)


@routes.post("/trading/accounts/{account_id}/webhook-secret")
async def regenerate_secret(request: web.Request) -> web.Response:
    principal = await authenticate(request, browser_session=True)
    account = await _own_account(request, principal)
    secret = await request.app[SERVICES].provisioning.regenerate_secret(account)
    await _audit(request, AuditAction.WEBHOOK_SECRET_REGENERATED, principal, account.id)
    return views.json_response({"webhook_secret": secret})


@routes.post("/trading/accounts/{account_id}/webhook-token")
async def rotate_token(request: web.Request) -> web.Response:
    principal = await authenticate(request, browser_session=True)
    account = await _own_account(request, principal)
    token = await request.app[SERVICES].provisioning.rotate_token(account)
    await _audit(request, AuditAction.WEBHOOK_TOKEN_ROTATED, principal, account.id)
    base = request.app[CONFIG].public_base_url
    return views.json_response({"webhook_url": webhook_url(base, token)})


@routes.post("/trading/accounts/{account_id}/verify-credentials")
async def verify_credentials(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    account = await _own_account(request, principal)
    services = request.app[SERVICES]
    reason = await services.brokers.verify_credentials(account)
    if reason is not None:
        raise await audit_refusal(
            request,
            AuditAction.ACCOUNT_UPDATED,
            fail(400, "credentials_rejected", reason).rejected,
            user_id=principal.user_id,
            metadata={"trading_account_id": account.id},
        )
    if not account.credentials_verified:
        await services.accounts.save(attrs.evolve(account, credentials_verified=True))
    await _audit(
        request, AuditAction.ACCOUNT_UPDATED, principal, account.id, {"credentials_verified": True}
    )
    return views.json_response({"verified": True})


@routes.get("/trading/accounts/{account_id}/positions")
async def positions(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    account = await _own_account(request, principal)
    try:
        held = await request.app[SERVICES].brokers.positions(account)
    except Exception:
        raise fail(503, "broker_unavailable", "The broker could not be reached") from None
    return views.json_response(
        {
            "trading_account_id": account.id,
            "positions": [
                {"symbol": symbol, "quantity": views.decimal(quantity)}
                for symbol, quantity in sorted(held.items())
                if quantity
            ],
        }
    )
