"""Contract of ``OrderHistory.transition``: the order lifecycle table applied by the memory and
the Postgres adapter alike.

Every kind of change is tried on a row in every status: it applies (writing exactly its fields,
and the status the table names) where the table lets it leave that status, and is a lost race
(None, nothing written) everywhere else. A change the table allows from no status raises
``IllegalTransition`` before the store is touched.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any, cast

import attrs
import pytest
from test_repositories import (
    Stores,
    at,
    memory_stores,
    order,
    postgres_stores,
    two_users_with_accounts,
)

from tradecore.errors import DuplicateOrder, IllegalTransition
from tradecore.order_lifecycle import (
    ClaimedAndExecuted,
    ClaimFailed,
    Executed,
    Expired,
    FillChecked,
    FillRecorded,
    Interrupted,
    OrderChange,
    ReportedFill,
    Submitted,
    Withdrawn,
    next_status,
    sources,
)
from tradecore.orders import OrderError, OrderHistoryRecord, OrderStatus, RejectionCode
from tradecore_adapters.postgres import Pool, PostgresOrderHistory


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def stores(request: pytest.FixtureRequest) -> Stores:
    if request.param == "memory":
        return memory_stores()
    return postgres_stores(request.getfixturevalue("pg_pool"))


EXPIRED = OrderError(RejectionCode.ORDER_EXPIRED, "Order expired before execution")
UNREACHABLE = OrderError(RejectionCode.BROKER_UNAVAILABLE, "Broker unreachable after 3 reconnects")
FILL = ReportedFill(Decimal("0.0100"), Decimal("64250.50"))


def executed(status: OrderStatus, **changes: Any) -> Executed:
    base = Executed(
        status=status,
        order_id="paper-2",
        client_order_id="o-entry",
        broker_refs=("paper-1", "paper-2"),
        fill_price=Decimal("100.50"),
        fill_quantity=Decimal("0.010"),
        filled_at=at(5),
        auto_exit=True,
        exit_quantity=Decimal("0.020"),
        exit_order_result={"broker_order_id": "paper-1", "status": "filled"},
        error=None,
    )
    return attrs.evolve(base, **changes)


# One of each kind of change, and the variants that write different fields.
CHANGES: list[OrderChange] = [
    Submitted(at(1), Decimal("-0.500")),
    Expired(EXPIRED),
    Withdrawn(),
    ClaimFailed(UNREACHABLE),
    Interrupted(UNREACHABLE),
    executed(OrderStatus.FILLED),
    executed(
        OrderStatus.REJECTED,
        order_id=None,
        client_order_id=None,
        fill_price=None,
        filled_at=None,
        auto_exit=False,
        exit_order_result=None,
        error=OrderError(RejectionCode.BROKER_RATE_LIMITED, "slow down", retry_after=2.5),
    ),
    executed(OrderStatus.NO_POSITION, broker_refs=(), exit_order_result=None),
    ClaimedAndExecuted(Submitted(at(1), Decimal("0")), executed(OrderStatus.FILLED)),
    FillChecked(OrderStatus.FILLED, FILL, at(9)),
    FillChecked(OrderStatus.PARTIALLY_FILLED, ReportedFill(Decimal("0.004"), None)),
    FillChecked(OrderStatus.FAILED),
    FillRecorded(FILL),
]


def row_in(status: OrderStatus, row_id: str) -> OrderHistoryRecord:
    """A row that has been through some of its lifecycle, so every write is visible."""
    return order(
        row_id,
        status=status,
        fingerprint=f"fp-{row_id}",
        order_id="paper-0",
        client_order_id="o-old",
        broker_refs=("paper-0",),
        fill_price=Decimal("1.5"),
        fill_quantity=Decimal("0.001"),
        filled_at=at(2),
        position_before=Decimal("0.25"),
        error=OrderError(RejectionCode.MARKET_CLOSED, "closed"),
    )


async def test_every_change_applies_exactly_from_the_statuses_the_table_allows(
    stores: Stores,
) -> None:
    await two_users_with_accounts(stores)
    for status in OrderStatus:
        for n, change in enumerate(CHANGES):
            row = row_in(status, f"o-{status}-{n}")
            await stores.orders.add(row)
            result = await stores.orders.transition(row.id, change)
            case = f"{change!r} on a {status} row"
            if status in sources(change):
                expected = attrs.evolve(row, **change.fields())
                assert expected.status is next_status(status, change), case
                assert result == expected, case
                assert await stores.orders.get(row.id) == expected, case
            else:
                assert result is None, case
                assert await stores.orders.get(row.id) == row, case


@pytest.mark.parametrize(
    "change",
    [
        executed(OrderStatus.QUEUED),
        executed(OrderStatus.SUBMITTED),
        FillChecked(OrderStatus.NO_POSITION, FILL),
        FillChecked(OrderStatus.EXPIRED),
    ],
    ids=repr,
)
async def test_a_change_the_table_never_allows_raises_and_writes_nothing(
    stores: Stores, change: OrderChange
) -> None:
    await two_users_with_accounts(stores)
    row = row_in(OrderStatus.SUBMITTED, "o-1")
    await stores.orders.add(row)
    with pytest.raises(IllegalTransition) as raised:
        await stores.orders.transition(row.id, change)
    assert str(change.status) in str(raised.value)
    assert str(change.step) in str(raised.value)
    assert await stores.orders.get(row.id) == row
    with pytest.raises(IllegalTransition):
        await stores.orders.transition("missing", change)


class Untouchable:
    """A pool that fails the test if the adapter uses it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store was touched ({name})")


async def test_the_postgres_adapter_refuses_an_illegal_change_before_the_store() -> None:
    history = PostgresOrderHistory(cast(Pool, Untouchable()))
    with pytest.raises(IllegalTransition, match="from submitted on execute to queued"):
        await history.transition("o-1", executed(OrderStatus.QUEUED))


async def test_transition_is_compare_and_set(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.orders.add(order("o-1"))
    assert await stores.orders.transition("o-1", FillRecorded(FILL)) is None
    assert await stores.orders.transition("o-1", executed(OrderStatus.FILLED)) is None
    assert await stores.orders.get("o-1") == order("o-1")
    claim = Submitted(at(1), Decimal("0.000"))
    claimed = await stores.orders.transition("o-1", claim)
    assert claimed == attrs.evolve(order("o-1"), **claim.fields())
    outcome = executed(OrderStatus.FILLED)
    updated = await stores.orders.transition("o-1", outcome)
    assert claimed is not None and updated == attrs.evolve(claimed, **outcome.fields())
    assert await stores.orders.get("o-1") == updated
    assert await stores.orders.transition("o-1", claim) is None
    assert await stores.orders.transition("o-1", outcome) is None
    assert await stores.orders.transition("missing", claim) is None
    assert await stores.orders.get("o-1") == updated


async def test_concurrent_transitions_from_queued_let_exactly_one_win(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.orders.add(order("o-1"))
    results = await asyncio.gather(
        *(stores.orders.transition("o-1", Submitted(at(i), Decimal(i))) for i in range(8))
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert await stores.orders.get("o-1") == winners[0]


async def test_the_claim_and_the_other_ways_out_of_queued_race_with_one_winner(
    stores: Stores,
) -> None:
    """The worker's claim, expiry and failed claim and the API's withdrawal all leave
    ``queued``: of any of them racing, exactly one applies."""
    await two_users_with_accounts(stores)
    await stores.orders.add(order("o-1", fingerprint="fp"))
    changes: list[OrderChange] = [
        Submitted(at(1), Decimal(0)),
        Withdrawn(),
        Expired(EXPIRED),
        ClaimFailed(UNREACHABLE),
    ]
    results = await asyncio.gather(*(stores.orders.transition("o-1", c) for c in changes))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert await stores.orders.get("o-1") == winners[0]


async def test_a_withdrawal_frees_the_fingerprint(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    await stores.orders.add(order("o-1", fingerprint="fp"))
    released = await stores.orders.transition("o-1", Withdrawn())
    assert released is not None and released.fingerprint is None
    assert released.status is OrderStatus.CANCELLED
    await stores.orders.add(order("o-2", fingerprint="fp"))
    with pytest.raises(DuplicateOrder):
        await stores.orders.add(order("o-3", fingerprint="fp"))
