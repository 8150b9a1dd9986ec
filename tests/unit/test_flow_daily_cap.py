"""The daily cap counted in the key-value store (``DailyOrders``) refuses exactly where the
order history's count would: every order row counts, on the webhook and dashboard paths alike;
a request refused after its admission, or refused by the order history as a duplicate, gives
its slot back; the day is the UTC day of the request; a lost counter is seeded again from the
order history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import attrs
import pytest
from support import Trader, context

from tradecore.errors import KeyValueStoreUnavailable
from tradecore.limits import PlanCaps, start_of_utc_day
from tradecore.orders import AlertAction, OrderRequest
from tradecore.services.orders.dashboard_order import DashboardOrder
from tradecore.services.orders.settings import OrderSettings
from tradecore.services.vocabulary import Rejected
from tradecore.testing.clock import FakeClock
from tradecore_adapters.memory.protection import MemoryDailyOrderCounter

CAP_TWO = OrderSettings(plan_caps=PlanCaps.parse("free=2,pro=2"))
CAP_THREE = OrderSettings(plan_caps=PlanCaps.parse("free=3,pro=3"))


def code(outcome: object) -> str:
    return outcome.code if isinstance(outcome, Rejected) else "accepted"


async def dashboard(trader: Trader, symbol: str = "BTCUSDT") -> object:
    order = DashboardOrder(trader.account.account.id, symbol, AlertAction.BUY, Decimal(1))
    return await trader.system.dashboard.place(
        trader.user, order, simulation=True, context=context(path="/trading/order")
    )


async def rows_today(trader: Trader) -> int:
    system = trader.system
    return await system.orders.count_since(trader.user.id, start_of_utc_day(system.clock.now()))


def counters(trader: Trader) -> MemoryDailyOrderCounter:
    """The embedded system's daily counters (the admission's own, read for the test)."""
    daily = trader.system.admission._daily  # type: ignore[attr-defined]
    assert isinstance(daily, MemoryDailyOrderCounter)
    return daily


@pytest.mark.parametrize("settings", [CAP_THREE])
async def test_the_webhook_and_the_dashboard_share_one_count(trader: Trader) -> None:
    outcomes = [
        await dashboard(trader),
        await trader.send(trader.body(quantity=1)),
        await dashboard(trader),
        await trader.send(trader.body(quantity=2)),
        await dashboard(trader),
    ]

    assert [code(o) for o in outcomes] == [
        "accepted",
        "accepted",
        "accepted",
        "daily_cap_reached",
        "daily_cap_reached",
    ]
    assert await rows_today(trader) == 3


@pytest.mark.parametrize("settings", [CAP_TWO])
async def test_requests_refused_after_their_admission_are_not_counted(trader: Trader) -> None:
    system = trader.system
    account = trader.account.account
    limited = attrs.evolve(account, allowed_symbols=frozenset({"BTCUSDT"}))
    assert await system.accounts.save(limited, previous=account)

    refused = [await trader.send(trader.body(symbol="ETHUSDT", quantity=n)) for n in (1, 2, 3)]
    refused.append(await dashboard(trader, "ETHUSDT"))
    refused.append(await trader.send(trader.body(quantity=10**9)))  # over the quantity limit
    counted = [await trader.send(trader.body(quantity=n)) for n in (4, 5, 6)]

    assert {code(o) for o in refused} == {"symbol_not_allowed", "quantity_too_large"}
    assert [code(o) for o in counted] == ["accepted", "accepted", "daily_cap_reached"]
    assert await rows_today(trader) == 2


@pytest.mark.parametrize("settings", [CAP_TWO])
async def test_a_duplicate_refused_by_the_order_history_gives_its_slot_back(
    trader: Trader,
) -> None:
    body = trader.body()
    assert code(await trader.send(body)) == "accepted"
    fingerprint = trader.system.audit.all()[-1].entry.metadata["payload_hash"]
    await trader.system.replay.release(trader.user.id, fingerprint)  # as after a flush

    duplicate = await trader.send(body)  # admitted and counted, then refused by the history
    second = await trader.send(trader.body(quantity=2))
    third = await trader.send(trader.body(quantity=3))

    assert [code(o) for o in (duplicate, second, third)] == [
        "replay",
        "accepted",
        "daily_cap_reached",
    ]


@pytest.mark.parametrize("settings", [CAP_TWO])
async def test_an_intent_withdrawn_after_a_failed_hand_over_stays_counted(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its row stays (cancelled), and the order history's count counts every row."""

    async def down(request: OrderRequest) -> bool:
        raise KeyValueStoreUnavailable("redis down")

    with monkeypatch.context() as patch:
        patch.setattr(trader.system.queue, "push", down)
        failed = await trader.send(trader.body(quantity=1))
    outcomes = [await trader.send(trader.body(quantity=n)) for n in (2, 3)]

    assert isinstance(failed, Rejected) and failed.status == 503
    assert [code(o) for o in outcomes] == ["accepted", "daily_cap_reached"]
    assert await rows_today(trader) == 2


@pytest.mark.parametrize("settings", [OrderSettings(plan_caps=PlanCaps.parse("free=1,pro=1"))])
async def test_the_count_is_the_utc_days(trader: Trader, clock: FakeClock) -> None:
    late = datetime(2026, 1, 5, 23, 59, 58, tzinfo=UTC)
    clock.set(late)
    before = [await trader.send(trader.body(quantity=n)) for n in (1, 2)]
    clock.set(late + timedelta(seconds=3))  # 00:00:01 of the next day
    after = [await trader.send(trader.body(quantity=n)) for n in (3, 4)]

    assert [code(o) for o in before] == ["accepted", "daily_cap_reached"]
    assert [code(o) for o in after] == ["accepted", "daily_cap_reached"]


@pytest.mark.parametrize("settings", [CAP_THREE])
async def test_a_lost_counter_is_seeded_from_the_order_history(trader: Trader) -> None:
    assert [code(await dashboard(trader)) for _ in range(2)] == ["accepted"] * 2

    counters(trader).forget()  # the store lost its data (a flush, a failover)

    outcomes = [await trader.send(trader.body(quantity=n)) for n in (1, 2)]
    assert [code(o) for o in outcomes] == ["accepted", "daily_cap_reached"]
    counters(trader).forget()
    assert code(await dashboard(trader)) == "daily_cap_reached"
    assert await rows_today(trader) == 3
