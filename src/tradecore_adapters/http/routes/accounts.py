"""``/trading/accounts``: the HTTP face of ``TradingAccounts`` and ``AccountCredentials``
(parse, call, render), plus the account's positions.

An account's webhook URL and secret are in the answer only when they are issued (create,
regenerate, rotate); broker credentials are in no answer at all. Another user's account is
404. Body: ``credentials`` (a JSON object of strings, for development) or
``encrypted_credentials`` (sealed with ``GET /auth/public-key``), never both.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tradecore.audit import AuditAction
from tradecore.errors import CredentialsRejected
from tradecore.services.accounts.provisioning import webhook_url
from tradecore.services.vocabulary import Principal, Rejected
from tradecore_adapters.http import views
from tradecore_adapters.http.bodies import json_object
from tradecore_adapters.http.principal import audit_refusal, authenticate
from tradecore_adapters.http.problems import Problem, fail
from tradecore_adapters.http.state import CONFIG, SERVICES, request_context

routes = web.RouteTableDef()


async def _body(request: web.Request, principal: Principal, action: AuditAction) -> dict[str, Any]:
    try:
        return await json_object(request)
    except Problem as e:
        raise await audit_refusal(request, action, e.rejected, user_id=principal.user_id) from None


@routes.get("/trading/accounts")
async def list_accounts(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    accounts = await request.app[SERVICES].trading_accounts.list_accounts(principal)
    if isinstance(accounts, Rejected):
        raise Problem(accounts)
    return views.json_response({"items": [views.account(a) for a in accounts]})


@routes.post("/trading/accounts")
async def create_account(request: web.Request) -> web.Response:
    """201 with the account and, this once, its webhook URL and secret."""
    principal = await authenticate(request, browser_session=True)
    body = await _body(request, principal, AuditAction.ACCOUNT_CREATED)
    created = await request.app[SERVICES].trading_accounts.create(
        principal,
        body.get("name"),
        body.get("broker"),
        body.get("credentials"),
        body.get("encrypted_credentials"),
        request_context(request),
        testnet=body.get("testnet", False),
        symbol_map=body.get("symbol_map"),
    )
    if isinstance(created, Rejected):
        raise Problem(created)
    return views.json_response(
        {
            "account": views.account(created.account),
            "webhook_url": created.webhook_url(request.app[CONFIG].public_base_url),
            "webhook_secret": created.webhook_secret,
        },
        status=201,
    )


@routes.get("/trading/accounts/{account_id}")
async def get_account(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    account = await request.app[SERVICES].trading_accounts.get(
        principal, request.match_info["account_id"]
    )
    if isinstance(account, Rejected):
        raise Problem(account)
    return views.json_response(views.account(account))


@routes.patch("/trading/accounts/{account_id}")
async def update_account(request: web.Request) -> web.Response:
    """Change ``name``, ``max_request_age``, ``allowed_symbols``, ``symbol_map``, ``testnet``
    or the broker credentials."""
    principal = await authenticate(request)
    body = await _body(request, principal, AuditAction.ACCOUNT_UPDATED)
    updated = await request.app[SERVICES].trading_accounts.update(
        principal, request.match_info["account_id"], body, request_context(request)
    )
    if isinstance(updated, Rejected):
        raise Problem(updated)
    return views.json_response(views.account(updated))


@routes.delete("/trading/accounts/{account_id}")
async def delete_account(request: web.Request) -> web.Response:
    """The account stops at once: its webhook URL answers 404 from now on."""
    principal = await authenticate(request)
    refused = await request.app[SERVICES].trading_accounts.delete(
        principal, request.match_info["account_id"], request_context(request)
    )
    if refused is not None:
        raise Problem(refused)
    return web.Response(status=204)


@routes.post("/trading/accounts/{account_id}/webhook-secret")
async def regenerate_secret(request: web.Request) -> web.Response:
    principal = await authenticate(request, browser_session=True)
    secret = await request.app[SERVICES].account_credentials.regenerate_secret(
        principal, request.match_info["account_id"], request_context(request)
    )
    if isinstance(secret, Rejected):
        raise Problem(secret)
    return views.json_response({"webhook_secret": secret})


@routes.post("/trading/accounts/{account_id}/webhook-token")
async def rotate_token(request: web.Request) -> web.Response:
    principal = await authenticate(request, browser_session=True)
    token = await request.app[SERVICES].account_credentials.rotate_token(
        principal, request.match_info["account_id"], request_context(request)
    )
    if isinstance(token, Rejected):
        raise Problem(token)
    return views.json_response(
        {"webhook_url": webhook_url(request.app[CONFIG].public_base_url, token)}
    )


@routes.post("/trading/accounts/{account_id}/verify-credentials")
async def verify_credentials(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    verified = await request.app[SERVICES].account_credentials.verify_credentials(
        principal, request.match_info["account_id"], request_context(request)
    )
    if isinstance(verified, Rejected):
        raise Problem(verified)
    return views.json_response({"verified": True})


@routes.get("/trading/accounts/{account_id}/positions")
async def positions(request: web.Request) -> web.Response:
    principal = await authenticate(request)
    services = request.app[SERVICES]
    account = await services.trading_accounts.get(principal, request.match_info["account_id"])
    if isinstance(account, Rejected):
        raise Problem(account)
    try:
        held = await services.brokers.positions(account)
    except CredentialsRejected as e:
        reason = str(e) or "The broker refused the credentials"
        raise fail(400, "credentials_rejected", reason) from None
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


@routes.get("/trading/accounts/{account_id}/instruments")
async def instruments(request: web.Request) -> web.Response:
    """The instruments of the account's venue, for the order form (the paper catalogue for
    paper accounts)."""
    principal = await authenticate(request)
    listed = await request.app[SERVICES].trading_accounts.instruments(
        principal, request.match_info["account_id"]
    )
    if isinstance(listed, Rejected):
        raise Problem(listed)
    return views.json_response(
        {"trading_account_id": request.match_info["account_id"], "symbols": sorted(listed)}
    )
