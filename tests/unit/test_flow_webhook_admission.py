"""The webhook's replay claim and rate-limit hit are one step (``WebhookAdmission``): the
decision order stays replay (409), rate limit (429), then plan, cap, credentials, terms,
symbol; a replay spends no rate-limit slot and a 429 stores no replay key."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import attrs
import pytest
from support import Trader, context, make_trader

from tradecore.audit import AuditAction
from tradecore.errors import KeyValueStoreUnavailable
from tradecore.identity import Plan
from tradecore.limits import PlanCaps
from tradecore.orders import AlertAction
from tradecore.ports.protection import Admission
from tradecore.services.orders.daily_orders import daily_quota
from tradecore.services.orders.dashboard_order import DashboardOrder
from tradecore.services.orders.outcomes import Accepted
from tradecore.services.orders.settings import OrderSettings
from tradecore.services.vocabulary import Rejected
from tradecore.testing.clock import FakeClock
from tradecore_adapters.memory.protection import (
    MemoryDailyOrderCounter,
    MemoryRateLimiter,
    MemoryReplayStore,
    MemoryWebhookAdmission,
)
from tradecore_entrypoints.system import System

ONE_A_MINUTE = OrderSettings(rate_limit_per_minute=1)
THREE_A_MINUTE = OrderSettings(rate_limit_per_minute=3)
CAPPED_AT_TWO = attrs.evolve(ONE_A_MINUTE, plan_caps=PlanCaps.parse("free=5,pro=2"))


def code(outcome: object) -> str:
    return outcome.code if isinstance(outcome, Rejected) else "accepted"


async def test_the_webhook_claims_and_counts_in_one_admission(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = trader.system
    calls: list[tuple[Any, ...]] = []
    admit = system.admission.admit

    async def spy(*args: Any) -> Admission:
        calls.append(args)
        return await admit(*args)

    async def separate(*args: object) -> object:
        raise AssertionError("the webhook path used the replay store or the limiter on its own")

    monkeypatch.setattr(system.admission, "admit", spy)
    monkeypatch.setattr(system.replay, "claim", separate)
    monkeypatch.setattr(system.limiter, "hit", separate)

    first = await trader.send(trader.body())
    # the day's first order found no counter: it was seeded, then the step ran again
    assert len(calls) == 2 and calls[0] == calls[1]
    calls.clear()
    outcome = await trader.send(trader.body(quantity=2))

    assert isinstance(first, Accepted) and isinstance(outcome, Accepted)
    ((fingerprint, ttl_s, user_id, limit, window_s, quota),) = calls
    assert fingerprint == trader.system.audit.all()[-1].entry.metadata["payload_hash"]
    assert (ttl_s, user_id, limit, window_s) == (300, trader.user.id, 60, 60.0)
    assert quota == daily_quota(trader.user, system.clock.now(), system.settings.plan_caps)


@pytest.mark.parametrize("settings", [THREE_A_MINUTE])
async def test_a_replay_spends_no_slot_and_wins_over_a_full_window(
    trader: Trader, clock: FakeClock
) -> None:
    first = trader.body()
    assert isinstance(await trader.send(first), Accepted)
    replays = [code(await trader.send(first)) for _ in range(5)]
    clock.advance(1)
    second = await trader.send(trader.body())  # slots two and three: the replays took none
    clock.advance(1)
    third = await trader.send(trader.body())
    clock.advance(1)

    replay_of_full = await trader.send(first)
    fourth = await trader.send(trader.body())

    assert replays == ["replay"] * 5
    assert isinstance(second, Accepted) and isinstance(third, Accepted)
    assert code(replay_of_full) == "replay"  # 409 before 429
    assert code(fourth) == "rate_limited"


@pytest.mark.parametrize("settings", [ONE_A_MINUTE])
async def test_a_rate_limited_request_stores_no_replay_key(
    trader: Trader, clock: FakeClock
) -> None:
    assert isinstance(await trader.send(trader.body(quantity=1)), Accepted)
    body = trader.body(quantity=2)

    refused = await trader.send(body)
    resent = await trader.send(body)
    clock.advance(60)  # the first order left the window; the body is still inside its age
    later = await trader.send(body)

    assert isinstance(refused, Rejected) and refused.status == 429
    assert refused.code == "rate_limited"
    assert refused.retry_after_s is not None and 0 < refused.retry_after_s <= 60
    assert code(resent) == "rate_limited"  # not a replay: the 429 kept nothing
    assert isinstance(later, Accepted)
    assert trader.position() == Decimal(3)
    assert trader.audit_actions() == [AuditAction.WEBHOOK_ORDER] * 4  # one entry each


def free(system: System) -> Any:
    return make_trader(system, plan=Plan.FREE)


def unverified(system: System) -> Any:
    return make_trader(system, verified=False)


def without_terms(system: System) -> Any:
    return make_trader(system, terms=None)


async def capped(system: System) -> Trader:
    """A trader who placed today's two orders (the cap below) on the dashboard."""
    trader = await make_trader(system)
    clock = system.clock
    assert isinstance(clock, FakeClock)
    order = DashboardOrder(trader.account.account.id, "BTCUSDT", AlertAction.BUY, Decimal(1))
    for _ in range(2):
        outcome = await system.dashboard.place(
            trader.user, order, simulation=True, context=context(path="/trading/order")
        )
        assert isinstance(outcome, Accepted)
        clock.advance(60)  # out of the rate window again
    return trader


async def symbol_limited(system: System) -> Trader:
    trader = await make_trader(system)
    account = trader.account.account
    limited = attrs.evolve(account, allowed_symbols=frozenset({"ES"}))
    assert await system.accounts.save(limited, previous=account)
    return trader


@pytest.mark.parametrize(
    ("settings", "provision", "later_check"),
    [
        (ONE_A_MINUTE, free, "plan_simulation_only"),
        (CAPPED_AT_TWO, capped, "daily_cap_reached"),
        (ONE_A_MINUTE, unverified, "credentials_unverified"),
        (ONE_A_MINUTE, without_terms, "terms_not_accepted"),
        (ONE_A_MINUTE, symbol_limited, "symbol_not_allowed"),
    ],
    ids=["plan", "cap", "credentials", "terms", "symbol"],
)
async def test_the_rate_limit_decides_before_the_later_checks(
    system: System, provision: Any, later_check: str
) -> None:
    trader = await provision(system)
    first = trader.body(quantity=1)

    refused_later = await trader.send(first)  # spends the one slot, and keeps its replay key
    rate_limited = await trader.send(trader.body(quantity=2))
    replayed = await trader.send(first)

    assert code(refused_later) == later_check
    assert code(rate_limited) == "rate_limited"
    assert code(replayed) == "replay"


@pytest.mark.parametrize("settings", [OrderSettings(rate_limit_per_minute=2)])
async def test_the_webhook_and_the_dashboard_share_one_window(trader: Trader) -> None:
    system = trader.system
    order = DashboardOrder(trader.account.account.id, "BTCUSDT", AlertAction.BUY, Decimal(1))

    async def dashboard() -> object:
        return await system.dashboard.place(
            trader.user, order, simulation=False, context=context(path="/trading/order")
        )

    outcomes = [
        await dashboard(),
        await trader.send(trader.body(quantity=2)),
        await trader.send(trader.body(quantity=3)),
        await dashboard(),
    ]

    assert [code(o) for o in outcomes] == ["accepted", "accepted", "rate_limited", "rate_limited"]


async def test_the_store_down_is_503_with_one_audit_entry(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def down(*args: object) -> Admission:
        raise KeyValueStoreUnavailable("redis down")

    monkeypatch.setattr(trader.system.admission, "admit", down)

    outcome = await trader.send(trader.body())

    assert isinstance(outcome, Rejected) and outcome.status == 503
    (stored,) = trader.system.audit.all()
    assert stored.entry.action is AuditAction.WEBHOOK_ORDER and not stored.entry.success
    assert stored.entry.error_message == "key-value store down"


async def test_the_memory_admission_never_suspends(clock: FakeClock) -> None:
    replay, limiter = MemoryReplayStore(clock), MemoryRateLimiter(clock)
    admission = MemoryWebhookAdmission(replay, limiter, MemoryDailyOrderCounter(clock))

    for fingerprint in ("fp1", "fp1", "fp2"):  # fresh, replay, refused by the limit of one
        step = admission.admit(fingerprint, 300, "u1", 1, 60)
        with pytest.raises(StopIteration) as done:
            step.send(None)  # runs to its end without giving the loop a turn
        assert isinstance(done.value.value, Admission)
    assert replay.held(replay.key("u1", "fp1")) and not replay.held(replay.key("u1", "fp2"))
