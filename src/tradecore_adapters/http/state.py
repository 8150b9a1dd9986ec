"""Typed application and request state: what the handlers reach, and under which keys.

``Services`` is everything the composition root hands to ``create_app``: the core's use cases,
the repositories the read endpoints page through, the service's transport key for broker
credentials, and two small ports of this adapter (``AccountBroker`` and ``Readiness``) that
the root implements for its adapter set.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Protocol, runtime_checkable

import attrs
from aiohttp import web

from tradecore.accounts import TradingAccount
from tradecore.audit import RequestContext
from tradecore.ports.broker import InstrumentDirectory
from tradecore.ports.crypto import TransportKey
from tradecore.ports.repositories import AuditLog, OrderHistory, TradingAccountRepository
from tradecore.ports.runtime import Clock
from tradecore.services.accounts.account_credentials import AccountCredentials
from tradecore.services.accounts.provisioning import Provisioning
from tradecore.services.accounts.trading_accounts import TradingAccounts
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.execution.deployment_status import DeploymentStatus
from tradecore.services.identity.allowed_ips import AllowedIps
from tradecore.services.identity.api_keys import ApiKeys
from tradecore.services.identity.first_run_setup import FirstRunSetup
from tradecore.services.identity.login import PasswordLogin
from tradecore.services.identity.password_reset import PasswordReset
from tradecore.services.identity.registration import Registration
from tradecore.services.identity.request_authentication import RequestAuthenticator
from tradecore.services.identity.session_lifetime import SessionLifetime
from tradecore.services.orders.dashboard_order import DashboardOrders
from tradecore.services.orders.history_reads import HistoryReads
from tradecore.services.orders.webhook_intake import WebhookIntake
from tradecore_adapters.http.config import HttpConfig


@runtime_checkable
class AccountBroker(Protocol):
    """Broker calls the account endpoints need, made on the account's own connection."""

    async def positions(self, account: TradingAccount) -> Mapping[str, Decimal]:
        """Signed positions by symbol (flat symbols omitted). Raises on an unreachable broker."""
        ...


@runtime_checkable
class Readiness(Protocol):
    """``GET /health/ready``: whether the stores answer."""

    async def ready(self) -> bool: ...


@attrs.frozen
class Services:
    """The use cases and stores the HTTP layer calls."""

    password_login: PasswordLogin
    session_lifetime: SessionLifetime
    authentication: RequestAuthenticator
    registration: Registration
    password_reset: PasswordReset
    api_keys: ApiKeys
    allowed_ips: AllowedIps
    webhooks: WebhookIntake
    dashboard: DashboardOrders
    provisioning: Provisioning
    events: SecurityEvents
    accounts: TradingAccountRepository
    orders: OrderHistory
    audit: AuditLog
    instruments: InstrumentDirectory
    brokers: AccountBroker
    readiness: Readiness
    clock: Clock
    trading_accounts: TradingAccounts
    account_credentials: AccountCredentials
    transport_key: TransportKey
    history_reads: HistoryReads
    setup: FirstRunSetup
    deployment: DeploymentStatus


SERVICES = web.AppKey("services", Services)
CONFIG = web.AppKey("config", HttpConfig)
OPENAPI = web.AppKey("openapi", bytes)

CLIENT_IP = web.RequestKey("client_ip", str)
CSRF_PRESENTED = web.RequestKey("csrf_presented", str)


def request_context(request: web.Request) -> RequestContext:
    """The audit facts of ``request``: client IP (through the trusted proxies), User-Agent,
    path and method. The User-Agent is cut to 512 characters."""
    return RequestContext(
        ip_address=request[CLIENT_IP],
        user_agent=request.headers.get("User-Agent", "")[:512],
        request_path=redact_path(request.path),
        request_method=request.method,
    )


_WEBHOOK_SEGMENT = re.compile(r"(/webhook/)[^/?#]*", re.IGNORECASE)


def redact_path(path: str) -> str:
    """``path`` with every segment after ``/webhook/`` replaced by ``<token>``, wherever it
    appears, for logs and audit rows: a URL token never reaches either."""
    return _WEBHOOK_SEGMENT.sub(r"\1<token>", path)
