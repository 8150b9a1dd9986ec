"""Contract of the order-tasks FIFO queue (FillTaskQueue), on the memory and Redis adapters.

Delays and visibility timeouts are short (0.2 s) so the Redis runs pass real time briefly;
the memory runs move their fake clock instead. Waits a correct adapter cuts short are given a
generous timeout, and the test checks what came back, never how long it took.
"""

from __future__ import annotations

import asyncio

import pytest
from redis_fixtures import KvHarness, fill_task

from tradecore.ports.messaging import FillDelivery, FillTaskQueue
from tradecore_adapters.redis.keys import DEFAULT_SHARDS, shard_of

NEVER_S = 5.0
SHORT_S = 0.2
SETTLE_S = 0.05
LONG_S = 60.0
"""A receive that only a wake-up ends within NEVER_S."""


async def pass_short_times(kv: KvHarness, times: int) -> None:
    """Let ``times`` * SHORT_S go by (``KvHarness.pass_time`` takes a short pause at a time)."""
    for _ in range(times):
        await kv.pass_time(SHORT_S)


async def received(tasks: FillTaskQueue, timeout_s: float = 0) -> FillDelivery:
    delivery = await tasks.receive(timeout_s)
    assert delivery is not None, "nothing was delivered"
    return delivery


def test_the_adapter_implements_the_port(kv: KvHarness) -> None:
    assert isinstance(kv.tasks(), FillTaskQueue)


async def test_a_group_delivers_nothing_while_a_message_is_in_flight(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1"), 0)
    await tasks.send(fill_task("o2"), 0)
    await tasks.send(fill_task("p1", "u2"), 0)
    first = await received(tasks)
    assert (first.task, first.receive_count) == (fill_task("o1"), 1)
    assert (await received(tasks)).task == fill_task("p1", "u2")
    assert await tasks.receive(0) is None  # o2 waits for o1
    await tasks.ack(first)
    assert (await received(tasks)).task == fill_task("o2")


async def test_messages_sent_to_a_busy_group_wait_for_it(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1"), 0)
    first = await received(tasks)
    await tasks.send(fill_task("o2"), 0)
    await tasks.send(fill_task("o3"), SHORT_S)
    await kv.pass_time(SHORT_S)
    assert await tasks.receive(0) is None
    await tasks.ack(first)
    assert (await received(tasks)).task == fill_task("o2")


SAME_SHARD = ("u1", "u28", "u37")
"""Users of one shard of the Redis queue (16 shards): it keeps the send order across groups
within a shard only, as SQS FIFO keeps none across message groups."""


def test_the_same_shard_users_share_a_shard() -> None:
    assert len({shard_of(user, DEFAULT_SHARDS) for user in SAME_SHARD}) == 1
    assert shard_of("u2", DEFAULT_SHARDS) != shard_of("u1", DEFAULT_SHARDS)


async def test_the_oldest_visible_message_of_a_free_group_comes_first(kv: KvHarness) -> None:
    tasks = kv.tasks()
    u1, u2, u3 = SAME_SHARD
    for order_id, user in [("a1", u1), ("b1", u2), ("a2", u1), ("c1", u3), ("b2", u2)]:
        await tasks.send(fill_task(order_id, user), 0)
    order = []
    while (delivery := await tasks.receive(0)) is not None:
        order.append(delivery.task.order_id)
        await tasks.ack(delivery)
    assert order == ["a1", "b1", "a2", "c1", "b2"]


async def test_every_group_keeps_its_order_across_shards(kv: KvHarness) -> None:
    tasks = kv.tasks()
    users = [f"u{n}" for n in range(40)]  # every shard of 16 has some
    for n in range(3):
        for user in users:
            await tasks.send(fill_task(f"{user}-{n}", user), 0)
    seen: dict[str, list[str]] = {}
    while (delivery := await tasks.receive(0)) is not None:
        seen.setdefault(delivery.task.user_id, []).append(delivery.task.order_id)
        await tasks.ack(delivery)
    assert seen == {user: [f"{user}-{n}" for n in range(3)] for user in users}


async def test_a_delayed_message_becomes_visible_after_its_delay(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1"), SHORT_S)
    assert await tasks.receive(0) is None
    await kv.pass_time(SHORT_S)
    assert (await received(tasks, NEVER_S)).task == fill_task("o1")


async def test_a_delayed_message_does_not_hold_back_its_group(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("late"), 60)
    await tasks.send(fill_task("now"), 0)
    assert (await received(tasks)).task == fill_task("now")


async def test_receive_waits_for_a_send(kv: KvHarness) -> None:
    tasks = kv.tasks()
    waiter = asyncio.create_task(tasks.receive(NEVER_S))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await tasks.send(fill_task("o1"), 0)
    delivery = await waiter
    assert delivery is not None and delivery.task == fill_task("o1")


async def test_a_send_ends_a_wait_for_a_later_message(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("later"), 60)  # the waiting receiver sleeps until it is due...
    assert await tasks.receive(SETTLE_S) is None  # (a receiver that has waited before)
    waiter = asyncio.create_task(tasks.receive(LONG_S))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await tasks.send(fill_task("now", user_id="u2"), 0)  # ...unless something comes sooner
    delivery = await asyncio.wait_for(waiter, NEVER_S)
    assert delivery is not None and delivery.task == fill_task("now", user_id="u2")


async def test_settling_a_message_wakes_a_receiver_for_the_next_of_its_group(
    kv: KvHarness,
) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1"), 0)
    await tasks.send(fill_task("o2"), 0)
    first = await received(tasks)
    assert await tasks.receive(SETTLE_S) is None  # (a receiver that has waited before)
    waiter = asyncio.create_task(tasks.receive(LONG_S))  # o2 waits for o1's group
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await tasks.ack(first)
    delivery = await asyncio.wait_for(waiter, NEVER_S)
    assert delivery is not None and delivery.task == fill_task("o2")


async def test_receive_gives_up_after_its_timeout(kv: KvHarness) -> None:
    tasks = kv.tasks()
    assert await tasks.receive(0.05) is None


async def test_ack_deletes_the_message(kv: KvHarness) -> None:
    tasks = kv.tasks(visibility_timeout_s=SHORT_S)
    await tasks.send(fill_task("o1"), 0)
    await tasks.ack(await received(tasks))
    await kv.pass_time(SHORT_S)
    assert await tasks.receive(0) is None
    assert await tasks.dead_letters() == []


async def test_retry_redelivers_after_its_delay_and_frees_the_group(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1"), 0)
    await tasks.send(fill_task("o2"), 0)
    first = await received(tasks)
    assert first.task == fill_task("o1")
    await tasks.retry(first, SHORT_S)
    behind = await received(tasks)
    assert behind.task == fill_task("o2")
    await tasks.ack(behind)
    assert await tasks.receive(0) is None
    await kv.pass_time(SHORT_S)
    again = await received(tasks, NEVER_S)
    assert (again.task, again.receive_count) == (fill_task("o1"), 2)
    assert again.receipt != first.receipt


async def test_a_retry_without_delay_is_visible_at_once(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1"), 0)
    await tasks.retry(await received(tasks), 0)
    again = await received(tasks)
    assert (again.task, again.receive_count) == (fill_task("o1"), 2)


async def test_an_unsettled_message_is_redelivered_after_the_visibility_timeout(
    kv: KvHarness,
) -> None:
    # Longer than the other tests' timeouts: the new delivery must still be in flight after
    # three calls to the store (0.2 s was once too short for them on the cluster).
    tasks = kv.tasks(visibility_timeout_s=4 * SHORT_S)
    await tasks.send(fill_task("o1"), 0)
    await tasks.send(fill_task("o2"), 0)
    lost = await received(tasks)
    assert await tasks.receive(0) is None
    await pass_short_times(kv, 4)
    again = await received(tasks, NEVER_S)
    assert (again.task, again.receive_count) == (fill_task("o1"), 2)
    # The first receipt is stale now: settling with it changes nothing.
    await tasks.ack(lost)
    await tasks.dead_letter(lost, "stale")
    assert await tasks.receive(0) is None  # the group is busy with the new delivery
    await pass_short_times(kv, 4)
    third = await received(tasks, NEVER_S)
    assert (third.task, third.receive_count) == (fill_task("o1"), 3)
    assert await tasks.dead_letters() == []


async def test_a_late_settle_of_the_latest_delivery_is_honoured(kv: KvHarness) -> None:
    tasks = kv.tasks(visibility_timeout_s=SHORT_S)
    await tasks.send(fill_task("o1"), 0)
    await tasks.send(fill_task("o2"), 0)
    slow = await received(tasks)
    await kv.pass_time(SHORT_S)  # past the visibility timeout, not yet delivered again
    await tasks.ack(slow)
    following = await received(tasks, NEVER_S)
    assert (following.task, following.receive_count) == (fill_task("o2"), 1)


async def test_an_older_message_made_visible_meanwhile_comes_first_after_a_visibility_timeout(
    kv: KvHarness,
) -> None:
    """A message that became visible while its group was busy is older than the one in
    flight: when that one's visibility timeout ends, the older is delivered first; a late
    settle of the other (still its latest delivery) leaves the group busy with the older."""
    tasks = kv.tasks(visibility_timeout_s=SHORT_S)
    await tasks.send(fill_task("o1"), SHORT_S)  # sent first, visible later
    await tasks.send(fill_task("o2"), 0)
    slow = await received(tasks)
    assert slow.task == fill_task("o2")
    await pass_short_times(kv, 2)  # o1 is due, o2's visibility timeout has ended
    older = await received(tasks, NEVER_S)
    assert (older.task, older.receive_count) == (fill_task("o1"), 1)
    await tasks.send(fill_task("o3"), 0)
    await tasks.ack(slow)  # o2 was not delivered again: its late settle is honoured
    assert await tasks.receive(0) is None  # the group is still busy with o1
    await tasks.ack(older)
    following = await received(tasks, NEVER_S)
    assert (following.task, following.receive_count) == (fill_task("o3"), 1)
    assert await tasks.receive(0) is None


async def test_a_settled_delivery_cannot_be_settled_again(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1"), 0)
    delivery = await received(tasks)
    await tasks.retry(delivery, 0)
    await tasks.ack(delivery)
    await tasks.dead_letter(delivery, "late")
    await tasks.retry(delivery, 60)
    again = await received(tasks)
    assert again.task == fill_task("o1")
    assert await tasks.dead_letters() == []


async def test_a_forged_receipt_settles_nothing(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1"), 0)
    delivery = await received(tasks)
    for receipt in ["", "x.1", "1", "1.x", "99.1", delivery.receipt + "0"]:
        await tasks.ack(FillDelivery(delivery.task, receipt, delivery.receive_count))
    await tasks.ack(delivery)
    assert await tasks.receive(0) is None


async def test_dead_letters_are_listed_with_their_reasons_oldest_first(kv: KvHarness) -> None:
    tasks = kv.tasks(visibility_timeout_s=SHORT_S)
    await tasks.send(fill_task("o1"), 0)
    await tasks.send(fill_task("p1", "u2"), 0)
    first = await received(tasks)
    second = await received(tasks)
    await tasks.dead_letter(first, "still pending after 3 retries")
    await tasks.dead_letter(second, 'broker unreachable: "timeout" / 3')
    assert await tasks.dead_letters() == [
        (fill_task("o1"), "still pending after 3 retries"),
        (fill_task("p1", "u2"), 'broker unreachable: "timeout" / 3'),
    ]
    await kv.pass_time(SHORT_S)
    assert await tasks.receive(0) is None


async def test_concurrent_receivers_get_one_message_per_group(kv: KvHarness) -> None:
    tasks = kv.tasks()
    for user in ("u1", "u2", "u3"):
        for n in range(3):
            await tasks.send(fill_task(f"{user}-{n}", user), 0)
    deliveries = await asyncio.gather(*(tasks.receive(0) for _ in range(10)))
    got = [d.task.order_id for d in deliveries if d is not None]
    assert sorted(got) == ["u1-0", "u2-0", "u3-0"]


async def test_receive_counts_grow_with_each_delivery(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1"), 0)
    counts = []
    for _ in range(4):
        delivery = await received(tasks)
        counts.append(delivery.receive_count)
        await tasks.retry(delivery, 0)
    assert counts == [1, 2, 3, 4]


# --- Deduplication by order id (SQS FIFO's MessageDeduplicationId) --------------------------


async def test_a_second_send_of_an_order_within_the_window_stores_nothing(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1"), 0)
    await tasks.send(fill_task("o1"), 0)
    first = await received(tasks)
    assert (first.task, first.receive_count) == (fill_task("o1"), 1)
    await tasks.ack(first)
    await tasks.send(fill_task("o1"), 0)  # settled, but still within the window
    assert await tasks.receive(0) is None
    assert await tasks.dead_letters() == []


async def test_a_resend_does_not_touch_the_message_in_flight(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1"), 0)
    first = await received(tasks)
    await tasks.send(fill_task("o1"), 0)
    await tasks.retry(first, 0)  # a retry is not a send: it is never deduplicated
    again = await received(tasks)
    assert (again.task, again.receive_count) == (fill_task("o1"), 2)
    await tasks.ack(again)
    assert await tasks.receive(0) is None


async def test_a_send_after_the_window_is_delivered(kv: KvHarness) -> None:
    tasks = kv.tasks(dedup_window_s=SETTLE_S)
    await tasks.send(fill_task("o1"), 0)
    first = await received(tasks)
    await tasks.ack(first)
    await kv.pass_time(SHORT_S)  # well past the window
    await tasks.send(fill_task("o1"), 0)
    again = await received(tasks)
    assert (again.task, again.receive_count) == (fill_task("o1"), 1)
    assert again.receipt != first.receipt  # a new message


async def test_deduplication_is_by_order_only(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1"), 0)
    await tasks.send(fill_task("o2"), 0)
    await tasks.send(fill_task("p1", SAME_SHARD[1]), 0)
    # Same order id, other group (of the same shard: an order belongs to one user, so its
    # checks are always in its user's shard): still a duplicate.
    await tasks.send(fill_task("o1", SAME_SHARD[1]), 0)
    order = []
    while (delivery := await tasks.receive(0)) is not None:
        order.append(delivery.task)
        await tasks.ack(delivery)
    assert order == [fill_task("o1"), fill_task("o2"), fill_task("p1", SAME_SHARD[1])]


# --- Batches (receive_many) ----------------------------------------------------------------


def summary(deliveries: list[FillDelivery]) -> list[tuple[str, int]]:
    return [(d.task.order_id, d.receive_count) for d in deliveries]


async def test_a_batch_takes_up_to_its_limit_one_message_per_group(kv: KvHarness) -> None:
    tasks = kv.tasks()
    users = [f"u{n}" for n in range(5)]
    for n in range(2):
        for user in users:
            await tasks.send(fill_task(f"{user}-{n}", user), 0)
    first = await tasks.receive_many(3, 0)
    assert len(first) == 3
    rest = await tasks.receive_many(10, 0)  # every other group's first; the rest are behind
    batch = first + rest
    assert sorted(d.task.order_id for d in batch) == [f"{user}-0" for user in users]
    assert {d.receive_count for d in batch} == {1}
    assert await tasks.receive_many(10, 0) == []
    await asyncio.gather(*(tasks.ack(d) for d in batch))
    second = await tasks.receive_many(10, 0)
    assert sorted(d.task.order_id for d in second) == [f"{user}-1" for user in users]


async def test_a_batch_gathers_the_groups_of_every_shard(kv: KvHarness) -> None:
    tasks = kv.tasks()
    users = [f"u{n}" for n in range(40)]  # every shard of 16 has some
    for user in users:
        await tasks.send(fill_task(f"{user}-0", user), 0)
    batch = await tasks.receive_many(64, 0)
    assert sorted(d.task.user_id for d in batch) == sorted(users)
    assert {shard_of(d.task.user_id, DEFAULT_SHARDS) for d in batch} == set(range(DEFAULT_SHARDS))
    assert await tasks.receive_many(64, 0) == []


async def test_batches_deliver_everything_once_and_keep_each_groups_order(
    kv: KvHarness,
) -> None:
    tasks = kv.tasks()
    users = [f"u{n}" for n in range(40)]
    for n in range(3):
        for user in users:
            await tasks.send(fill_task(f"{user}-{n}", user), 0)
    seen: dict[str, list[str]] = {}
    receipts: set[str] = set()
    while batch := await tasks.receive_many(7, 0):
        assert len(batch) <= 7
        assert len({d.task.user_id for d in batch}) == len(batch)  # one per group
        for delivery in batch:
            assert delivery.receipt not in receipts
            receipts.add(delivery.receipt)
            seen.setdefault(delivery.task.user_id, []).append(delivery.task.order_id)
        await asyncio.gather(*(tasks.ack(d) for d in batch))
    assert seen == {user: [f"{user}-{n}" for n in range(3)] for user in users}
    assert await tasks.pending_count() == 0


async def test_a_batch_comes_in_delivery_order_within_a_shard(kv: KvHarness) -> None:
    tasks = kv.tasks()
    u1, u2, u3 = SAME_SHARD
    for order_id, user in [("a1", u1), ("b1", u2), ("a2", u1), ("c1", u3), ("b2", u2)]:
        await tasks.send(fill_task(order_id, user), 0)
    first = await tasks.receive_many(10, 0)
    assert [d.task.order_id for d in first] == ["a1", "b1", "c1"]
    await asyncio.gather(*(tasks.ack(d) for d in first))
    assert [d.task.order_id for d in await tasks.receive_many(10, 0)] == ["a2", "b2"]


async def test_concurrent_batches_deliver_nothing_twice(kv: KvHarness) -> None:
    tasks = kv.tasks()
    users = [f"u{n}" for n in range(20)]
    for user in users:
        for n in range(2):
            await tasks.send(fill_task(f"{user}-{n}", user), 0)
    batches = await asyncio.gather(*(tasks.receive_many(6, 0) for _ in range(6)))
    got = [d.task.order_id for batch in batches for d in batch]
    assert all(len(batch) <= 6 for batch in batches)
    assert sorted(got) == sorted(f"{user}-0" for user in users)


async def test_a_batch_is_settled_by_concurrent_acks_retries_and_dead_letters(
    kv: KvHarness,
) -> None:
    tasks = kv.tasks()
    for n in range(6):
        await tasks.send(fill_task(f"o{n}", f"u{n}"), 0)
    batch = sorted(await tasks.receive_many(10, 0), key=lambda d: d.task.order_id)
    assert len(batch) == 6
    await asyncio.gather(
        tasks.ack(batch[0]),
        tasks.ack(batch[1]),
        tasks.retry(batch[2], 0),
        tasks.retry(batch[3], 0),
        tasks.dead_letter(batch[4], "r4"),
        tasks.dead_letter(batch[5], "r5"),
    )
    again = await tasks.receive_many(10, 0)
    assert sorted(summary(again)) == [("o2", 2), ("o3", 2)]
    assert sorted(await tasks.dead_letters(), key=lambda letter: letter[1]) == [
        (fill_task("o4", "u4"), "r4"),
        (fill_task("o5", "u5"), "r5"),
    ]
    assert await tasks.pending_count() == 2


async def test_a_batch_waits_for_a_send_and_takes_what_came(kv: KvHarness) -> None:
    tasks = kv.tasks()
    waiter = asyncio.create_task(tasks.receive_many(10, NEVER_S))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await tasks.send(fill_task("o1"), 0)
    assert summary(await waiter) == [("o1", 1)]


async def test_a_batch_waits_for_a_settle_that_frees_a_group(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1"), 0)
    await tasks.send(fill_task("o2"), 0)
    (first,) = await tasks.receive_many(10, 0)
    assert await tasks.receive_many(10, SETTLE_S) == []  # (a receiver that has waited before)
    waiter = asyncio.create_task(tasks.receive_many(10, LONG_S))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await tasks.ack(first)
    assert summary(await asyncio.wait_for(waiter, NEVER_S)) == [("o2", 1)]


async def test_a_batch_takes_the_delayed_messages_once_they_are_due(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1", "u1"), SHORT_S)
    await tasks.send(fill_task("p1", "u2"), SHORT_S)
    await tasks.send(fill_task("q1", "u3"), 0)
    assert summary(await tasks.receive_many(10, 0)) == [("q1", 1)]
    assert await tasks.receive_many(10, 0) == []
    await kv.pass_time(SHORT_S)
    due = await tasks.receive_many(10, NEVER_S)
    assert sorted(summary(due)) == [("o1", 1), ("p1", 1)]


async def test_a_batch_left_unsettled_is_redelivered_after_the_visibility_timeout(
    kv: KvHarness,
) -> None:
    tasks = kv.tasks(visibility_timeout_s=SHORT_S)
    for n in range(3):
        await tasks.send(fill_task(f"o{n}", f"u{n}"), 0)
    first = await tasks.receive_many(10, 0)
    assert len(first) == 3
    assert await tasks.receive_many(10, 0) == []
    await kv.pass_time(SHORT_S)
    again = await tasks.receive_many(10, NEVER_S)
    assert sorted(summary(again)) == [("o0", 2), ("o1", 2), ("o2", 2)]
    for stale in first:  # the first receipts are stale now
        await tasks.ack(stale)
    assert await tasks.pending_count() == 3


async def test_a_batch_gives_up_after_its_timeout(kv: KvHarness) -> None:
    tasks = kv.tasks()
    assert await tasks.receive_many(10, 0.05) == []


async def test_a_batch_needs_a_limit_of_at_least_one(kv: KvHarness) -> None:
    tasks = kv.tasks()
    await tasks.send(fill_task("o1"), 0)
    with pytest.raises(ValueError, match="limit"):
        await tasks.receive_many(0, 0)
    assert summary(await tasks.receive_many(1, 0)) == [("o1", 1)]
