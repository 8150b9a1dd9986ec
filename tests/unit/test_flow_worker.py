"""Worker-side flows on the embedded system: the hand-off, 202, crash recovery, expiry,
reconnects, idle retirement, fill verification through the worker, and the per-user lease
shared by several worker hosts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from decimal import Decimal

import pytest
from support import NO_ACCOUNTS, AfterPlacing, Trader, make_trader

from tradecore.audit import AuditAction
from tradecore.orders import OrderRequest, OrderResult, OrderStatus, RejectionCode
from tradecore.services.execution.worker import UserWorker
from tradecore.services.execution.worker_host import HostSettings, WorkerHost
from tradecore.services.orders.outcomes import Accepted, Queued
from tradecore.services.orders.settings import OrderSettings
from tradecore.services.vocabulary import Rejected
from tradecore.testing.clock import FakeClock, FakeSleeper
from tradecore_adapters.brokers.registry import PaperBrokerFactory
from tradecore_entrypoints.system import System


class Crash(Exception):
    """Stands for the worker process dying."""


def die(_: str) -> None:
    """After any placement: the worker dies before it hears the broker's answer."""
    raise Crash


def factory(system: System) -> PaperBrokerFactory:
    return PaperBrokerFactory(system.exchange, system.simulation_exchange, system.clock)


FOREIGN_HOLDER = "host-elsewhere:1:x"


async def queued_order(system: System, trader: Trader) -> tuple[Queued, int]:
    """An order whose user's lease another host holds without serving: it stays in the list.
    Returns it with that lease's token; releasing the lease lets this system's host serve."""
    token = await system.directory.acquire(trader.user.id, FOREIGN_HOLDER, 3600)
    assert token is not None
    outcome = await trader.send(trader.body())
    assert isinstance(outcome, Queued)
    return outcome, token


@pytest.mark.parametrize("settings", [OrderSettings(webhook_wait_s=0.01)])
async def test_slow_worker_gives_202_and_the_order_still_executes_once(
    embedded: System,
) -> None:
    trader = await make_trader(embedded)
    queued, foreign = await queued_order(embedded, trader)
    row = await embedded.orders.get(queued.order_id)
    assert row is not None and row.status is OrderStatus.QUEUED  # durable before the 202

    async with embedded.running(verify_fills=False):
        await embedded.directory.release(trader.user.id, foreign)  # the other host went away
        embedded.host.activate(trader.user.id)
        result = await embedded.queue.wait_result(queued.request_id, 5)

    assert result is not None and result.status is OrderStatus.FILLED
    assert trader.position() == Decimal(1)
    assert len(embedded.exchange.orders(trader.account.account.id)) == 1


@pytest.mark.parametrize("settings", [OrderSettings(webhook_wait_s=0.04)])
async def test_an_alert_no_worker_can_take_yet_is_202_and_fills_when_a_host_runs(
    embedded: System,
) -> None:
    """Issue 16, 8: with no worker host running the webhook answered 503 after the start
    timeout (60 s; the sender gave up after 3) and the order was cancelled. Now the durable
    order waits on the user's list, the caller gets 202 within its wait, and the first host
    that runs fills it; the same alert sent again is a replay, never a second order."""
    trader = await make_trader(embedded)
    body = trader.body()

    answered = await trader.send(body)  # no worker host runs

    assert isinstance(answered, Queued)
    (row,) = await embedded.orders.list_for_user(trader.user.id)
    assert row.status is OrderStatus.QUEUED
    async with embedded.running(verify_fills=False):
        assert trader.user.id in await embedded.host.sweep()
        result = await embedded.queue.wait_result(answered.request_id, 5)
        resent = await trader.send(body)
    assert result is not None and result.status is OrderStatus.FILLED
    assert isinstance(resent, Rejected) and resent.status == 409
    assert trader.position() == Decimal(1)


@pytest.mark.parametrize("settings", [OrderSettings(webhook_wait_s=0.01)])
async def test_crash_mid_order_is_recovered_without_a_second_broker_order(
    embedded: System, clock: FakeClock
) -> None:
    trader = await make_trader(embedded)
    account_id = trader.account.account.id
    embedded.exchange.set_position(account_id, "BTCUSDT", Decimal(-2))  # forces close + entry
    queued, foreign = await queued_order(embedded, trader)
    request = await embedded.queue.take(trader.user.id, 0.1)
    assert request is not None
    dying = UserWorker(
        trader.user.id,
        embedded.orders,
        AfterPlacing(factory(embedded), die),
        embedded.fill_tasks,
        clock,
        FakeSleeper(clock),
        accounts=NO_ACCOUNTS,
    )

    with pytest.raises(Crash):
        await dying.execute(request)  # the close reached the broker, then the process died

    row = await embedded.orders.get(queued.order_id)
    assert row is not None and row.status is OrderStatus.SUBMITTED
    assert [r.order_id for r in await embedded.queue.in_flight(trader.user.id)] == [queued.order_id]
    await embedded.directory.release(trader.user.id, foreign)  # the dead host's lease ends
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
    embedded: System, clock: FakeClock
) -> None:
    trader = await make_trader(embedded)
    queued, foreign = await queued_order(embedded, trader)
    clock.advance(61)

    async with embedded.running(verify_fills=False):
        await embedded.directory.release(trader.user.id, foreign)
        embedded.host.activate(trader.user.id)
        result = await embedded.queue.wait_result(queued.request_id, 5)

    assert result is not None and result.status is OrderStatus.EXPIRED
    assert result.error is not None and result.error.code is RejectionCode.ORDER_EXPIRED
    assert embedded.exchange.orders(trader.account.account.id) == []
    # the owner finds it in the audit log too, once, naming the order and how long it waited
    expired = [s.entry for s in embedded.audit.all() if s.entry.action is AuditAction.ORDER_EXPIRED]
    assert [(e.user_id, e.resource_id, e.success) for e in expired] == [
        (trader.user.id, queued.order_id, False)
    ]
    assert expired[0].metadata["trading_account_id"] == trader.account.account.id
    assert expired[0].metadata["queued_s"] >= 61


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


# --- The lease: several hosts, one server per user ------------------------------------------


class RecordingWorker(UserWorker):
    """A real worker that notes which host executed each request, and can be held at the
    start of one (``gate`` cleared) to stand for a slow order."""

    def __init__(
        self,
        host: str,
        executed: list[str],
        gate: asyncio.Event,
        user_id: str,
        system: System,
        brokers: PaperBrokerFactory,
    ) -> None:
        super().__init__(
            user_id,
            system.orders,
            brokers,
            system.fill_tasks,
            system.clock,
            system.sleeper,
            accounts=NO_ACCOUNTS,
        )
        self._host = host
        self._executed = executed
        self._gate = gate

    async def execute(self, request: OrderRequest) -> OrderResult:
        self._executed.append(self._host)
        await self._gate.wait()
        return await super().execute(request)


def extra_host(
    system: System,
    holder: str,
    executed: list[str],
    gate: asyncio.Event | None = None,
    settings: HostSettings | None = None,
) -> WorkerHost:
    """Another worker host over the same directory, queue, order history and exchange."""
    if gate is None:
        gate = asyncio.Event()
        gate.set()
    brokers = factory(system)

    def make_worker(user_id: str) -> UserWorker:
        return RecordingWorker(holder, executed, gate, user_id, system, brokers)

    return WorkerHost(
        system.directory,
        system.queue,
        make_worker,
        system.clock,
        system.sleeper,
        settings or HostSettings(poll_s=0.005),
        holder=holder,
    )


async def settled(condition: Callable[[], bool]) -> bool:
    """Whether ``condition`` holds within a bounded number of loop turns."""
    for _ in range(200):
        if condition():
            return True
        await _tick()
    return condition()


async def test_two_hosts_told_to_serve_one_user_exactly_one_serves_then_the_other(
    embedded: System,
) -> None:
    trader = await make_trader(embedded)
    user = trader.user.id
    executed: list[str] = []
    hosts = {name: extra_host(embedded, name, executed) for name in ("host-a", "host-b")}
    for host in hosts.values():
        await host.start()
    try:
        for host in hosts.values():
            host.activate(user)  # both got a start request for the user

        def serving() -> list[str]:
            return [name for name, host in hosts.items() if user in host.active_users]

        assert await settled(lambda: len(serving()) == 1)
        (first,) = serving()
        for quantity in (1, 2):
            outcome = await trader.send(trader.body(quantity=quantity))
            assert isinstance(outcome, Accepted)
            assert outcome.result.status is OrderStatus.FILLED
        assert executed == [first, first]
        assert serving() == [first]

        await hosts[first].stop()  # its lease is released with it
        assert not await embedded.directory.is_active(user)
        outcome = await trader.send(trader.body(quantity=3))
        assert isinstance(outcome, Accepted)
        assert outcome.result.status is OrderStatus.FILLED
    finally:
        for host in hosts.values():
            await host.stop()
    (second,) = set(hosts) - {first}
    assert executed == [first, first, second]
    assert trader.position() == Decimal(6)
    assert len(embedded.exchange.orders(trader.account.account.id)) == 3


@pytest.mark.parametrize("settings", [OrderSettings(webhook_wait_s=0.01)])
async def test_a_host_leaves_a_user_whose_lease_another_holder_has(
    embedded: System,
) -> None:
    trader = await make_trader(embedded)
    user = trader.user.id
    queued, foreign = await queued_order(embedded, trader)
    async with embedded.running(verify_fills=False):
        embedded.host.activate(user)
        assert await settled(lambda: user not in embedded.host.active_users)
        assert embedded.queue.has_waiting(user)  # not taken: the holder serves it
        assert await embedded.directory.renew(user, foreign, 3600)  # and its lease is intact

        await embedded.directory.release(user, foreign)
        embedded.host.activate(user)
        result = await embedded.queue.wait_result(queued.request_id, 5)
    assert result is not None and result.status is OrderStatus.FILLED


@pytest.mark.parametrize("settings", [OrderSettings(webhook_wait_s=0.01)])
async def test_a_host_that_loses_its_lease_stops_taking_requests(
    trader: Trader, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    system = trader.system
    user = trader.user.id
    system.host.activate(user)
    assert await system.directory.wait_active(user, 5)
    # The heartbeat stalled past the lease's time to live, and another host took the user.
    clock.advance(31)
    intruder = await system.directory.acquire(user, FOREIGN_HOLDER, 3600)
    assert intruder is not None

    assert await settled(lambda: user not in system.host.active_users)
    assert any("lost its lease" in r.getMessage() for r in caplog.records)
    queued = await trader.send(trader.body())
    assert isinstance(queued, Queued)  # pushed under the intruder's lease
    for _ in range(20):
        await _tick()
    assert system.queue.has_waiting(user)  # the stale worker took nothing
    assert await system.queue.in_flight(user) == []
    assert await system.directory.renew(user, intruder, 3600)  # its lease was left alone
    assert system.exchange.orders(trader.account.account.id) == []


@pytest.mark.parametrize("settings", [OrderSettings(webhook_wait_s=0.01)])
async def test_a_lease_lost_mid_order_finishes_that_order_and_starts_no_other(
    embedded: System, clock: FakeClock
) -> None:
    trader = await make_trader(embedded)
    user = trader.user.id
    executed: list[str] = []
    gate = asyncio.Event()
    host = extra_host(embedded, "host-a", executed, gate)
    host.activate(user)
    try:
        assert await embedded.directory.wait_active(user, 5)
        first = await trader.send(trader.body(quantity=1))
        assert isinstance(first, Queued)  # held at the gate
        assert await settled(lambda: executed == ["host-a"])
        second = await trader.send(trader.body(quantity=2))
        assert isinstance(second, Queued)
        clock.advance(31)  # the order in hand outlived the lease...
        intruder = await embedded.directory.acquire(user, FOREIGN_HOLDER, 3600)
        assert intruder is not None  # ...and another host took the user

        gate.set()
        result = await embedded.queue.wait_result(first.request_id, 5)
        assert result is not None and result.status is OrderStatus.FILLED
        assert await settled(lambda: user not in host.active_users)
    finally:
        await host.stop()
    assert executed == ["host-a"]
    assert embedded.queue.has_waiting(user)  # the second order waits for the new holder
    assert await embedded.directory.renew(user, intruder, 3600)
    assert trader.position() == Decimal(1)


async def test_an_idle_worker_retires_its_lease_and_the_next_order_takes_a_new_one(
    embedded: System, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    trader = await make_trader(embedded)
    user = trader.user.id
    executed: list[str] = []
    settings = HostSettings(poll_s=0.005, idle_timeout_s=20.0)  # idle while the lease lives
    host = extra_host(embedded, "host-a", executed, settings=settings)
    await host.start()
    try:
        assert isinstance(await trader.send(trader.body(quantity=1)), Accepted)
        token = await embedded.directory.acquire(user, "host-a", 30)  # same holder: its token
        assert token is not None
        clock.advance(21)
        assert await settled(lambda: user not in host.active_users)
        assert not await embedded.directory.is_active(user)
        assert not any("lost its lease" in r.getMessage() for r in caplog.records)

        assert isinstance(await trader.send(trader.body(quantity=2)), Accepted)
        assert await embedded.directory.acquire(user, "host-a", 30) == token + 1
    finally:
        await host.stop()
    assert executed == ["host-a", "host-a"]


async def test_an_idle_worker_whose_lease_vanished_stops_without_retiring_the_new_one(
    embedded: System, clock: FakeClock
) -> None:
    trader = await make_trader(embedded)
    user = trader.user.id
    executed: list[str] = []
    settings = HostSettings(poll_s=0.005, idle_timeout_s=5.0)  # idle before a heartbeat is due
    host = extra_host(embedded, "host-a", executed, settings=settings)
    host.activate(user)
    try:
        assert await embedded.directory.wait_active(user, 5)
        token = await embedded.directory.acquire(user, "host-a", 30)  # same holder: its token
        assert token is not None
        await embedded.directory.release(user, token)  # the store lost the lease
        intruder = await embedded.directory.acquire(user, FOREIGN_HOLDER, 3600)
        assert intruder is not None and intruder > token
        clock.advance(6)
        assert await settled(lambda: user not in host.active_users)
    finally:
        await host.stop()
    assert await embedded.directory.renew(user, intruder, 3600)  # neither retired nor released


async def _tick() -> None:
    await asyncio.sleep(0.005)


@pytest.mark.parametrize("settings", [OrderSettings(webhook_wait_s=0.01)])
async def test_orders_of_a_dead_host_are_picked_up_without_waiting_for_a_new_order(
    embedded: System, clock: FakeClock
) -> None:
    trader = await make_trader(embedded)
    assert await embedded.directory.acquire(trader.user.id, FOREIGN_HOLDER, 30) is not None
    queued = await trader.send(trader.body())  # pushed to a host that then dies
    assert isinstance(queued, Queued)
    clock.advance(31)  # the dead host's lease lapses; no new order arrives

    async with embedded.running(verify_fills=False):
        assert trader.user.id in await embedded.host.sweep()
        result = await embedded.queue.wait_result(queued.request_id, 5)

    assert result is not None and result.status is OrderStatus.FILLED
    assert trader.position() == Decimal(1)


@pytest.mark.parametrize("settings", [OrderSettings(worker_start_timeout_s=2)])
async def test_a_worker_whose_lease_vanished_is_replaced_at_the_next_order(
    trader: Trader,
) -> None:
    system = trader.system
    assert isinstance(await trader.send(trader.body(quantity=1)), Accepted)
    # the key-value store lost the lease (a flush or failover) while the worker runs
    token = await system.directory.acquire(trader.user.id, "embedded", 30)
    assert token is not None
    await system.directory.release(trader.user.id, token)

    outcome = await trader.send(trader.body(quantity=2))

    assert isinstance(outcome, Accepted)
    assert outcome.result.status is OrderStatus.FILLED
    assert trader.position() == Decimal(3)
