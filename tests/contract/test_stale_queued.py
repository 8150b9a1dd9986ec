"""Contract of ``OrderHistory.stale_queued``: the memory and the Postgres adapter list the same
rows (still ``queued``, created strictly before the cut-off), oldest first, at most ``limit``,
exactly as stored."""

from __future__ import annotations

from test_repositories import Stores, at, order, stores, two_users_with_accounts

from tradecore.order_lifecycle import Submitted, Withdrawn
from tradecore.orders import OrderStatus

__all__ = ["stores"]  # the fixture, over both adapters


async def test_lists_only_queued_rows_created_before_the_cut_off_oldest_first(
    stores: Stores,
) -> None:
    await two_users_with_accounts(stores)
    rows = [
        order("o-late", created_at=at(30)),
        order("o-b", user_id="user-2", created_at=at(10), fingerprint="fp-b"),
        order("o-a", created_at=at(10)),
        order("o-first", user_id="user-2", created_at=at(1)),
        order("o-at-cut", created_at=at(20)),
        order("o-claimed", created_at=at(2)),
        order("o-withdrawn", created_at=at(3), fingerprint="fp-w"),
    ]
    for row in rows:
        await stores.orders.add(row)
    assert await stores.orders.transition("o-claimed", Submitted(at(4), None)) is not None
    assert await stores.orders.transition("o-withdrawn", Withdrawn()) is not None

    stale = await stores.orders.stale_queued(at(20), 10)

    # ties on created_at are ordered by id; the cut-off itself is excluded
    assert [r.id for r in stale] == ["o-first", "o-a", "o-b"]
    assert stale == [await stores.orders.get(i) for i in ("o-first", "o-a", "o-b")]
    assert all(r.status is OrderStatus.QUEUED for r in stale)


async def test_limit_keeps_the_oldest(stores: Stores) -> None:
    await two_users_with_accounts(stores)
    for n in range(5):
        await stores.orders.add(order(f"o-{n}", created_at=at(n)))
    assert [r.id for r in await stores.orders.stale_queued(at(60), 2)] == ["o-0", "o-1"]
    assert await stores.orders.stale_queued(at(60), 0) == []
    assert await stores.orders.stale_queued(at(0), 10) == []
