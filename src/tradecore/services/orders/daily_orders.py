"""The daily order cap's count: a counter per user and UTC day in the key-value store, equal to
what ``OrderHistory.count_since(user, start of the day)`` counts.

Every order that writes an order-history row is counted, simulated or real, on the webhook and
the dashboard paths alike (the row of an intent withdrawn after a failed hand-over stays, so
its count stays too). The counter is taken before the row is written (the webhook's admission
script counts it with the replay claim and the rate-limit hit, the dashboard's checks take it
in the cap's turn) and given back when no row will be written: a later check refused the
order, or the order history refused it as a duplicate. When the write's outcome is unknown
(the database failed mid-write) the count stays: an over-count refuses early, an under-count
would let an order past the cap.

A counter that does not exist (the day's first order, or the store lost its data) is seeded
from the order history with SET NX, then asked again; so a flushed store never hands a user a
second day's cap. The one gap: orders admitted before the loss whose rows were not yet
written when the seed read the history (the requests in flight at that moment) are missed
once, so the count may fall short by at most that many.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time

from tradecore.errors import KeyValueStoreUnavailable
from tradecore.identity import User
from tradecore.limits import PlanCaps, daily_count_expiry, utc_day
from tradecore.ports.protection import DailyCount, DailyOrderCounter, DailyQuota
from tradecore.ports.repositories import OrderHistory

SEED_ATTEMPTS = 3
"""Seeds tried before giving up (503): each attempt follows a counter that vanished again."""


def daily_quota(user: User, now: datetime, caps: PlanCaps) -> DailyQuota:
    """The quota of an order ``user`` places at ``now``: its UTC day, the cap of the user's
    plan at ``now``, and the day's counter's expiry."""
    day = utc_day(now)
    cap = caps.cap(user.effective_plan(now))
    return DailyQuota(day=day, cap=cap, expires_at=daily_count_expiry(day))


class DailyOrders:
    """Takes, seeds and gives back a user's daily count (see the module docstring)."""

    def __init__(self, counter: DailyOrderCounter, orders: OrderHistory) -> None:
        self._counter = counter
        self._orders = orders

    async def seed(self, user_id: str, quota: DailyQuota) -> None:
        """Create the day's counter from the order history unless it exists meanwhile.
        Raises StoreUnavailable."""
        start = datetime.combine(quota.day, time(), tzinfo=UTC)
        count = await self._orders.count_since(user_id, start)
        await self._counter.seed(user_id, quota, count)

    async def take(self, user_id: str, quota: DailyQuota) -> DailyCount:
        """COUNTED or CAP_REACHED, seeding the counter first when it is absent. Raises
        StoreUnavailable (KeyValueStoreUnavailable when the counter vanishes after every
        one of ``SEED_ATTEMPTS`` seeds)."""
        for _ in range(SEED_ATTEMPTS):
            answer = await self._counter.take(user_id, quota)
            if answer is not DailyCount.UNSEEDED:
                return answer
            await self.seed(user_id, quota)
        raise KeyValueStoreUnavailable("the daily order counter could not be seeded")

    async def release(self, user_id: str, day: date) -> None:
        """Give back one counted order that wrote no row. Never raises."""
        await self._counter.release(user_id, day)
