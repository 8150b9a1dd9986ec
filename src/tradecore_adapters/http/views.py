"""JSON shapes of the response bodies (docs/api.md "Bodies"; the OpenAPI file mirrors them).

Decimals (quantities, prices, positions) are JSON strings in plain notation (``"0.5"``,
``"-2"``), so no client loses precision to binary floating point. Times are ISO 8601 in UTC.
Nothing here ever renders a token, secret, hash or password.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from aiohttp import web

from tradecore.accounts import TradingAccount
from tradecore.audit import StoredAuditEntry
from tradecore.identity import AllowedIp, ApiKey, Plan, User
from tradecore.orders import OrderError, OrderHistoryRecord, OrderResult
from tradecore.services.orders.outcomes import Queued
from tradecore.webhooks.canonical import canonical_quantity


def decimal(value: Decimal) -> str:
    """A Decimal as a plain-notation string without trailing zeros."""
    return canonical_quantity(value)


def maybe_decimal(value: Decimal | None) -> str | None:
    return None if value is None else decimal(value)


def timestamp(value: datetime | None) -> str | None:
    if value is None:
        return None
    aware = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return aware.isoformat().replace("+00:00", "Z")


def json_response(
    body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(body, separators=(",", ":"), default=str).encode(),
        content_type="application/json",
        headers=headers,
    )


def order_error(error: OrderError | None) -> dict[str, Any] | None:
    if error is None:
        return None
    body: dict[str, Any] = {"code": error.code.value, "message": error.message}
    if error.retry_after is not None:
        body["retry_after"] = error.retry_after
    if error.broker_message is not None:
        body["broker_message"] = error.broker_message
    return body


def order_result(result: OrderResult) -> dict[str, Any]:
    """OrderResult: ``order_id`` is the order-history id."""
    return {
        "order_id": result.order_id,
        "request_id": result.request_id,
        "status": result.status.value,
        "symbol": result.symbol,
        "action": result.action.value,
        "quantity": decimal(result.quantity),
        "filled_quantity": decimal(result.filled_quantity),
        "fill_price": maybe_decimal(result.fill_price),
        "auto_exit": result.auto_exit,
        "exit_quantity": decimal(result.exit_quantity),
        "position_before": decimal(result.position_before),
        "simulation": result.simulation,
        "error": order_error(result.error),
        "broker_refs": list(result.broker_refs),
    }


def queued(outcome: Queued) -> dict[str, Any]:
    return {
        "order_id": outcome.order_id,
        "request_id": outcome.request_id,
        "status": "queued",
        "poll": outcome.poll,
    }


def history_item(row: OrderHistoryRecord) -> dict[str, Any]:
    """An order-history row with the specification's names plus ``id`` and ``created_at``;
    ``order_id`` is the broker's id of the main order (null until placed)."""
    return {
        "id": row.id,
        "created_at": timestamp(row.created_at),
        "request_id": row.request_id,
        "symbol": row.symbol,
        "action": row.action.value,
        "quantity": decimal(row.quantity),
        "order_type": None if row.order_type is None else row.order_type.value,
        "source": row.source.value,
        "order_id": row.order_id,
        "broker_refs": list(row.broker_refs),
        "status": row.status.value,
        "submitted_at": timestamp(row.submitted_at),
        "fill_price": maybe_decimal(row.fill_price),
        "fill_quantity": decimal(row.fill_quantity),
        "filled_at": timestamp(row.filled_at),
        "admitted_at": timestamp(row.admitted_at),
        "placed_at": timestamp(row.placed_at),
        "auto_exit": row.auto_exit,
        "exit_quantity": decimal(row.exit_quantity),
        "position_before": maybe_decimal(row.position_before),
        "exit_order_result": None if row.exit_order_result is None else dict(row.exit_order_result),
        "user_id": row.user_id,
        "trading_account_id": row.trading_account_id,
        "broker_name": row.broker_name,
        "simulation": row.simulation,
        "error": order_error(row.error),
    }


def user(user: User, *, plan: Plan, terms_version: str) -> dict[str, Any]:
    """The user object of login, register and ``/auth/me``. ``plan`` is the plan in force
    (an expired subscription shows ``free``)."""
    return {
        "id": user.id,
        "email": user.email,
        "plan": plan.value,
        "subscription_expires_at": timestamp(user.subscription_expires_at),
        "accepted_terms_version": user.accepted_terms_version,
        "terms_accepted": user.accepted_terms_version == terms_version,
        "current_terms_version": terms_version,
        "created_at": timestamp(user.created_at),
        "is_admin": user.is_admin,
    }


def account(account: TradingAccount) -> dict[str, Any]:
    """A trading account, never its webhook token or secret, nor its broker credentials
    (``has_credentials`` says only whether some are stored)."""
    return {
        "id": account.id,
        "name": account.name,
        "broker": account.broker_name,
        "testnet": account.testnet,
        "symbol_map": dict(sorted(account.symbol_map.items())),
        "max_request_age": account.max_request_age,
        "allowed_symbols": sorted(account.allowed_symbols),
        "max_quantity": decimal(account.max_quantity),
        "credentials_verified": account.credentials_verified,
        "has_credentials": account.encrypted_credentials is not None,
        "created_at": timestamp(account.created_at),
    }


def api_key(key: ApiKey, now: datetime) -> dict[str, Any]:
    """An API key's record (its display prefix, never the key or its hash)."""
    return {
        "id": key.id,
        "name": key.name,
        "prefix": key.prefix,
        "created_at": timestamp(key.created_at),
        "expires_at": timestamp(key.expires_at),
        "last_used_at": timestamp(key.last_used_at),
        "revoked_at": timestamp(key.revoked_at),
        "active": key.is_usable(now),
    }


def allowed_ip(entry: AllowedIp) -> dict[str, Any]:
    return {
        "id": entry.id,
        "ip_address": entry.ip_address,
        "created_at": timestamp(entry.created_at),
    }


def security_event(stored: StoredAuditEntry) -> dict[str, Any]:
    entry = stored.entry
    metadata = dict(entry.metadata)
    account_id = metadata.get("trading_account_id")
    return {
        "id": stored.id,
        "action": entry.action.value,
        "ip_address": entry.context.ip_address,
        "user_agent": entry.context.user_agent,
        "request_path": entry.context.request_path,
        "created_at": timestamp(entry.created_at),
        "trading_account_id": account_id if isinstance(account_id, str) else None,
        "metadata": metadata,
    }
