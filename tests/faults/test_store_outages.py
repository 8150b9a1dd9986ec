"""Redis or Postgres stopped under running API and worker processes.

What a user depends on: while a store is down, an order path answers 503 and acknowledges
nothing (no order is executed behind a 5xx), login answers 503 rather than a wrong 401, and
once the store is back the same requests succeed without restarting anything; an order a
worker was executing when Postgres went away is completed, once, when it is back; a worker
waiting for its user's next order when Redis went away is still serving when it is back.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest
from harness import PASSWORD, Reply, Stack, eventually, webhook_body

from tradecore_adapters.redis import RedisRateLimiter, connect

pytestmark = pytest.mark.faults

PROBLEM = "application/problem+json"
OUTAGE_WARNING = "retrying until the store is back"
TAKE_OUTAGE_WARNING = "taking a request interrupted"


def unavailable(reply: Reply) -> bool:
    return reply.status == 503 and reply.content_type == PROBLEM


async def account_orders(stack: Stack, account_id: str) -> dict[str, str]:
    rows = await stack.db.rows(
        "SELECT id, status FROM order_history WHERE trading_account_id = %s", account_id
    )
    return {str(i): str(s) for i, s in rows}


async def test_redis_stopped_gives_503_on_order_paths_and_orders_resume_when_it_is_back(
    stack: Stack,
) -> None:
    api, _, account = await asyncio.gather(stack.api(), stack.worker(), stack.new_account())
    token = await api.access_token(stack.trader.email)
    before = await api.webhook(account, webhook_body(account))
    assert before.status == 200, before

    await asyncio.to_thread(stack.redis.kill)
    body = webhook_body(account)
    webhook = await api.webhook(account, body)
    dashboard = await api.dashboard_order(token, account)

    assert unavailable(webhook), webhook
    assert unavailable(dashboard), dashboard
    assert await api.ready_status() == 503
    orders = await account_orders(stack, account.trading_account_id)
    # Nothing was acknowledged and nothing was written: the webhook stopped at its admission
    # script (replay, rate limit and daily count in one call), the dashboard order at the
    # daily count, which is kept in Redis and fails closed (an order it cannot count could
    # pass the plan's cap), before any intent row.
    new = {i: s for i, s in orders.items() if i != before.body["order_id"]}
    assert new == {}, orders
    # The dashboard order's rate-limit hit, the check before the daily count, failed open as
    # the specification says the per-user limiter does.
    assert api.process is not None
    assert "admitting the request (fail open)" in api.process.output()
    assert len(await stack.db.broker_orders(account.trading_account_id)) == 1

    await asyncio.to_thread(stack.redis.start)  # same port, empty, as after a crash
    # The sender retries the body it got a 503 for; it must not be taken for a replay.
    await stack.executed(await api.webhook(account, body))
    await stack.executed(await api.dashboard_order(token, account))
    assert await api.ready_status() == 200
    assert len(await stack.db.broker_orders(account.trading_account_id)) == 3


async def test_redis_restarted_with_its_data_is_waited_out_by_an_active_worker_which_serves_on(
    stack: Stack,
) -> None:
    """The worker waits for the user's next order when Redis goes away; it backs off and keeps
    its lease, and Redis comes back with its data (a restart with persistence), lease included.
    The user's next order is then served at once - not after that lease ran out and the host's
    sweep started a new worker for a dead one."""
    api, worker, account = await asyncio.gather(stack.api(), stack.worker(), stack.new_account())
    before = await api.webhook(account, webhook_body(account))
    assert before.status == 200, before  # the user's worker is active

    def snapshot() -> None:
        client = stack.redis.client()
        try:
            client.save()
        finally:
            client.close()

    await asyncio.to_thread(snapshot)
    await asyncio.to_thread(stack.redis.kill)

    async def interrupted() -> bool:
        return TAKE_OUTAGE_WARNING in worker.output()

    await eventually(interrupted, "the worker to meet the outage", diagnose=stack.logs)
    await asyncio.sleep(1.0)  # down across several retries
    await asyncio.to_thread(stack.redis.start)  # loads the snapshot

    reply = await api.webhook(account, webhook_body(account))
    assert reply.status in (200, 202), reply
    # Served by the surviving worker within seconds; the lease it kept lives ~25 s more, so a
    # dead worker's user would wait that long for the sweep.
    await stack.order_reaches(reply.body["order_id"], "filled", timeout_s=6.0)
    output = worker.output()
    assert output.count(TAKE_OUTAGE_WARNING) == 1, output  # one warning for the outage
    assert "stopped on an error" not in output, output  # its task never died
    assert "has requests but no worker" not in output, output  # so no sweep restarted it
    assert len(await stack.db.broker_orders(account.trading_account_id)) == 2


async def test_the_rate_limiter_admits_while_its_redis_is_stopped(stack: Stack) -> None:
    """The adapter the API uses, against a server that is up, then killed."""
    client = connect(stack.redis.url, socket_timeout_s=1.0)
    limiter = RedisRateLimiter(client)
    try:
        assert (await limiter.hit("u-1", 1, 60.0)).allowed
        assert not (await limiter.hit("u-1", 1, 60.0)).allowed  # at its limit while up
        await asyncio.to_thread(stack.redis.kill)
        assert (await limiter.hit("u-1", 1, 60.0)).allowed
        assert (await limiter.hit("u-1", 1, 60.0)).allowed
    finally:
        await client.aclose()


async def test_postgres_stopped_gives_503_on_order_paths_and_login_and_recovers(
    stack: Stack,
) -> None:
    api, _, account = await asyncio.gather(stack.api(), stack.worker(), stack.new_account())
    token = await api.access_token(stack.trader.email)
    before = await api.webhook(account, webhook_body(account))
    assert before.status == 200, before

    await asyncio.to_thread(stack.proxy.stop)
    body = webhook_body(account)
    webhook, dashboard, login, ready = await asyncio.gather(
        api.webhook(account, body),
        api.dashboard_order(token, account),
        api.login(stack.trader.email, PASSWORD),
        api.ready_status(),
    )

    assert unavailable(webhook), webhook
    assert unavailable(dashboard), dashboard  # not 401: the session could not be read
    assert unavailable(login), login  # not 401: the password was never checked
    assert ready == 503

    await asyncio.to_thread(stack.proxy.start)

    async def ready_again() -> bool:
        return await api.ready_status() == 200

    await eventually(ready_again, "the API to reconnect to Postgres", diagnose=stack.logs)
    await stack.executed(await api.webhook(account, body))
    assert (await api.login(stack.trader.email, PASSWORD)).status == 200
    orders = await account_orders(stack, account.trading_account_id)
    assert sorted(orders.values()) == ["filled", "filled"], orders
    assert len(await stack.db.broker_orders(account.trading_account_id)) == 2


async def test_postgres_stopped_mid_order_is_waited_out_by_the_worker_which_completes_it_once(
    stack: Stack,
) -> None:
    """The worker meets the outage while it executes the order (its broker calls take 1.5 s,
    then the outcome and the broker's book must be saved): it keeps the request, retries it
    in place, and the order fills once, after Postgres is back - not after the host's sweep
    restarted a dead worker."""
    api, worker, account = await asyncio.gather(
        stack.api(), stack.worker(PAPER_BROKER_LATENCY_MS="1500"), stack.new_account()
    )
    reply = await api.webhook(account, webhook_body(account, quantity="0.1"))
    assert reply.status == 202, reply
    order_id = reply.body["order_id"]
    await stack.order_in_hand(order_id)

    await asyncio.to_thread(stack.proxy.stop)

    async def interrupted() -> bool:
        return OUTAGE_WARNING in worker.output()

    await eventually(interrupted, "the worker to meet the outage", diagnose=stack.logs)
    await asyncio.sleep(3.0)  # down across several retries
    assert await stack.db.order_status(order_id) == "queued"
    await asyncio.to_thread(stack.proxy.start)

    await stack.order_reaches(order_id, "filled")
    output = worker.output()
    assert output.count(OUTAGE_WARNING) == 1, output  # one warning for the outage
    assert "stopped on an error" not in output, output  # its task never died
    assert "has requests but no worker" not in output, output  # so no sweep restarted it
    assert len(await stack.db.broker_orders(account.trading_account_id)) == 1
    assert await stack.db.position(account.trading_account_id, "BTCUSDT") == Decimal("0.1")
