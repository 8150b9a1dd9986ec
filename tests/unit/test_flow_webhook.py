"""The webhook order flow end to end on the embedded system: every status of the
specification's validation and additional-checks tables, with the audit action each writes."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from typing import Any

import attrs
import pytest
from support import ATTACKER_IP, Trader, context, make_trader, webhook_body

from tradecore.audit import AuditAction
from tradecore.identity import AllowedIp, Plan
from tradecore.limits import PlanCaps
from tradecore.orders import OrderStatus
from tradecore.services.orders.outcomes import Accepted
from tradecore.services.orders.settings import OrderSettings
from tradecore.services.vocabulary import Rejected
from tradecore.testing.clock import FakeClock
from tradecore_entrypoints.system import System


def last_entry(trader: Trader):  # type: ignore[no-untyped-def]
    return [s.entry for s in trader.system.audit.all()][-1]


async def test_valid_alert_executes_and_is_recorded(trader: Trader) -> None:
    outcome = await trader.send(trader.body(action="buy", quantity=2))

    assert isinstance(outcome, Accepted)
    result = outcome.result
    assert result.status is OrderStatus.FILLED
    assert result.filled_quantity == Decimal(2)
    assert trader.position() == Decimal(2)
    row = await trader.system.orders.get(result.order_id)
    assert row is not None and row.status is OrderStatus.FILLED
    assert row.source.value == "webhook" and row.simulation is False
    entry = last_entry(trader)
    assert entry.action is AuditAction.WEBHOOK_ORDER and entry.success
    assert entry.resource_id == result.order_id


async def test_unknown_token_is_404_and_audited_without_user(system: System) -> None:
    outcome = await system.webhooks.handle(
        "no-such-token", webhook_body("s", system.clock.now()), simulation=False, context=context()
    )

    assert outcome == Rejected(404, "not_found", "Not found")
    entry = system.audit.all()[-1].entry
    assert entry.user_id is None and entry.success is False


async def test_disabled_user_is_403(trader: Trader) -> None:
    disabled = attrs.evolve(trader.user, disabled=True)
    assert await trader.system.users.save(disabled, previous=trader.user)

    outcome = await trader.send(trader.body())

    assert isinstance(outcome, Rejected) and outcome.status == 403
    assert trader.position() == 0


async def test_ip_not_allowed_is_403_alerts_and_spends_nothing(trader: Trader) -> None:
    system = trader.system
    await system.allowed_ips.add(
        AllowedIp("ip1", trader.user.id, "203.0.113.7", system.clock.now())
    )
    body = trader.body()

    blocked = await trader.send(body, ip=ATTACKER_IP)
    await system.events.drain()

    assert isinstance(blocked, Rejected) and blocked.status == 403
    entry = last_entry(trader)
    assert entry.action is AuditAction.WEBHOOK_IP_BLOCKED
    assert entry.context.ip_address == ATTACKER_IP
    assert [m.to for m in system.outbox.sent] == [trader.user.email]
    # the blocked copy burnt neither the fingerprint nor anything else: the real alert passes
    assert isinstance(await trader.send(body), Accepted)


async def test_expired_timestamp_is_401_request_expired(trader: Trader, clock: FakeClock) -> None:
    stale = clock.now() - timedelta(seconds=301)

    outcome = await trader.send(trader.body(timestamp=stale))
    await trader.system.events.drain()

    assert outcome == Rejected(401, "request_expired", "Request expired")
    entry = last_entry(trader)
    assert entry.action is AuditAction.WEBHOOK_TIMESTAMP_EXPIRED
    assert entry.metadata["trading_account_id"] == trader.account.account.id
    assert len(trader.system.outbox.sent) == 1


async def test_timestamp_ahead_within_window_is_accepted(trader: Trader, clock: FakeClock) -> None:
    ahead = clock.now() + timedelta(seconds=299)

    assert isinstance(await trader.send(trader.body(timestamp=ahead)), Accepted)


async def test_wrong_secret_is_401_credential_attack(trader: Trader) -> None:
    body = webhook_body("not-the-secret", trader.system.clock.now())

    outcome = await trader.send(body, ip=ATTACKER_IP)
    await trader.system.events.drain()

    assert isinstance(outcome, Rejected) and outcome.status == 401
    entry = last_entry(trader)
    assert entry.action is AuditAction.WEBHOOK_CREDENTIAL_ATTACK
    assert entry.metadata == {
        "attack_type": "wrong_secret",
        "trading_account_id": trader.account.account.id,
    }
    assert "not-the-secret" not in repr(trader.system.audit.all())
    assert len(trader.system.outbox.sent) == 1


@pytest.mark.parametrize("secret", [12345, True, "", ["a"], {"s": 1}], ids=repr)
async def test_a_secret_that_is_not_a_string_is_a_wrong_secret(trader: Trader, secret: Any) -> None:
    body = json.loads(trader.body())
    body["secret"] = secret
    outcome = await trader.send(json.dumps(body).encode(), ip=ATTACKER_IP)
    await trader.system.events.drain()

    assert isinstance(outcome, Rejected) and outcome.status == 401
    assert last_entry(trader).action is AuditAction.WEBHOOK_CREDENTIAL_ATTACK
    assert len(trader.system.outbox.sent) == 1  # the owner is alerted


async def test_replay_is_409_with_payload_hash(trader: Trader) -> None:
    body = trader.body()
    assert isinstance(await trader.send(body), Accepted)

    outcome = await trader.send(body)

    assert isinstance(outcome, Rejected) and outcome.status == 409
    entry = last_entry(trader)
    assert entry.action is AuditAction.WEBHOOK_REPLAY_ATTACK
    assert len(entry.metadata["payload_hash"]) == 32
    assert trader.position() == Decimal(1)


async def test_replay_is_refused_by_order_history_when_the_replay_store_lost_it(
    trader: Trader,
) -> None:
    body = trader.body()
    assert isinstance(await trader.send(body), Accepted)
    fingerprint = last_entry(trader).metadata["payload_hash"]
    # as after a Redis failover or flush
    await trader.system.replay.release(trader.user.id, fingerprint)

    outcome = await trader.send(body)

    assert isinstance(outcome, Rejected) and outcome.status == 409
    assert trader.position() == Decimal(1)


async def test_malformed_body_is_400_without_mail(trader: Trader) -> None:
    outcome = await trader.send(b'{"action": "buy", "quantity": NaN}')
    await trader.system.events.drain()

    assert isinstance(outcome, Rejected) and outcome.status == 400
    assert last_entry(trader).action is AuditAction.WEBHOOK_PAYLOAD_INVALID
    assert trader.system.outbox.sent == []


@pytest.mark.parametrize("settings", [OrderSettings(rate_limit_per_minute=3)])
async def test_rate_limit_is_429_after_the_limit(trader: Trader, clock: FakeClock) -> None:
    statuses = []
    for _ in range(4):
        clock.advance(1)
        outcome = await trader.send(trader.body())
        statuses.append(outcome.status if isinstance(outcome, Rejected) else 200)

    assert statuses == [200, 200, 200, 429]


async def test_wrong_secret_spends_no_rate_limit_slot(trader: Trader) -> None:
    for _ in range(70):
        await trader.send(webhook_body("wrong", trader.system.clock.now()), ip=ATTACKER_IP)

    assert isinstance(await trader.send(trader.body()), Accepted)


async def test_free_plan_real_order_is_403_but_simulation_passes(system: System) -> None:
    trader = await make_trader(system, plan=Plan.FREE)

    real = await trader.send(trader.body())
    simulated = await trader.send(trader.body(quantity=2), simulation=True)

    assert isinstance(real, Rejected) and real.status == 403
    assert isinstance(simulated, Accepted) and simulated.result.simulation
    assert trader.position() == 0  # the simulation traded on its own paper book


@pytest.mark.parametrize("settings", [OrderSettings(plan_caps=PlanCaps.parse("free=5,pro=2"))])
async def test_daily_cap_is_429(trader: Trader, clock: FakeClock) -> None:
    for _ in range(2):
        clock.advance(1)
        assert isinstance(await trader.send(trader.body()), Accepted)
    clock.advance(1)

    outcome = await trader.send(trader.body())

    assert isinstance(outcome, Rejected) and outcome.status == 429
    assert outcome.code == "daily_cap_reached"


async def test_unverified_credentials_is_400_on_the_webhook(system: System) -> None:
    trader = await make_trader(system, verified=False)

    outcome = await trader.send(trader.body())

    assert isinstance(outcome, Rejected) and outcome.status == 400
    assert outcome.code == "credentials_unverified"


async def test_terms_not_accepted_is_403(system: System) -> None:
    trader = await make_trader(system, terms=None)

    outcome = await trader.send(trader.body())

    assert isinstance(outcome, Rejected) and outcome.status == 403
    assert outcome.code == "terms_not_accepted"


async def test_simulation_bypasses_exactly_timestamp_and_secret(
    trader: Trader, clock: FakeClock
) -> None:
    stale = clock.now() - timedelta(hours=2)
    body = webhook_body("wrong secret", stale)

    first = await trader.send(body, simulation=True)
    replayed = await trader.send(body, simulation=True)
    from_elsewhere = None
    await trader.system.allowed_ips.add(
        AllowedIp("ip1", trader.user.id, "203.0.113.7", clock.now())
    )
    from_elsewhere = await trader.send(
        webhook_body(None, None, quantity=3), simulation=True, ip=ATTACKER_IP
    )

    assert isinstance(first, Accepted) and first.result.simulation
    assert isinstance(replayed, Rejected) and replayed.status == 409
    assert isinstance(from_elsewhere, Rejected) and from_elsewhere.status == 403


async def test_symbol_outside_the_allowed_list_is_400(trader: Trader) -> None:
    system = trader.system
    account = trader.account.account
    limited = attrs.evolve(account, allowed_symbols=frozenset({"ES"}))
    assert await system.accounts.save(limited, previous=account)

    outcome = await trader.send(trader.body(symbol="BTCUSDT"))

    assert isinstance(outcome, Rejected) and outcome.status == 400
    assert trader.position() == 0


async def test_every_request_leaves_exactly_one_audit_entry(trader: Trader) -> None:
    bodies = [
        trader.body(),
        trader.body(),  # replay
        webhook_body("wrong", trader.system.clock.now()),
        b"not json",
    ]
    for body in bodies:
        await trader.send(body)

    assert len(trader.system.audit.all()) == len(bodies)
