"""Use cases whose every store call may fail alike answer a store outage with the shared 503
(``refuses_outages``) instead of raising: the dashboard order and the security report."""

from __future__ import annotations

from decimal import Decimal

import pytest
from support import Trader, context

from tradecore.errors import DatabaseUnavailable
from tradecore.orders import AlertAction
from tradecore.services.audit.attack_report import SecurityReport
from tradecore.services.orders.dashboard_order import DashboardOrder
from tradecore.services.vocabulary import UNAVAILABLE, Principal, Rejected


async def down(*args: object, **kwargs: object) -> object:
    raise DatabaseUnavailable("postgres down")


async def test_a_dashboard_order_during_an_outage_is_the_shared_503(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = trader.system
    monkeypatch.setattr(system.accounts, "get", down)
    order = DashboardOrder(trader.account.account.id, "BTCUSDT", AlertAction.BUY, Decimal(1))

    outcome = await system.dashboard.place(
        trader.user, order, simulation=False, context=context(path="/trading/order")
    )

    assert outcome == UNAVAILABLE
    assert system.audit.all() == []


async def test_the_security_report_during_an_outage_is_the_shared_503(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = trader.system
    report = SecurityReport(system.audit, system.accounts, system.clock)
    principal = Principal(trader.user, None, None, False, trader.user.plan)
    monkeypatch.setattr(system.audit, "list_for_user", down)

    assert await report.page(principal, None, None, None) == UNAVAILABLE
    refused = await report.page(principal, "0", None, None)
    assert isinstance(refused, Rejected) and refused.status == 400  # no store read
