"""Worker hosts that die mid-order, and brokers that drop the connection.

What a user depends on: an order in flight when its worker host is killed is answered 202 and
is carried out exactly once by the host that takes the user over - never lost, never doubled
at the broker; and a broker that drops the line now and then does not fail orders.

The paper broker's books live in Postgres (``documents``): one document per broker order,
named after its client order id, and the account's book with its positions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal

import psycopg
import pytest
from harness import (
    SETTLE_TIMEOUT_S,
    Account,
    Process,
    Stack,
    eventually,
    webhook_body,
)

from tradecore_adapters.redis import RedisFillTaskQueue, connect
from tradecore_adapters.redis.messaging import handed_key, processing_key, requests_key

pytestmark = pytest.mark.faults

SLOW_BROKER = {"PAPER_BROKER_LATENCY_MS": "1500"}
"""Every broker call takes 1.5 s, so an order is in flight for seconds."""
QUANTITY = Decimal("0.1")


async def take_over(stack: Stack) -> None:
    """A new worker host takes the user over after the old host died: the dead host's lease
    runs out (ended now instead of after its 30 s) and the new host, finding the user's
    request in flight with no lease, starts the user's worker, which recovers it."""
    await stack.end_lease()
    await stack.worker()


async def test_a_worker_killed_mid_order_gives_202_and_the_next_host_completes_it_once(
    stack: Stack,
) -> None:
    api, worker, account = await asyncio.gather(
        stack.api(), stack.worker(**SLOW_BROKER), stack.new_account()
    )
    token = await api.access_token(stack.trader.email)

    reply = await api.webhook(account, webhook_body(account, quantity=str(QUANTITY)))
    assert reply.status == 202, reply
    assert reply.body["status"] == "queued"
    order_id = reply.body["order_id"]
    await stack.order_in_hand(order_id)
    await worker.kill()
    assert await stack.db.order_status(order_id) == "queued", "finished before the kill"

    await take_over(stack)

    async def filled() -> bool:
        polled = await api.order(token, order_id)
        return polled.status == 200 and polled.body["status"] == "filled"

    await eventually(filled, "the recovered order to fill", timeout_s=SETTLE_TIMEOUT_S)
    item = (await api.order(token, order_id)).body
    assert Decimal(item["fill_quantity"]) == QUANTITY
    assert len(item["broker_refs"]) == 1
    [(client_order_id,)] = await stack.db.rows(
        "SELECT client_order_id FROM order_history WHERE id = %s", order_id
    )
    broker_orders = await stack.db.broker_orders(account.trading_account_id)
    assert list(broker_orders) == [
        f"paper:live:{account.trading_account_id}:order:{client_order_id}"
    ], broker_orders
    assert await stack.db.position(account.trading_account_id, "BTCUSDT") == QUANTITY


async def test_an_order_handed_over_to_a_killed_worker_is_run_once_by_the_next_host(
    stack: Stack,
) -> None:
    """The worker host dies while idle; its lease lives on for its time to live, so the next
    order's push hands the order over to the dead worker (into the in-flight list, with the
    hand-over key) and nobody takes it: the webhook is answered 202. The host that takes the
    user over finds the order in flight with no lease, and its take returns the hand-over:
    executed once, without being reported as a crashed worker's order."""
    api, worker, account = await asyncio.gather(stack.api(), stack.worker(), stack.new_account())
    await stack.executed(await api.webhook(account, webhook_body(account, quantity="0.1")))
    await worker.kill()

    reply = await api.webhook(account, webhook_body(account, quantity="0.1"))
    assert reply.status == 202, reply
    order_id = reply.body["order_id"]
    user_id = stack.trader.user_id
    assert await asyncio.to_thread(stack.redis.exists, handed_key(user_id))
    assert await asyncio.to_thread(stack.redis.length, processing_key(user_id)) == 1
    assert await asyncio.to_thread(stack.redis.length, requests_key(user_id)) == 0

    await stack.end_lease()
    successor = await stack.worker(log_level="INFO")
    await stack.order_reaches(order_id, "filled")
    assert len(await stack.db.broker_orders(account.trading_account_id)) == 2
    assert await stack.db.position(account.trading_account_id, "BTCUSDT") == Decimal("0.2")
    assert not await asyncio.to_thread(stack.redis.exists, handed_key(user_id))
    assert await asyncio.to_thread(stack.redis.length, processing_key(user_id)) == 0
    assert f"recovering order {order_id}" not in successor.output()


async def test_a_worker_killed_between_a_reversals_close_and_entry_repeats_neither(
    stack: Stack,
) -> None:
    """The harder moment: one broker order of the order (the close of a short) is placed,
    the next (the long entry) is not, and the order-history row knows neither."""
    api, worker, account = await asyncio.gather(
        stack.api(), stack.worker(**SLOW_BROKER), stack.new_account()
    )
    short = await api.webhook(account, webhook_body(account, action="sell"))
    assert short.status in (200, 202), short
    await stack.order_reaches(short.body["order_id"], "filled")

    reply = await api.webhook(account, webhook_body(account, action="buy"))
    assert reply.status == 202, reply
    order_id = reply.body["order_id"]

    async def close_placed() -> bool:
        return len(await stack.db.broker_orders(account.trading_account_id)) == 2

    await eventually(close_placed, "the reversal's close", timeout_s=SETTLE_TIMEOUT_S)
    await worker.kill()
    assert await stack.db.order_status(order_id) == "submitted", "finished before the kill"

    await take_over(stack)
    await stack.order_reaches(order_id, "filled")

    rows = await stack.db.rows(
        "SELECT auto_exit, exit_quantity, position_before, fill_quantity, broker_refs"
        " FROM order_history WHERE id = %s",
        order_id,
    )
    auto_exit, exit_quantity, position_before, fill_quantity, refs = rows[0]
    assert auto_exit is True
    assert (exit_quantity, position_before, fill_quantity) == (QUANTITY, -QUANTITY, QUANTITY)
    assert len(refs) == 2  # the close and the entry
    broker_orders = await stack.db.broker_orders(account.trading_account_id)
    assert len(broker_orders) == 3, broker_orders  # the short, the close, the entry
    assert await stack.db.position(account.trading_account_id, "BTCUSDT") == QUANTITY


@asynccontextmanager
async def row_locked(stack: Stack, order_id: str) -> AsyncIterator[None]:
    """The order's row locked against writes (a transaction of the test's, held open): the
    worker's result waits for it, as behind a slow commit."""
    conn = await psycopg.AsyncConnection.connect(stack.db.conninfo)
    async with conn, conn.transaction(force_rollback=True):
        await conn.execute("SELECT id FROM order_history WHERE id = %s FOR UPDATE", [order_id])
        yield


async def order_in_hand(stack: Stack) -> tuple[Process, Account, str]:
    """A worker host behind a slow broker (``SLOW_BROKER``) and one webhook order of a new
    account, answered 202 and taken by the worker, its outcome not recorded yet: the host,
    the account and the order id."""
    api, worker, account = await asyncio.gather(
        stack.api(), stack.worker(**SLOW_BROKER), stack.new_account()
    )
    reply = await api.webhook(account, webhook_body(account, quantity=str(QUANTITY)))
    assert reply.status == 202, reply
    order_id = reply.body["order_id"]
    await stack.order_in_hand(order_id)
    return worker, account, order_id


async def test_a_worker_killed_between_the_fill_check_and_the_result_leaves_one_check(
    stack: Stack,
) -> None:
    """The worker sends an order's first fill check while the placement's result commits.
    Killed after the send and before the commit, it leaves a check whose row still says
    ``queued``: the next host's fill verifier asks nothing and keeps the check for later,
    and the host records the order once; one broker order, the check still queued, no dead
    letter."""
    tasks = RedisFillTaskQueue(connect(stack.redis.url, socket_timeout_s=2.0))
    worker, account, order_id = await order_in_hand(stack)

    async with row_locked(stack, order_id):

        async def check_sent() -> bool:
            return await tasks.pending_count() == 1

        await eventually(check_sent, "the fill check sent beside the result", diagnose=stack.logs)
        await worker.kill()
        assert await stack.db.order_status(order_id) == "queued", "the result was written"
        await stack.end_lease()
        successor: Process = await stack.worker(log_level="INFO")

        async def checked_too_early() -> bool:
            return "placement result not recorded yet" in successor.output()

        await eventually(
            checked_too_early,
            "the check to find the result not recorded",
            timeout_s=SETTLE_TIMEOUT_S,
            diagnose=stack.logs,
        )
        assert await stack.db.order_status(order_id) == "queued"

    await stack.order_reaches(order_id, "filled")
    broker_orders = await stack.db.broker_orders(account.trading_account_id)
    assert len(broker_orders) == 1, broker_orders
    assert await stack.db.position(account.trading_account_id, "BTCUSDT") == QUANTITY
    assert await tasks.pending_count() == 1  # re-queued: it resumes once due again
    assert await tasks.dead_letters() == []


async def test_a_worker_killed_while_its_result_commits_stores_book_and_result_together(
    stack: Stack,
) -> None:
    """The paper broker's book is written in the statement of the order's result (with its
    claim: a one-step paper order is placed unclaimed). While that statement waits (the row
    locked, as behind a slow commit) neither is stored, and the worker is killed then. The
    statement may still commit once the lock is free (Postgres notices a dead client only
    when it answers it), and the next host has recovered the order meanwhile: whichever
    records it, the other's placement is dropped; the book holds the order once and the
    position once."""
    worker, account, order_id = await order_in_hand(stack)

    async with row_locked(stack, order_id):

        async def result_waits() -> bool:
            waiting = await stack.db.rows(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE 'WITH updated AS (UPDATE order_history%%'"
            )
            return bool(waiting)

        await eventually(result_waits, "the result and the book waiting", diagnose=stack.logs)
        assert await stack.db.broker_orders(account.trading_account_id) == {}
        await worker.kill()
        await stack.end_lease()
        await stack.worker()

    await stack.order_reaches(order_id, "filled")
    broker_orders = await stack.db.broker_orders(account.trading_account_id)
    assert len(broker_orders) == 1, broker_orders
    assert await stack.db.position(account.trading_account_id, "BTCUSDT") == QUANTITY


async def test_orders_fill_through_a_broker_that_drops_every_second_call(stack: Stack) -> None:
    api, worker, account = await asyncio.gather(
        stack.api(), stack.worker(PAPER_BROKER_DISCONNECT_EVERY="2"), stack.new_account()
    )
    replies = []
    for _ in range(3):
        replies.append(await api.webhook(account, webhook_body(account, quantity=str(QUANTITY))))

    assert [r.status for r in replies] == [200, 200, 200], [str(r) for r in replies]
    assert [r.body["status"] for r in replies] == ["filled"] * 3
    assert "reconnecting" in worker.output()  # the line did drop
    assert len(await stack.db.broker_orders(account.trading_account_id)) == 3
    assert await stack.db.position(account.trading_account_id, "BTCUSDT") == 3 * QUANTITY


async def test_a_worker_stopped_with_sigterm_hands_its_users_over_at_once(stack: Stack) -> None:
    """A deploy stops a host with SIGTERM: it exits cleanly and releases its leases, so the
    user's next order is served by another host now, not after the lease's 30 s."""
    api, first, account = await asyncio.gather(stack.api(), stack.worker(), stack.new_account())
    before = await api.webhook(account, webhook_body(account))
    assert before.status == 200, before

    await first.stop()
    assert (first.process.returncode, first.forced) == (0, False), first.tail()
    await stack.worker()
    after = await api.webhook(account, webhook_body(account))

    assert after.status == 200, after
    assert after.body["status"] == "filled"
