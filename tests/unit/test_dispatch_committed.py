"""``OrderDispatcher.dispatch(on_committed=...)``: the caller's success step (its audit entry)
runs exactly when the outcome is a success, once, and, for a handed-over order, while the
dispatcher waits for the worker's reply; the dispatch returns only when both are done."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest

from tradecore.accounts import TradingAccount
from tradecore.errors import DatabaseUnavailable, KeyValueStoreUnavailable
from tradecore.identity import Plan, User
from tradecore.order_lifecycle import OrderChange
from tradecore.orders import (
    AlertAction,
    OrderHistoryRecord,
    OrderRequest,
    OrderResult,
    OrderStatus,
    OrderType,
    Source,
)
from tradecore.services.orders.dispatch import Dispatched, OrderDispatcher, OrderIntent
from tradecore.services.orders.outcomes import Accepted, Queued
from tradecore.services.orders.settings import OrderSettings
from tradecore.services.vocabulary import Rejected
from tradecore.testing.clock import EPOCH, SeededRandom
from tradecore_adapters.memory.repositories import MemoryOrderHistory

USER = User("user-1", "ada@example.com", "h", Plan.PRO, EPOCH)
ACCOUNT = TradingAccount("acct-1", USER.id, "Main", "paper", "t" * 64, "s" * 64, EPOCH)
INTENT = OrderIntent(
    user=USER,
    account=ACCOUNT,
    symbol="BTCUSDT",
    action=AlertAction.BUY,
    order_type=OrderType.ENTRY,
    quantity=Decimal(1),
    source=Source.WEBHOOK,
    simulation=False,
    fingerprint="fp",
)


class Queue:
    """An OrderQueue whose reply the test releases; it notes the order of events."""

    def __init__(self, events: list[str], *, push: bool | Exception = True) -> None:
        self.events = events
        self.push_answer = push
        self.reply = asyncio.Event()
        self.reply_error: Exception | None = None
        self.result: OrderResult | None = None

    async def push(self, request: OrderRequest) -> bool:
        if isinstance(self.push_answer, Exception):
            raise self.push_answer
        self.result = OrderResult(
            request.order_id,
            request.request_id,
            OrderStatus.FILLED,
            request.symbol,
            request.action,
            request.quantity,
        )
        return self.push_answer

    async def park(self, request: OrderRequest) -> None:
        self.events.append("park")

    async def wait_result(self, request_id: str, timeout_s: float) -> OrderResult | None:
        self.events.append("wait")
        await self.reply.wait()
        self.events.append("reply")
        if self.reply_error is not None:
            raise self.reply_error
        return self.result


class Workers:
    async def request_start(self, user_id: str) -> None:
        return None

    async def wait_active(self, user_id: str, timeout_s: float) -> bool:
        return False


class ClaimedOrders(MemoryOrderHistory):
    """Order history where the worker claimed the intent before the API could withdraw it
    (``claimed``), or where the withdrawal itself fails (``down``)."""

    def __init__(self, *, down: bool = False) -> None:
        super().__init__()
        self.down = down

    async def transition(self, order_id: str, change: OrderChange) -> OrderHistoryRecord | None:
        if self.down:
            raise DatabaseUnavailable("postgres down")
        return None


def dispatcher(queue: Queue, orders: MemoryOrderHistory | None = None) -> OrderDispatcher:
    return OrderDispatcher(
        orders or MemoryOrderHistory(), queue, Workers(), SeededRandom(1), OrderSettings()
    )


class Recorder:
    def __init__(self, events: list[str], *, error: Exception | None = None) -> None:
        self.events = events
        self.error = error
        self.order_ids: list[str] = []
        self.done = asyncio.Event()

    async def __call__(self, order_id: str) -> None:
        self.events.append("audit start")
        self.order_ids.append(order_id)
        await asyncio.sleep(0)
        self.events.append("audit done")
        self.done.set()
        if self.error is not None:
            raise self.error


async def test_the_entry_is_written_while_the_worker_executes() -> None:
    events: list[str] = []
    queue = Queue(events)
    record = Recorder(events)
    task = asyncio.create_task(
        dispatcher(queue).dispatch(INTENT, now=EPOCH, wait_s=5, on_committed=record)
    )

    await asyncio.wait_for(record.done.wait(), 1)
    assert not task.done()  # the reply has not come: no answer yet
    queue.reply.set()
    dispatched = await task

    assert isinstance(dispatched.outcome, Accepted)
    assert dispatched.durable and record.order_ids == [dispatched.order_id]
    assert events.index("audit done") < events.index("reply")
    assert events.index("wait") < events.index("reply")


async def test_the_answer_waits_for_the_entry() -> None:
    events: list[str] = []
    queue = Queue(events)
    queue.reply.set()  # the worker answers at once
    entry_written = asyncio.Event()

    async def slow_entry(order_id: str) -> None:
        for _ in range(5):
            await asyncio.sleep(0)
        entry_written.set()

    dispatched = await dispatcher(queue).dispatch(
        INTENT, now=EPOCH, wait_s=5, on_committed=slow_entry
    )

    assert isinstance(dispatched.outcome, Accepted) and entry_written.is_set()


@pytest.mark.parametrize("reply_error", [None, KeyValueStoreUnavailable("redis down")])
async def test_no_reply_is_202_with_one_entry(reply_error: Exception | None) -> None:
    events: list[str] = []
    queue = Queue(events)
    queue.reply_error = reply_error
    queue.reply.set()
    record = Recorder(events)

    async def no_reply(request_id: str, timeout_s: float) -> OrderResult | None:
        await Queue.wait_result(queue, request_id, timeout_s)
        return None

    queue.wait_result = no_reply  # type: ignore[method-assign]
    dispatched = await dispatcher(queue).dispatch(INTENT, now=EPOCH, wait_s=5, on_committed=record)

    assert isinstance(dispatched.outcome, Queued) and dispatched.durable
    assert record.order_ids == [dispatched.order_id]


@pytest.mark.parametrize("down", [False, True])
async def test_failed_push_that_cannot_be_withdrawn_is_202_with_one_entry(down: bool) -> None:
    events: list[str] = []
    queue = Queue(events, push=KeyValueStoreUnavailable("redis down"))
    record = Recorder(events)

    dispatched = await dispatcher(queue, ClaimedOrders(down=down)).dispatch(
        INTENT, now=EPOCH, wait_s=5, on_committed=record
    )

    assert isinstance(dispatched.outcome, Queued) and dispatched.durable
    assert record.order_ids == [dispatched.order_id]
    assert "wait" not in events


async def test_refusals_never_run_the_step() -> None:
    events: list[str] = []
    record = Recorder(events)

    queue = Queue(events, push=KeyValueStoreUnavailable("redis down"))
    dispatched = await dispatcher(queue).dispatch(INTENT, now=EPOCH, wait_s=5, on_committed=record)

    assert isinstance(dispatched.outcome, Rejected) and not dispatched.durable
    assert record.order_ids == []


async def test_an_order_no_worker_takes_in_time_is_parked_and_runs_the_step() -> None:
    """No worker host runs: the durable order waits on the user's list (a host's orphan
    sweep serves it later) and the caller's step runs; no 503."""
    events: list[str] = []
    record = Recorder(events)
    queue = Queue(events, push=False)
    queue.reply.set()

    dispatched = await dispatcher(queue).dispatch(
        INTENT, now=EPOCH, wait_s=0.02, on_committed=record
    )

    assert not isinstance(dispatched.outcome, Rejected) and dispatched.durable
    assert "park" in events
    assert record.order_ids == [dispatched.order_id]


async def test_intent_store_down_never_runs_the_step() -> None:
    class DownOrders(MemoryOrderHistory):
        async def add(self, record: OrderHistoryRecord) -> None:
            raise DatabaseUnavailable("postgres down")

    events: list[str] = []
    record = Recorder(events)

    dispatched = await dispatcher(Queue(events), DownOrders()).dispatch(
        INTENT, now=EPOCH, wait_s=5, on_committed=record
    )

    assert dispatched == Dispatched(Rejected(503, "unavailable", "Service temporarily unavailable"))
    assert not dispatched.durable
    assert record.order_ids == []


async def test_a_failed_step_is_raised_after_the_reply() -> None:
    events: list[str] = []
    queue = Queue(events)
    record = Recorder(events, error=DatabaseUnavailable("audit down"))
    task = asyncio.create_task(
        dispatcher(queue).dispatch(INTENT, now=EPOCH, wait_s=5, on_committed=record)
    )

    await asyncio.wait_for(record.done.wait(), 1)
    await asyncio.sleep(0)
    assert not task.done()  # the worker still has the order
    queue.reply.set()

    with pytest.raises(DatabaseUnavailable):
        await task
    assert events[-1] == "reply"


async def test_an_unexpected_reply_error_is_raised_after_the_step() -> None:
    events: list[str] = []
    queue = Queue(events)
    queue.reply_error = ValueError("undecodable reply")
    queue.reply.set()
    record = Recorder(events)

    with pytest.raises(ValueError, match="undecodable"):
        await dispatcher(queue).dispatch(INTENT, now=EPOCH, wait_s=5, on_committed=record)
    assert "audit done" in events


async def test_without_the_step_nothing_changes() -> None:
    events: list[str] = []
    queue = Queue(events)
    queue.reply.set()

    dispatched = await dispatcher(queue).dispatch(INTENT, now=EPOCH, wait_s=5)

    assert isinstance(dispatched.outcome, Accepted)
    assert events == ["wait", "reply"]


async def test_a_cancelled_dispatch_cancels_its_step() -> None:
    events: list[str] = []
    queue = Queue(events)  # the worker never answers
    step_started = asyncio.Event()
    step_cancelled = asyncio.Event()

    async def endless_step(order_id: str) -> None:
        step_started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            step_cancelled.set()
            raise

    task = asyncio.create_task(
        dispatcher(queue).dispatch(INTENT, now=EPOCH, wait_s=5, on_committed=endless_step)
    )
    await asyncio.wait_for(step_started.wait(), 1)
    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(step_cancelled.wait(), 1)
