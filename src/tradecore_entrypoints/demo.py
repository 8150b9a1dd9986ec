"""``tradecore demo``: a scripted walk through the embedded system.

It provisions a user with paper accounts and sends real webhook requests through the same
use case the HTTP endpoint calls: the six rows of the specification's reversal table, a
replay, a stale timestamp, a wrong secret, and an order whose fill arrives later and is
completed by fill verification. Every line it prints is read back from the system.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

from tradecore.audit import RequestContext
from tradecore.identity import Plan, User
from tradecore.orders import OrderResult, OrderStatus
from tradecore.services.accounts.provisioning import NewAccount
from tradecore.services.orders.outcomes import Accepted, OrderOutcome, Queued
from tradecore.services.vocabulary import Rejected
from tradecore_entrypoints.container import build_embedded
from tradecore_entrypoints.system import System

Echo = Callable[[str], Any]
DEMO_AUDIT_LIMIT = 10_000  # far more entries than the walk-through writes

# (starting position, alert action, quantity): the specification's position table.
REVERSAL_ROWS: tuple[tuple[int, str, int], ...] = (
    (0, "buy", 1),
    (1, "buy", 1),
    (-2, "buy", 1),
    (0, "sell", 1),
    (3, "sell", 1),
    (-1, "sell", 1),
)
SYMBOL = "BTCUSDT"
CONTEXT = RequestContext(
    ip_address="203.0.113.7",
    user_agent="TradingView-Webhook (demo)",
    request_path="/webhook/<token>/order",
    request_method="POST",
)
FILL_WAIT_S = 10.0


def _signed(value: Decimal) -> str:
    return f"{value:+}" if value else "0"


def _describe(outcome: OrderOutcome) -> str:
    if isinstance(outcome, Rejected):
        return f"HTTP {outcome.status} {outcome.detail}"
    if isinstance(outcome, Queued):
        return f"HTTP 202 queued, poll {outcome.poll}"
    result = outcome.result
    price = f" at {result.fill_price}" if result.fill_price is not None else ""
    return f"HTTP 200 {result.status} {result.filled_quantity}{price}"


class Demo:
    """One run of the walk-through."""

    def __init__(self, system: System, echo: Echo) -> None:
        self.system = system
        self.echo = echo

    def body(self, account: NewAccount, action: str, quantity: int, **changes: Any) -> bytes:
        fields: dict[str, Any] = {
            "action": action,
            "symbol": SYMBOL,
            "quantity": quantity,
            "timestamp": self.system.clock.now().isoformat(),
            "secret": account.webhook_secret,
        }
        fields.update(changes)
        return json.dumps(fields).encode()

    async def send(self, account: NewAccount, body: bytes) -> OrderOutcome:
        return await self.system.webhooks.handle(
            account.webhook_token, body, simulation=False, context=CONTEXT
        )

    def position(self, account: NewAccount) -> Decimal:
        return self.system.exchange.position(account.account.id, SYMBOL)

    async def run(self) -> None:
        user = await self.system.provisioning.create_user(
            "demo@example.com",
            "demo password, not for production",
            plan=Plan.PRO,
            terms_version="1",
        )
        self.echo(f"User {user.email} (plan pro), paper broker, symbol {SYMBOL}\n")
        await self.reversals(user)
        await self.attacks(user)
        await self.fill(user)
        await self.system.events.drain()
        await self.audit_summary()

    async def reversals(self, user: User) -> None:
        self.echo("1. Auto-reversal: the six rows of the specification's position table")
        self.echo("   position  signal              step 1 (close)   step 2    final  auto_exit")
        for number, (start, action, quantity) in enumerate(REVERSAL_ROWS, 1):
            account = await self.account(user, f"Reversal row {number}")
            self.system.exchange.set_position(account.account.id, SYMBOL, Decimal(start))
            outcome = await self.send(account, self.body(account, action, quantity))
            result = _result(outcome)
            signal = f"{'long' if action == 'buy' else 'short'}_entry {action} {quantity}"
            close = f"{action} {result.exit_quantity} (close)" if result.exit_quantity else "none"
            entry = f"{action} {quantity}"
            self.echo(
                f"   {_signed(result.position_before):>8}  {signal:<18}  {close:<15}  "
                f"{entry:<8}  {_signed(self.position(account)):>5}  {result.auto_exit}"
            )
        self.echo("")

    async def attacks(self, user: User) -> None:
        self.echo("2. The four webhook layers")
        account = await self.account(user, "Main")
        body = self.body(account, "buy", 1)
        self.echo(f"   alert                     -> {_describe(await self.send(account, body))}")
        self.echo(f"   the same body again       -> {_describe(await self.send(account, body))}")
        stale = (self.system.clock.now() - timedelta(minutes=10)).isoformat()
        outcome = await self.send(account, self.body(account, "buy", 1, timestamp=stale))
        self.echo(f"   timestamp 10 minutes old  -> {_describe(outcome)}")
        outcome = await self.send(account, self.body(account, "buy", 1, secret="guessed"))  # noqa: S106
        self.echo(f"   wrong secret              -> {_describe(outcome)}")
        outcome = await self.system.webhooks.handle(
            "unknown-token", body, simulation=False, context=CONTEXT
        )
        self.echo(f"   unknown URL token         -> {_describe(outcome)}")
        outcome = await self.send(account, b'{"action": "buy", "quantity": NaN}')
        self.echo(f"   malformed body            -> {_describe(outcome)}")
        self.echo(f"   position of the account   =  {_signed(self.position(account))}\n")

    async def fill(self, user: User) -> None:
        self.echo("3. A fill that arrives later, completed by fill verification")
        account = await self.account(user, "Slow fills")
        self.system.exchange.delay_next_fill(1)
        outcome = await self.send(account, self.body(account, "sell", 2))
        result = _result(outcome)
        self.echo(f"   alert                     -> {_describe(outcome)}")
        self.echo("   waiting for the first check (2-3 s after placement) ...")
        row = await self.system.orders.get(result.order_id)
        deadline = asyncio.get_running_loop().time() + FILL_WAIT_S
        while row is not None and row.status is not OrderStatus.FILLED:
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
            row = await self.system.orders.get(result.order_id)
        if row is not None:
            self.echo(
                f"   order history             =  {row.status} {row.fill_quantity}"
                f" at {row.fill_price}, filled at {row.filled_at:%H:%M:%S}\n"
                if row.filled_at
                else f"   order history             =  {row.status}\n"
            )

    async def audit_summary(self) -> None:
        entries = await self.system.audit.chain(limit=DEMO_AUDIT_LIMIT)
        counts = Counter(stored.entry.action.value for stored in entries)
        self.echo("4. Audit log and alerts")
        for action, count in sorted(counts.items()):
            self.echo(f"   {action:<28} {count}")
        for mail in self.system.outbox.sent:
            self.echo(f"   alert mail to {mail.to}: {mail.subject}")
        self.echo("   (one alert mail per user per 30 minutes; the later attacks were throttled)")

    async def account(self, user: User, name: str) -> NewAccount:
        return await self.system.provisioning.create_account(user, name, credentials_verified=True)


def _result(outcome: OrderOutcome) -> OrderResult:
    if not isinstance(outcome, Accepted):
        raise RuntimeError(f"demo order not executed: {_describe(outcome)}")
    return outcome.result


async def run_demo(echo: Echo) -> None:
    """Build the embedded system, run the walk-through, and stop it."""
    system = build_embedded()
    async with system.running():
        await Demo(system, echo).run()
