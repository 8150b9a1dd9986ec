"""Store outages on the order path: 503 with nothing acknowledged or spent before the intent
is durable; once it is, the order runs."""

from __future__ import annotations

from decimal import Decimal

import pytest
from support import Trader

from tradecore.audit import AuditAction
from tradecore.errors import KeyValueStoreUnavailable
from tradecore.orders import OrderRequest, OrderStatus
from tradecore.ports.protection import Admission
from tradecore.services.execution.worker_host import HostSettings
from tradecore.services.orders.outcomes import Accepted, Queued
from tradecore.services.vocabulary import Rejected
from tradecore.testing.clock import FakeClock


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


async def test_queue_down_after_the_admission_is_202_and_the_recovery_runs_the_order(
    trader: Trader, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key-value store failed between the admission and the push: the intent and its
    success entry are durable, so the answer is 202; the replay key stays (a resend is a
    replay, never a second order) and the worker hosts' recovery runs the order once."""

    async def down(request: OrderRequest) -> bool:
        raise KeyValueStoreUnavailable("redis down")

    body = trader.body()
    with monkeypatch.context() as patch:
        patch.setattr(trader.system.queue, "push", down)
        outcome = await trader.send(body)

    assert isinstance(outcome, Queued)
    (row,) = await trader.system.orders.list_for_user(trader.user.id)
    assert row.status is OrderStatus.QUEUED
    assert trader.audit_actions() == [AuditAction.WEBHOOK_ORDER]
    resent = await trader.send(body)
    assert isinstance(resent, Rejected) and resent.status == 409

    clock.advance(HostSettings().recovery_grace_s + 1)
    assert await trader.system.host.recover_lost() == [row.id]
    result = await trader.system.queue.wait_result(row.request_id, 5)
    assert result is not None and result.status is OrderStatus.FILLED
    assert trader.position() == Decimal(1)
