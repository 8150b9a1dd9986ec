"""The webhook flow reads the owner and the allowed IPs in one lookup
(``TradingAccountRepository.webhook_owner``), counts the daily cap in the key-value store (the
order history is read once per user and day, to seed the count), still decides in the
specification's order, and writes its success entry while the worker executes the order."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import attrs
import pytest
from support import ATTACKER_IP, Trader, context

from tradecore.audit import AuditAction, AuditEntry
from tradecore.errors import DatabaseUnavailable
from tradecore.identity import AllowedIp, Plan
from tradecore.limits import start_of_utc_day
from tradecore.orders import AlertAction
from tradecore.ports.repositories import WebhookOwner
from tradecore.services.orders.dashboard_order import DashboardOrder
from tradecore.services.orders.outcomes import Accepted
from tradecore.services.vocabulary import Rejected
from tradecore.webhooks.checks import hash_secret


async def owner_of(trader: Trader) -> WebhookOwner:
    found = await trader.system.accounts.webhook_owner(hash_secret(trader.token))
    assert found is not None
    return found


def only_the_lookup(
    trader: Trader, patch: pytest.MonkeyPatch, owner: WebhookOwner, seeds: list[datetime]
) -> None:
    """Serve ``owner`` from the one lookup; the allowed IPs cannot be read elsewhere, and the
    order count only to seed the day's counter (``seeds`` records each read)."""

    async def lookup(token_hash: str) -> WebhookOwner | None:
        return owner if token_hash == hash_secret(trader.token) else None

    async def refused(*args: object) -> object:
        raise AssertionError("the webhook path read this outside the token lookup")

    system = trader.system
    count_since = system.orders.count_since

    async def seed(user_id: str, since: datetime) -> int:
        seeds.append(since)
        return await count_since(user_id, since)

    patch.setattr(system.accounts, "webhook_owner", lookup)
    patch.setattr(system.allowed_ips, "list_for_user", refused)
    patch.setattr(system.orders, "count_since", seed)


async def test_an_order_needs_the_one_lookup_and_the_count_once_a_day(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = await owner_of(trader)
    seeds: list[datetime] = []
    only_the_lookup(trader, monkeypatch, owner, seeds)

    outcomes = [await trader.send(trader.body(quantity=n)) for n in (1, 2, 3)]

    assert all(isinstance(o, Accepted) for o in outcomes)
    assert seeds == [start_of_utc_day(trader.system.clock.now())]


async def test_the_allowed_ips_come_from_the_lookup(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = attrs.evolve(await owner_of(trader), allowed_ips=("203.0.113.0/24",))
    only_the_lookup(trader, monkeypatch, owner, [])

    blocked = await trader.send(trader.body(), ip=ATTACKER_IP)
    allowed = await trader.send(trader.body(quantity=2))

    assert isinstance(blocked, Rejected) and blocked.code == "ip_not_allowed"
    assert isinstance(allowed, Accepted)


def history_at_the_cap(trader: Trader, patch: pytest.MonkeyPatch) -> list[datetime]:
    """The order history says the trader placed a whole day's cap already; the reads."""
    cap = trader.system.settings.plan_caps.cap(Plan.PRO)
    assert cap is not None
    seeds: list[datetime] = []

    async def at_the_cap(user_id: str, since: datetime) -> int:
        seeds.append(since)
        return cap

    patch.setattr(trader.system.orders, "count_since", at_the_cap)
    return seeds


async def test_the_daily_cap_is_seeded_from_the_order_history(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    seeds = history_at_the_cap(trader, monkeypatch)

    outcomes = [await trader.send(trader.body(quantity=n)) for n in (1, 2)]

    assert [o.code for o in outcomes if isinstance(o, Rejected)] == ["daily_cap_reached"] * 2
    assert trader.audit_actions() == [AuditAction.WEBHOOK_ORDER] * 2
    assert seeds == [start_of_utc_day(trader.system.clock.now())]  # once: the counter holds


async def test_the_cap_still_decides_after_the_ip_check_replay_and_rate_limit(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = attrs.evolve(await owner_of(trader), allowed_ips=("203.0.113.7",))
    only_the_lookup(trader, monkeypatch, owner, [])
    history_at_the_cap(trader, monkeypatch)
    body = trader.body()

    from_elsewhere = await trader.send(body, ip=ATTACKER_IP)
    capped = await trader.send(body)
    replayed = await trader.send(body)

    assert isinstance(from_elsewhere, Rejected) and from_elsewhere.code == "ip_not_allowed"
    assert isinstance(capped, Rejected) and capped.code == "daily_cap_reached"
    assert isinstance(replayed, Rejected) and replayed.code == "replay"


async def test_audit_down_after_the_hand_over_is_503_and_keeps_the_replay_key(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = trader.system
    append = system.audit.append

    async def success_entries_down(entry: AuditEntry) -> int:
        if entry.action is AuditAction.WEBHOOK_ORDER and entry.success:
            raise DatabaseUnavailable("postgres down")
        return await append(entry)

    body = trader.body()
    with monkeypatch.context() as patch:
        patch.setattr(system.audit, "append", success_entries_down)
        outcome = await trader.send(body)
    resent = await trader.send(body)

    assert isinstance(outcome, Rejected) and outcome.status == 503
    assert trader.position() == Decimal(1)  # the order was on its way: it stays one order
    assert isinstance(resent, Rejected) and resent.code == "replay"
    assert len(await system.orders.list_for_user(trader.user.id)) == 1


async def test_the_success_entry_names_the_order(trader: Trader) -> None:
    outcome = await trader.send(trader.body())

    assert isinstance(outcome, Accepted)
    (stored,) = trader.system.audit.all()
    entry = stored.entry
    assert entry.action is AuditAction.WEBHOOK_ORDER and entry.success
    assert (entry.resource_type, entry.resource_id) == ("order", outcome.result.order_id)
    assert entry.metadata["trading_account_id"] == trader.account.account.id
    row = await trader.system.orders.get(outcome.result.order_id)
    assert row is not None and row.fingerprint is not None
    assert entry.metadata["simulation"] is False
    assert entry.metadata["payload_hash"] == row.fingerprint


async def test_dashboard_success_entry_names_the_order(trader: Trader) -> None:
    system = trader.system
    order = DashboardOrder(trader.account.account.id, "BTCUSDT", AlertAction.BUY, Decimal(1))

    outcome = await system.dashboard.place(
        trader.user, order, simulation=False, context=context(path="/trading/order")
    )

    assert isinstance(outcome, Accepted)
    (stored,) = system.audit.all()
    entry = stored.entry
    assert entry.action is AuditAction.DASHBOARD_ORDER and entry.success
    assert (entry.resource_type, entry.resource_id) == ("order", outcome.result.order_id)


async def test_dashboard_ip_list_still_applies(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = trader.system
    await system.allowed_ips.add(
        AllowedIp("ip-1", trader.user.id, "203.0.113.7", system.clock.now())
    )
    order = DashboardOrder(trader.account.account.id, "BTCUSDT", AlertAction.BUY, Decimal(1))

    outcome = await system.dashboard.place(
        trader.user, order, simulation=False, context=context(ATTACKER_IP, "/trading/order")
    )

    assert isinstance(outcome, Rejected) and outcome.code == "ip_not_allowed"
