"""Store outages on the order path: 503, nothing acknowledged, nothing spent."""

from __future__ import annotations

from decimal import Decimal

import pytest
from support import Trader

from tradecore.errors import KeyValueStoreUnavailable
from tradecore.orders import OrderRequest, OrderStatus
from tradecore.ports.protection import Admission
from tradecore.services.orders.outcomes import Accepted
from tradecore.services.vocabulary import Rejected


async def test_key_value_store_down_is_503_and_spends_nothing(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def down(*args: object) -> Admission:
        raise KeyValueStoreUnavailable("redis down")

    body = trader.body()
    with monkeypatch.context() as patch:
        patch.setattr(trader.system.admission, "admit", down)
        outcome = await trader.send(body)

    assert isinstance(outcome, Rejected) and outcome.status == 503
    assert await trader.system.orders.list_for_user(trader.user.id) == []
    assert isinstance(await trader.send(body), Accepted)  # the resend after recovery


async def test_queue_down_cancels_the_intent_and_releases_the_replay_key(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def down(request: OrderRequest) -> bool:
        raise KeyValueStoreUnavailable("redis down")

    body = trader.body()
    with monkeypatch.context() as patch:
        patch.setattr(trader.system.queue, "push", down)
        outcome = await trader.send(body)

    assert isinstance(outcome, Rejected) and outcome.status == 503
    (row,) = await trader.system.orders.list_for_user(trader.user.id)
    assert row.status is OrderStatus.CANCELLED
    resent = await trader.send(body)
    assert isinstance(resent, Accepted)
    assert trader.position() == Decimal(1)
