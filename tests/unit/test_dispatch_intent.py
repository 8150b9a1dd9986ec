"""``OrderDispatcher.dispatch``: the intent and the request's success audit entry are written
together before the order is handed over, and once they are, the order is on its way: the
caller gets 200 or 202, never a refusal, whatever the queue does afterwards."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest

from tradecore.accounts import TradingAccount
from tradecore.audit import AuditAction, AuditEntry, RequestContext
from tradecore.errors import DatabaseUnavailable, KeyValueStoreUnavailable
from tradecore.identity import Plan, User
from tradecore.orders import (
    AlertAction,
    OrderHistoryRecord,
    OrderRequest,
    OrderResult,
    OrderStatus,
    OrderType,
    Source,
)
from tradecore.services.audit.events import SecurityEvents
from tradecore.services.orders.dispatch import Dispatched, Duplicate, OrderDispatcher, OrderIntent
from tradecore.services.orders.outcomes import Accepted, Queued
from tradecore.services.orders.settings import OrderSettings
from tradecore.services.vocabulary import Rejected
from tradecore.testing.clock import EPOCH, FakeClock, SeededRandom
from tradecore_adapters.mail.outbox import LoggingOutbox
from tradecore_adapters.memory.protection import MemoryAlertThrottle
from tradecore_adapters.memory.repositories import (
    MemoryAuditLog,
    MemoryOrderHistory,
    MemoryOrderIntentLog,
    MemoryUserRepository,
)

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
CONTEXT = RequestContext("203.0.113.7", "TradingView", "/webhook/t/order", "POST")


def success_entry(order_id: str) -> AuditEntry:
    return AuditEntry(
        user_id=USER.id,
        action=AuditAction.WEBHOOK_ORDER,
        success=True,
        context=CONTEXT,
        created_at=EPOCH,
        resource_type="order",
        resource_id=order_id,
    )


class Queue:
    """An OrderQueue whose reply the test releases; it notes what happened, and what the
    stores held when the request was pushed."""

    def __init__(self, stores: Stores, *, push: bool | Exception = True) -> None:
        self.stores = stores
        self.events: list[str] = []
        self.push_answer = push
        self.reply = asyncio.Event()
        self.reply_error: Exception | None = None
        self.result: OrderResult | None = None
        self.written_at_push: tuple[int, int] | None = None

    async def push(self, request: OrderRequest) -> bool:
        self.events.append("push")
        self.written_at_push = (await self.stores.rows(), len(self.stores.audit.all()))
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
        if self.reply_error is not None:
            raise self.reply_error
        return self.result


class Workers:
    async def request_start(self, user_id: str) -> None:
        return None

    async def wait_active(self, user_id: str, timeout_s: float) -> bool:
        return False


class Stores:
    def __init__(self, orders: MemoryOrderHistory | None = None) -> None:
        self.orders = orders or MemoryOrderHistory()
        self.audit = MemoryAuditLog()
        self.intents = MemoryOrderIntentLog(self.orders, self.audit)

    async def only_row(self) -> OrderHistoryRecord:
        (row,) = await self.orders.list_for_user(USER.id)
        return row

    async def rows(self) -> int:
        return len(await self.orders.list_for_user(USER.id))


def dispatcher(stores: Stores, queue: Queue) -> OrderDispatcher:
    return OrderDispatcher(stores.intents, queue, Workers(), SeededRandom(1), OrderSettings())


async def test_the_intent_and_its_entry_are_durable_before_the_hand_over() -> None:
    stores = Stores()
    queue = Queue(stores)
    queue.reply.set()

    dispatched = await dispatcher(stores, queue).dispatch(
        INTENT, now=EPOCH, wait_s=5, entry=success_entry
    )

    assert isinstance(dispatched.outcome, Accepted) and dispatched.durable
    assert queue.written_at_push == (1, 1)
    row = await stores.only_row()
    assert row.id == dispatched.order_id and row.status is OrderStatus.QUEUED
    assert [e.entry for e in stores.audit.all()] == [success_entry(row.id)]


@pytest.mark.parametrize("reply_error", [None, KeyValueStoreUnavailable("redis down")])
async def test_no_reply_is_202_with_its_one_entry(reply_error: Exception | None) -> None:
    stores = Stores()
    queue = Queue(stores)
    queue.reply_error = reply_error
    queue.reply.set()
    queue.result = None

    async def no_reply(request_id: str, timeout_s: float) -> OrderResult | None:
        await Queue.wait_result(queue, request_id, timeout_s)
        return None

    queue.wait_result = no_reply  # type: ignore[method-assign]
    dispatched = await dispatcher(stores, queue).dispatch(
        INTENT, now=EPOCH, wait_s=5, entry=success_entry
    )

    assert isinstance(dispatched.outcome, Queued) and dispatched.durable
    assert [e.entry.resource_id for e in stores.audit.all()] == [dispatched.order_id]


async def test_a_failed_push_is_202_and_the_intent_stays_queued_for_the_recovery() -> None:
    """The key-value store failed after the admission: the order is durable and its entry
    says so; the worker hosts' recovery hands it over, so it is not withdrawn."""
    stores = Stores()
    queue = Queue(stores, push=KeyValueStoreUnavailable("redis down"))

    dispatched = await dispatcher(stores, queue).dispatch(
        INTENT, now=EPOCH, wait_s=5, entry=success_entry
    )

    assert isinstance(dispatched.outcome, Queued) and dispatched.durable
    row = await stores.only_row()
    assert row.status is OrderStatus.QUEUED and row.fingerprint == "fp"
    assert [e.entry for e in stores.audit.all()] == [success_entry(row.id)]
    assert "wait" not in queue.events


async def test_an_order_no_worker_takes_in_time_is_parked_with_its_entry() -> None:
    """No worker host runs: the durable order waits on the user's list (a host's orphan
    sweep serves it later); no 503."""
    stores = Stores()
    queue = Queue(stores, push=False)
    queue.reply.set()

    dispatched = await dispatcher(stores, queue).dispatch(
        INTENT, now=EPOCH, wait_s=0.02, entry=success_entry
    )

    assert not isinstance(dispatched.outcome, Rejected) and dispatched.durable
    assert "park" in queue.events
    assert [e.entry.resource_id for e in stores.audit.all()] == [dispatched.order_id]


async def test_intent_store_down_is_503_with_nothing_written_or_pushed() -> None:
    class DownOrders(MemoryOrderHistory):
        async def add(self, record: OrderHistoryRecord) -> None:
            raise DatabaseUnavailable("postgres down")

    stores = Stores(DownOrders())
    queue = Queue(stores)

    dispatched = await dispatcher(stores, queue).dispatch(
        INTENT, now=EPOCH, wait_s=5, entry=success_entry
    )

    assert dispatched == Dispatched(Rejected(503, "unavailable", "Service temporarily unavailable"))
    assert not dispatched.durable
    assert stores.audit.all() == [] and queue.events == []


async def test_a_fingerprint_the_history_holds_is_a_duplicate_with_nothing_written() -> None:
    stores = Stores()
    queue = Queue(stores)
    queue.reply.set()
    first = await dispatcher(stores, queue).dispatch(
        INTENT, now=EPOCH, wait_s=5, entry=success_entry
    )
    queue.events.clear()

    with pytest.raises(Duplicate):
        await dispatcher(stores, queue).dispatch(INTENT, now=EPOCH, wait_s=5, entry=success_entry)

    assert [e.entry.resource_id for e in stores.audit.all()] == [first.order_id]
    assert await stores.rows() == 1 and queue.events == []


async def test_an_unexpected_reply_error_is_raised_with_the_order_recorded() -> None:
    stores = Stores()
    queue = Queue(stores)
    queue.reply_error = ValueError("undecodable reply")
    queue.reply.set()

    with pytest.raises(ValueError, match="undecodable"):
        await dispatcher(stores, queue).dispatch(INTENT, now=EPOCH, wait_s=5, entry=success_entry)
    assert len(stores.audit.all()) == 1 and await stores.rows() == 1


def test_an_entry_written_beside_an_intent_is_never_an_attack_class() -> None:
    """``SecurityEvents.entry`` builds the success entry written with an intent; an attack
    class must go through ``record``, which sends its alert."""
    clock = FakeClock()
    events = SecurityEvents(
        MemoryAuditLog(), MemoryUserRepository(), MemoryAlertThrottle(clock), LoggingOutbox(), clock
    )

    built = events.entry(AuditAction.WEBHOOK_ORDER, CONTEXT, user_id=USER.id, success=True)
    assert built.created_at == clock.now() and built.success

    with pytest.raises(ValueError, match="record"):
        events.entry(AuditAction.WEBHOOK_REPLAY_ATTACK, CONTEXT, user_id=USER.id, success=False)
