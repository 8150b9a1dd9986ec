"""Security events: audit first, then at most one alert mail per user per 30 minutes, sent in
the background so that a failing or hanging mail server never touches the request."""

from __future__ import annotations

import asyncio

import pytest
from support import ATTACKER_IP, Trader, webhook_body

from tradecore.audit import AuditAction
from tradecore.ports.identity import MailMessage
from tradecore.services.vocabulary import Rejected
from tradecore.testing.clock import FakeClock


class BrokenMailer:
    def __init__(self) -> None:
        self.attempts = 0

    async def send(self, message: MailMessage) -> None:
        self.attempts += 1
        raise ConnectionRefusedError("smtp down")


class HangingMailer:
    async def send(self, message: MailMessage) -> None:
        await asyncio.Event().wait()


async def wrong_secret(trader: Trader) -> Rejected:
    outcome = await trader.send(webhook_body("wrong", trader.system.clock.now()), ip=ATTACKER_IP)
    assert isinstance(outcome, Rejected)
    return outcome


async def test_one_mail_per_user_per_thirty_minutes(trader: Trader, clock: FakeClock) -> None:
    await wrong_secret(trader)
    await wrong_secret(trader)
    await trader.system.events.drain()
    assert len(trader.system.outbox.sent) == 1

    clock.advance(29 * 60)
    await wrong_secret(trader)
    await trader.system.events.drain()
    assert len(trader.system.outbox.sent) == 1

    clock.advance(61)
    await wrong_secret(trader)
    await trader.system.events.drain()
    assert len(trader.system.outbox.sent) == 2


async def test_fifty_concurrent_attacks_give_fifty_entries_and_one_mail(trader: Trader) -> None:
    outcomes = await asyncio.gather(*(wrong_secret(trader) for _ in range(50)))
    await trader.system.events.drain()

    assert {o.status for o in outcomes} == {401}
    assert trader.audit_actions().count(AuditAction.WEBHOOK_CREDENTIAL_ATTACK) == 50
    assert len(trader.system.outbox.sent) == 1


async def test_mail_failure_never_reaches_the_request(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = BrokenMailer()
    monkeypatch.setattr(trader.system.events, "_mailer", broken)

    first = await wrong_secret(trader)
    await trader.system.events.drain()
    second = await wrong_secret(trader)
    await trader.system.events.drain()

    assert first.status == second.status == 401
    assert trader.audit_actions().count(AuditAction.WEBHOOK_CREDENTIAL_ATTACK) == 2
    # the slot is spent only by a mail handed to the server: both attempts were made
    assert broken.attempts == 2


async def test_hanging_mail_server_does_not_delay_the_answer(
    trader: Trader, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trader.system.events, "_mailer", HangingMailer())
    monkeypatch.setattr(trader.system.events, "_mail_timeout_s", 0.05)

    outcome = await asyncio.wait_for(wrong_secret(trader), timeout=5)
    await trader.system.events.drain()

    assert outcome.status == 401
    assert trader.audit_actions() == [AuditAction.WEBHOOK_CREDENTIAL_ATTACK]
