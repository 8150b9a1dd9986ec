"""Duplicate alerts against real processes: a burst of one alert across two API processes,
and a replay after Redis lost its replay keys.

A user depends on one alert becoming at most one order, however it is delivered twice.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from harness import Stack, webhook_body

pytestmark = pytest.mark.faults

BURST_PER_PROCESS = 10


async def real_orders(stack: Stack, account_id: str) -> list[tuple[str, str]]:
    """(id, status) of the account's non-simulated order-history rows."""
    rows = await stack.db.rows(
        "SELECT id, status FROM order_history"
        " WHERE trading_account_id = %s AND NOT simulation ORDER BY created_at",
        account_id,
    )
    return [(str(i), str(s)) for i, s in rows]


async def test_one_alert_sent_20_times_at_once_to_two_api_processes_is_one_order(
    stack: Stack,
) -> None:
    first, second, _, account = await asyncio.gather(
        stack.api(), stack.api(), stack.worker(), stack.new_account()
    )
    # The user's worker is running, so the one accepted alert is answered within the wait.
    warm = await first.webhook(account, webhook_body(account), simulation=True)
    assert warm.status == 200, warm

    body = webhook_body(account)
    replies = await asyncio.gather(
        *(api.webhook(account, body) for api in [first, second] * BURST_PER_PROCESS)
    )

    statuses = Counter(r.status for r in replies)
    assert statuses == {200: 1, 409: 2 * BURST_PER_PROCESS - 1}, [str(r) for r in replies]
    accepted = next(r for r in replies if r.status == 200)
    assert accepted.body["status"] == "filled"
    refused = [r for r in replies if r.status == 409]
    assert all(r.content_type == "application/problem+json" for r in refused)
    assert await real_orders(stack, account.trading_account_id) == [
        (accepted.body["order_id"], "filled")
    ]
    assert len(await stack.db.broker_orders(account.trading_account_id)) == 1


async def test_a_replay_after_redis_lost_its_keys_is_refused_by_postgres(stack: Stack) -> None:
    api, _, account = await asyncio.gather(stack.api(), stack.worker(), stack.new_account())
    body = webhook_body(account)
    original = await api.webhook(account, body)
    assert original.status == 200, original
    assert original.body["status"] == "filled"

    await asyncio.to_thread(stack.redis.flushall)
    replay = await api.webhook(account, body)

    assert replay.status == 409, replay
    assert replay.content_type == "application/problem+json"
    assert await real_orders(stack, account.trading_account_id) == [
        (original.body["order_id"], "filled")
    ]


async def test_orders_are_executed_again_right_after_redis_lost_its_data(stack: Stack) -> None:
    """A flush (or a restart without persistence) also drops the worker's lease while its
    host still serves the user: the next order must still be executed, not refused with 503
    after the worker start timeout."""
    api, _, account = await asyncio.gather(stack.api(), stack.worker(), stack.new_account())
    before = await api.webhook(account, webhook_body(account))
    assert before.status == 200, before

    await asyncio.to_thread(stack.redis.flushall)
    after = await api.webhook(account, webhook_body(account))

    assert after.status == 200, after
    assert after.body["status"] == "filled"
    assert len(await stack.db.broker_orders(account.trading_account_id)) == 2
