"""Helpers for flow tests: webhook bodies, request contexts, a provisioned trader, a queued
order row and the request the API pushes for it."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import argon2
import attrs

from tradecore.audit import AuditAction, RequestContext
from tradecore.identity import Plan, User
from tradecore.orders import (
    AlertAction,
    OrderHistoryRecord,
    OrderRequest,
    OrderStatus,
    OrderType,
    Source,
)
from tradecore.ports.broker import Broker, BrokerAccount, BrokerFactory, BrokerOrder
from tradecore.ports.repositories import OrderHistory
from tradecore.services.accounts.provisioning import NewAccount
from tradecore.services.execution.worker import UserWorker
from tradecore.testing.clock import FakeClock, FakeSleeper
from tradecore_adapters.crypto.passwords import Argon2PasswordHasher
from tradecore_adapters.memory.fifo import MemoryFillTaskQueue
from tradecore_entrypoints.system import System

ATTACKER_IP = "198.51.100.66"
USER_IP = "203.0.113.7"


def context(ip: str = USER_IP, path: str = "/webhook/token/order") -> RequestContext:
    return RequestContext(
        ip_address=ip, user_agent="TradingView-Webhook", request_path=path, request_method="POST"
    )


def webhook_body(
    secret: str | None,
    timestamp: datetime | str | None,
    *,
    action: str = "buy",
    symbol: str = "BTCUSDT",
    quantity: Any = 1,
    order_type: str | None = None,
    **extra: Any,
) -> bytes:
    """A webhook body as TradingView would post it (fields left None are omitted)."""
    fields: dict[str, Any] = {"action": action, "symbol": symbol, "quantity": quantity}
    if timestamp is not None:
        fields["timestamp"] = timestamp if isinstance(timestamp, str) else timestamp.isoformat()
    if secret is not None:
        fields["secret"] = secret
    if order_type is not None:
        fields["order_type"] = order_type
    fields.update(extra)
    return json.dumps(fields).encode()


@attrs.define
class Trader:
    """A provisioned user with one verified paper account."""

    system: System
    user: User
    account: NewAccount

    @property
    def token(self) -> str:
        return self.account.webhook_token

    @property
    def secret(self) -> str:
        return self.account.webhook_secret

    def body(self, **kwargs: Any) -> bytes:
        kwargs.setdefault("timestamp", self.system.clock.now())
        return webhook_body(self.secret, **kwargs)

    async def send(self, body: bytes, *, simulation: bool = False, ip: str = USER_IP) -> Any:
        return await self.system.webhooks.handle(
            self.token, body, simulation=simulation, context=context(ip)
        )

    def position(self, symbol: str = "BTCUSDT") -> Decimal:
        return self.system.exchange.position(self.account.account.id, symbol)

    def audit_actions(self) -> list[AuditAction]:
        return [s.entry.action for s in self.system.audit.all() if s.entry.user_id == self.user.id]


def fast_hasher() -> Argon2PasswordHasher:
    """Argon2id with tiny costs: the tests check the flows, not the hashing cost."""
    return Argon2PasswordHasher(
        hasher=argon2.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)
    )


async def make_trader(
    system: System,
    email: str = "ada@example.com",
    *,
    plan: Plan = Plan.PRO,
    terms: str | None = "1",
    verified: bool = True,
) -> Trader:
    user = await system.provisioning.create_user(
        email, "correct horse battery staple", plan=plan, terms_version=terms
    )
    account = await system.provisioning.create_account(user, "Main", credentials_verified=verified)
    return Trader(system, user, account)


def queued_row(
    order_id: str, *, user_id: str, account_id: str, created_at: datetime
) -> OrderHistoryRecord:
    """A queued order-history row: a real BTCUSDT buy entry of 1 on the paper broker."""
    return OrderHistoryRecord(
        id=order_id,
        user_id=user_id,
        trading_account_id=account_id,
        broker_name="paper",
        symbol="BTCUSDT",
        action=AlertAction.BUY,
        quantity=Decimal(1),
        order_type=OrderType.ENTRY,
        source=Source.WEBHOOK,
        simulation=False,
        status=OrderStatus.QUEUED,
        created_at=created_at,
        request_id=f"req-{order_id}",
    )


def request_for(
    row: OrderHistoryRecord, *, expires_in_s: float = 60.0, broker_name: str | None = "paper"
) -> OrderRequest:
    """The request the API pushes for ``row`` (``broker_name`` None: an older API's payload)."""
    request = row.to_request(expires_at=row.created_at + timedelta(seconds=expires_in_s))
    return attrs.evolve(request, broker_name=broker_name)


@attrs.frozen
class WaitingSave:
    """A save handed to an order's outcome (``SavesWithOrder.save_with_order``), as a fake of
    that port keeps it."""

    documents: Callable[[], Mapping[str, dict[str, Any]]]
    saved: Callable[[], None]
    discarded: Callable[[], None]


def worker_over(
    user_id: str, orders: OrderHistory, brokers: BrokerFactory, clock: FakeClock
) -> UserWorker:
    """``user_id``'s worker over ``orders`` and ``brokers``: fill checks on a memory queue,
    time on ``clock``, no stored broker accounts (the paper broker needs none)."""
    return UserWorker(
        user_id,
        orders,
        brokers,
        MemoryFillTaskQueue(clock),
        clock,
        FakeSleeper(clock),
        accounts=NO_ACCOUNTS,
    )


class AfterPlacing:
    """A broker factory whose brokers run ``then(client_order_id)`` right after each
    placement went out: the broker accepted (and recorded) it, and ``then`` may raise so that
    its answer is lost (a crash, a dropped line)."""

    def __init__(self, inner: BrokerFactory, then: Callable[[str], None]) -> None:
        self._inner = inner
        self._then = then

    def open(self, account: BrokerAccount, *, simulation: bool) -> Broker:
        broker = self._inner.open(account, simulation=simulation)
        original = broker.place_order

        async def place_then(client_order_id: str, *args: Any, **kwargs: Any) -> BrokerOrder:
            placed = await original(client_order_id, *args, **kwargs)
            self._then(client_order_id)
            return placed

        broker.place_order = place_then  # type: ignore[method-assign]
        return broker

    def venues(self) -> frozenset[str]:
        return self._inner.venues()


class NoStoredAccounts:
    """A ``BrokerAccountSource`` that stores nothing: workers open the paper broker for the
    route's account without credentials (what unit tests of the worker need)."""

    async def broker_account(self, trading_account_id: str) -> None:
        return None


NO_ACCOUNTS = NoStoredAccounts()
