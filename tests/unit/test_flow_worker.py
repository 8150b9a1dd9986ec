"""Worker-side flows on the embedded system: the hand-off, 202, crash recovery, expiry,
reconnects, idle retirement, and fill verification through the worker."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest
from support import Trader, make_trader

from tradecore.broker import Broker
from tradecore.orders import OrderStatus, RejectionCode
from tradecore.services.outcomes import Accepted, Queued, Rejected
from tradecore.services.settings import OrderSettings
from tradecore.services.worker import UserWorker
from tradecore.testing.clock import FakeClock, FakeSleeper
from tradecore_adapters.brokers.registry import PaperBrokerFactory
from tradecore_entrypoints.embedded import EmbeddedSystem


class Crash(Exception):
    """Stands for the worker process dying."""


class CrashAfterPlacing:
    """A broker factory whose brokers die right after the broker accepted an order."""

    def __init__(self, inner: PaperBrokerFactory) -> None:
        self._inner = inner

    def open(self, trading_account_id: str, broker_name: str, *, simulation: bool) -> Broker:
        broker = self._inner.open(trading_account_id, broker_name, simulation=simulation)
        original = broker.place_order

        async def place_then_die(*args, **kwargs):  # type: ignore[no-untyped-def]
            await original(*args, **kwargs)
            raise Crash

        broker.place_order = place_then_die  # type: ignore[method-assign]
        return broker


def factory(system: EmbeddedSystem) -> PaperBrokerFactory:
    return PaperBrokerFactory(system.exchange, system.simulation_exchange, system.clock)


async def queued_order(system: EmbeddedSystem, trader: Trader) -> Queued:
    """An order whose worker is marked active but not serving: it stays in the list."""
    await system.directory.mark_active(trader.user.id, 3600)
    outcome = await trader.send(trader.body())
    assert isinstance(outcome, Queued)
    return outcome


@pytest.mark.parametrize("settings", [OrderSettings(webhook_wait_s=0.01)])
async def test_slow_worker_gives_202_and_the_order_still_executes_once(
    embedded: EmbeddedSystem,
) -> None:
    trader = await make_trader(embedded)
    queued = await queued_order(embedded, trader)
    row = await embedded.orders.get(queued.order_id)
    assert row is not None and row.status is OrderStatus.QUEUED  # durable before the 202

    async with embedded.running(verify_fills=False):
        embedded.host.activate(trader.user.id)
        result = await embedded.queue.wait_result(queued.request_id, 5)

    assert result is not None and result.status is OrderStatus.FILLED
    assert trader.position() == Decimal(1)
    assert len(embedded.exchange.orders(trader.account.account.id)) == 1


@pytest.mark.parametrize("settings", [OrderSettings(worker_start_timeout_s=0.02)])
async def test_worker_that_never_starts_gives_503_and_the_resend_goes_through(
    embedded: EmbeddedSystem,
) -> None:
    trader = await make_trader(embedded)
    body = trader.body()

    refused = await trader.send(body)  # no worker host runs

    assert isinstance(refused, Rejected) and refused.status == 503
    (row,) = await embedded.orders.list_for_user(trader.user.id)
    assert row.status is OrderStatus.CANCELLED and row.fingerprint is None
    async with embedded.running(verify_fills=False):
        resent = await trader.send(body)  # TradingView resends the same body on a 5xx
    assert isinstance(resent, Accepted)
    assert trader.position() == Decimal(1)


@pytest.mark.parametrize("settings", [OrderSettings(webhook_wait_s=0.01)])
async def test_crash_mid_order_is_recovered_without_a_second_broker_order(
    embedded: EmbeddedSystem, clock: FakeClock
) -> None:
    trader = await make_trader(embedded)
    account_id = trader.account.account.id
    embedded.exchange.set_position(account_id, "BTCUSDT", Decimal(-2))  # forces close + entry
    queued = await queued_order(embedded, trader)
    request = await embedded.queue.take(trader.user.id, 0.1)
    assert request is not None
    dying = UserWorker(
        trader.user.id,
        embedded.orders,
        CrashAfterPlacing(factory(embedded)),
        embedded.fill_tasks,
        clock,
        FakeSleeper(clock),
    )

    with pytest.raises(Crash):
        await dying.execute(request)  # the close reached the broker, then the process died

    row = await embedded.orders.get(queued.order_id)
    assert row is not None and row.status is OrderStatus.SUBMITTED
    assert [r.order_id for r in await embedded.queue.in_flight(trader.user.id)] == [queued.order_id]
    async with embedded.running(verify_fills=False):
        embedded.host.activate(trader.user.id)  # a new worker starts and recovers
        result = await embedded.queue.wait_result(queued.request_id, 5)

    assert result is not None and result.status is OrderStatus.FILLED
    assert result.auto_exit and result.exit_quantity == Decimal(2)
    assert result.position_before == Decimal(-2)
    assert trader.position() == Decimal(1)
    orders = embedded.exchange.orders(account_id)
    assert len(orders) == 2  # one close, one entry: nothing doubled
    assert await embedded.queue.in_flight(trader.user.id) == []


@pytest.mark.parametrize("settings", [OrderSettings(webhook_wait_s=0.01, max_queue_age_s=60)])
async def test_order_that_waited_past_its_age_expires_instead_of_executing_late(
    embedded: EmbeddedSystem, clock: FakeClock
) -> None:
    trader = await make_trader(embedded)
    queued = await queued_order(embedded, trader)
    clock.advance(61)

    async with embedded.running(verify_fills=False):
        embedded.host.activate(trader.user.id)
        result = await embedded.queue.wait_result(queued.request_id, 5)

    assert result is not None and result.status is OrderStatus.EXPIRED
    assert result.error is not None and result.error.code is RejectionCode.ORDER_EXPIRED
    assert embedded.exchange.orders(trader.account.account.id) == []


async def test_broker_disconnect_is_survived_by_reconnecting(trader: Trader) -> None:
    trader.system.exchange.disconnect(refuse_reconnects=2)

    outcome = await trader.send(trader.body())

    assert isinstance(outcome, Accepted) and outcome.result.status is OrderStatus.FILLED
    assert trader.position() == Decimal(1)


async def test_broker_gone_for_good_fails_the_order_without_placing(trader: Trader) -> None:
    trader.system.exchange.disconnect(refuse_reconnects=100)

    outcome = await trader.send(trader.body())

    assert isinstance(outcome, Accepted)
    assert outcome.result.status is OrderStatus.FAILED
    assert outcome.result.error is not None
    assert outcome.result.error.code is RejectionCode.BROKER_UNAVAILABLE
    assert trader.position() == 0


async def test_idle_worker_retires_and_the_next_order_starts_a_new_one(
    trader: Trader, clock: FakeClock
) -> None:
    system = trader.system
    assert isinstance(await trader.send(trader.body()), Accepted)
    assert trader.user.id in system.host.active_users

    clock.advance(12 * 3600 + 1)
    for _ in range(200):
        if trader.user.id not in system.host.active_users:
            break
        await _tick()
    assert trader.user.id not in system.host.active_users
    assert not await system.directory.is_active(trader.user.id)

    clock.advance(1)
    assert isinstance(await trader.send(trader.body()), Accepted)
    assert trader.position() == Decimal(2)


async def test_delayed_fill_is_completed_by_fill_verification(
    trader: Trader, clock: FakeClock
) -> None:
    system = trader.system
    system.exchange.delay_next_fill(1)

    outcome = await trader.send(trader.body())

    assert isinstance(outcome, Accepted) and outcome.result.status is OrderStatus.PENDING
    assert await system.verifier.run_once(0) is None  # the first check waits 2-3 s
    clock.advance(3)
    decision = await system.verifier.run_once(0)
    assert decision is not None
    row = await system.orders.get(outcome.result.order_id)
    assert row is not None and row.status is OrderStatus.FILLED
    assert row.fill_quantity == Decimal(1) and row.fill_price is not None
    assert row.filled_at == clock.now()


async def test_fill_that_never_comes_is_dead_lettered_after_three_retries(
    trader: Trader, clock: FakeClock
) -> None:
    system = trader.system
    system.exchange.delay_next_fill(None)
    outcome = await trader.send(trader.body())
    assert isinstance(outcome, Accepted)

    decisions = []
    for _ in range(4):
        clock.advance(31)
        decision = await system.verifier.run_once(0)
        assert decision is not None
        decisions.append(decision)

    assert [d.dead_letter for d in decisions] == [False, False, False, True]
    (task, reason) = (await system.fill_tasks.dead_letters())[0]
    assert task.order_id == outcome.result.order_id and reason
    row = await system.orders.get(outcome.result.order_id)
    assert row is not None and row.status is OrderStatus.PENDING


async def test_simulated_order_trades_only_on_the_simulation_book(trader: Trader) -> None:
    outcome = await trader.send(trader.body(), simulation=True)

    assert isinstance(outcome, Accepted) and outcome.result.simulation
    account_id = trader.account.account.id
    assert trader.system.simulation_exchange.position(account_id, "BTCUSDT") == Decimal(1)
    assert trader.position() == 0


async def _tick() -> None:
    await asyncio.sleep(0.005)
