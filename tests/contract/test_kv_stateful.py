"""The memory and the Redis adapters side by side: same operations, same answers.

Hypothesis state machines drive the order queue with the worker directory, the replay store, the
daily order counter and the webhook admission (and, separately, the order-tasks queue) through
random sequences of calls on both technologies at once. They compare every answer and, after
every step, the marks, in-flight lists and replay keys (or the dead letters) of every user. Time
does not pass for the adapters (no call waits, every TTL outlives a run), so both sides see the
same world.

The leases are also checked against a model: who holds each user's lease with which token, the
last token handed out per user, and how many requests wait. Agreement between two adapters alone
would not catch a rule both get wrong.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import ClassVar, TypeVar

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)
from redis_fixtures import (
    KvHarness,
    MemoryHarness,
    RedisHarness,
    fill_task,
    order_request,
    order_result,
)

from tradecore.limits import daily_count_expiry, utc_day
from tradecore.ports.messaging import FillDelivery, FillTaskQueue
from tradecore.ports.protection import DailyCount, DailyQuota
from tradecore_adapters.redis import open_connections

T = TypeVar("T")

USER_IDS = ("u1", "u28")
"""Users of one shard of the Redis queues (16 shards), which keep the order across users
within a shard only (as SQS FIFO keeps none across message groups)."""
HOLDER_IDS = ("h1", "h2:7", "h3")
FINGERPRINT_IDS = ("fp1", "fp2", "fp3")
USERS = st.sampled_from(USER_IDS)
HOLDERS = st.sampled_from(HOLDER_IDS)
FINGERPRINTS = st.sampled_from(FINGERPRINT_IDS)
PICK = st.integers(min_value=0, max_value=7)
DELAYS = st.sampled_from([0.0, 3600.0])
TODAY = utc_day(datetime.now(UTC))  # its counters expire ahead of the real (server's) clock
DAY_QUOTA = DailyQuota(day=TODAY, cap=None, expires_at=daily_count_expiry(TODAY))


async def _coroutine(step: Awaitable[T]) -> T:
    return await step


class SideBySide(RuleBasedStateMachine):
    """Every rule runs on both harnesses and asserts equal answers."""

    url: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.connections = open_connections(self.url)
        self.run(self.connections.commands.flushdb())
        self.memory = MemoryHarness()
        self.redis = RedisHarness(self.connections)
        self.pushed = 0
        self.completed: list[str] = []
        # The model of the leases and request lists.
        self.leases: dict[str, tuple[str, int]] = {}
        self.fences: dict[str, int] = {}
        # requests pushed that no take returned yet, a handed-over one included
        self.waiting: dict[str, int] = dict.fromkeys(USER_IDS, 0)
        self.in_flight: dict[str, list[str]] = {user: [] for user in USER_IDS}
        self.handed: dict[str, str] = {}  # user -> the request handed over, not yet taken
        self.daily: dict[str, int] = {}  # the model of the day's counters

    def run(self, step: Awaitable[T]) -> T:
        return self.loop.run_until_complete(_coroutine(step))

    def both(self, op: Callable[[KvHarness], Awaitable[T]]) -> T:
        async def call(harness: KvHarness) -> T:
            return await op(harness)

        expected = self.run(call(self.memory))
        actual = self.run(call(self.redis))
        assert actual == expected, f"redis answered {actual!r}, memory {expected!r}"
        return expected

    def teardown(self) -> None:
        try:
            self.run(self.redis.aclose())
            self.run(self.connections.aclose())
        finally:
            self.loop.close()

    @invariant()
    def same_view(self) -> None:
        """After every step both sides show the same marks, in-flight lists and replay keys."""

        async def view(harness: KvHarness) -> list[object]:
            seen: list[object] = []
            for user in USER_IDS:
                seen.append(await harness.directory.is_active(user))
                seen.append(await harness.directory.wait_active(user, 0))
                seen.append(await harness.queue.in_flight(user))
            for fingerprint in FINGERPRINT_IDS:
                seen.append(await harness.ttl_s("replay", f"u1:{fingerprint}") is not None)
            return seen

        seen = self.both(view)
        marked = [seen[3 * i] for i in range(len(USER_IDS))]
        assert marked == [user in self.leases for user in USER_IDS]
        in_flight = [[r.request_id for r in seen[3 * i + 2]] for i in range(len(USER_IDS))]
        assert in_flight == [self.in_flight[user] for user in USER_IDS]

    def token_for(self, user: str, pick: int) -> int:
        """One of the tokens ever handed out for ``user``, or one never handed out."""
        issued = self.fences.get(user, 0)
        return pick % (issued + 2)  # 0 and issued + 1 were never handed out

    # --- worker directory ---

    @rule(user=USERS, holder=HOLDERS)
    def acquire(self, user: str, holder: str) -> None:
        token = self.both(lambda h: h.directory.acquire(user, holder, 60))
        lease = self.leases.get(user)
        if lease is None:
            issued = self.fences.get(user, 0) + 1
            self.fences[user] = issued
            self.leases[user] = (holder, issued)
            assert token == issued
        else:
            assert token == (lease[1] if lease[0] == holder else None)

    @rule(user=USERS, pick=PICK)
    def renew(self, user: str, pick: int) -> None:
        token = self.token_for(user, pick)
        renewed = self.both(lambda h: h.directory.renew(user, token, 60))
        lease = self.leases.get(user)
        assert renewed == (lease is not None and lease[1] == token)

    @rule(user=USERS, pick=PICK)
    def release(self, user: str, pick: int) -> None:
        token = self.token_for(user, pick)
        self.both(lambda h: h.directory.release(user, token))
        lease = self.leases.get(user)
        if lease is not None and lease[1] == token:
            del self.leases[user]

    @rule(user=USERS, pick=PICK)
    def retire(self, user: str, pick: int) -> None:
        token = self.token_for(user, pick)
        retired = self.both(lambda h: h.directory.retire(user, token))
        lease = self.leases.get(user)
        expected = lease is not None and lease[1] == token and self.waiting[user] == 0
        assert retired == expected
        if expected:
            del self.leases[user]

    @rule(user=USERS)
    def request_start(self, user: str) -> None:
        self.both(lambda h: h.directory.request_start(user))

    @rule()
    def next_start_request(self) -> None:
        self.both(lambda h: h.directory.next_start_request(0))

    # --- order queue ---

    @rule(user=USERS)
    def push(self, user: str) -> None:
        self.pushed += 1
        request = order_request(f"r{self.pushed}", user)
        pushed = self.both(lambda h: h.queue.push(request))
        assert pushed == (user in self.leases)
        if pushed and self.waiting[user] == 0 and not self.in_flight[user]:
            # the worker is idle: handed over (waiting still, for every view but the take's)
            self.handed[user] = request.request_id
        self.waiting[user] += pushed

    @rule(user=USERS, holder=HOLDERS, count=st.integers(min_value=1, max_value=3))
    def activate_and_push(self, user: str, holder: str, count: int) -> None:
        self.acquire(user, holder)
        for _ in range(count):
            self.push(user)

    @rule(user=USERS)
    def take(self, user: str) -> None:
        taken = self.both(lambda h: h.queue.take(user, 0))
        assert (taken is not None) == (self.waiting[user] > 0)
        if taken is None:
            return
        self.waiting[user] -= 1
        handed = self.handed.pop(user, None)
        if handed is not None:
            assert taken.request_id == handed  # the handed-over request comes first
        self.in_flight[user].append(taken.request_id)

    @rule(user=USERS, pick=PICK)
    def complete(self, user: str, pick: int) -> None:
        taken = self.both(lambda h: h.queue.in_flight(user))
        if not taken:
            return
        request = taken[pick % len(taken)]
        self.both(lambda h: h.queue.complete(request, order_result(request)))
        self.completed.append(request.request_id)
        self.in_flight[user].remove(request.request_id)

    @rule(pick=PICK)
    def collect(self, pick: int) -> None:
        if not self.completed:
            return
        request_id = self.completed[pick % len(self.completed)]
        self.both(lambda h: h.queue.wait_result(request_id, 0))

    # --- replay store ---

    @rule(fingerprint=FINGERPRINTS, ttl=st.sampled_from([60, 300, 86_400]))
    def claim(self, fingerprint: str, ttl: int) -> None:
        self.both(lambda h: h.replay.claim("u1", fingerprint, ttl))

    @rule(fingerprint=FINGERPRINTS)
    def release_fingerprint(self, fingerprint: str) -> None:
        self.both(lambda h: h.replay.release("u1", fingerprint))

    # --- daily order counter (checked against the model ``daily``) ---

    @rule(user=USERS, count=st.integers(min_value=0, max_value=4))
    def seed_daily(self, user: str, count: int) -> None:
        stored = self.both(lambda h: h.daily.seed(user, DAY_QUOTA, count))
        assert stored == (user not in self.daily)
        self.daily.setdefault(user, count)

    @rule(user=USERS, cap=st.sampled_from([None, 0, 2, 4]))
    def take_daily(self, user: str, cap: int | None) -> None:
        quota = attrs.evolve(DAY_QUOTA, cap=cap)
        answer = self.both(lambda h: h.daily.take(user, quota))
        count = self.daily.get(user)
        if count is None:
            assert answer is DailyCount.UNSEEDED
        elif cap is not None and count >= cap:
            assert answer is DailyCount.CAP_REACHED
        else:
            assert answer is DailyCount.COUNTED
            self.daily[user] = count + 1

    @rule(user=USERS, fingerprint=FINGERPRINTS, cap=st.sampled_from([None, 1, 3]))
    def admit_with_quota(self, user: str, fingerprint: str, cap: int | None) -> None:
        quota = attrs.evolve(DAY_QUOTA, cap=cap)
        answer = self.both(
            lambda h: h.admission.admit(f"{user}-{fingerprint}", 600, user, 1000, 3600, quota)
        )
        if answer.daily is DailyCount.COUNTED:
            self.daily[user] += 1
        assert (answer.daily is DailyCount.UNSEEDED) == (answer.fresh and user not in self.daily)

    @rule(user=USERS)
    def release_daily(self, user: str) -> None:
        self.both(lambda h: h.daily.release(user, DAY_QUOTA.day))
        if self.daily.get(user):
            self.daily[user] -= 1


class FifoSideBySide(RuleBasedStateMachine):
    """The order-tasks queue on both technologies. Delays are 0 or an hour, so nothing
    becomes visible or times out by the clock during a run, and no deduplication window
    (5 min) ends: the model is that every order's first send makes its one message, so no
    order is ever delivered with a ``receive_count`` of 1 twice."""

    url: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.connections = open_connections(self.url)
        self.loop.run_until_complete(self.connections.commands.flushdb())
        self.memory = MemoryHarness().tasks()
        self.redis = RedisHarness(self.connections).tasks()
        self.sent = 0
        self.deliveries: list[tuple[FillDelivery, FillDelivery]] = []  # (memory, redis)
        self.first_deliveries: set[str] = set()  # order ids delivered with receive_count 1

    def both(self, op: Callable[[FillTaskQueue], Awaitable[T]]) -> T:
        async def call(queue: FillTaskQueue) -> T:
            return await op(queue)

        expected = self.loop.run_until_complete(call(self.memory))
        actual = self.loop.run_until_complete(call(self.redis))
        assert actual == expected, f"redis answered {actual!r}, memory {expected!r}"
        return expected

    def teardown(self) -> None:
        try:
            self.loop.run_until_complete(self.connections.aclose())
        finally:
            self.loop.close()

    @invariant()
    def same_dead_letters(self) -> None:
        self.both(lambda q: q.dead_letters())

    @rule(user=USERS, delay=DELAYS)
    def send(self, user: str, delay: float) -> None:
        self.sent += 1
        task = fill_task(f"o{self.sent}", user)
        self.both(lambda q: q.send(task, delay))

    @rule(user=USERS, pick=PICK, delay=DELAYS)
    def send_again(self, user: str, pick: int, delay: float) -> None:
        """A repeated send of an order already sent: deduplicated, whatever its group."""
        if self.sent:
            task = fill_task(f"o{pick % self.sent + 1}", user)
            self.both(lambda q: q.send(task, delay))

    @rule()
    def receive(self) -> None:
        """Receipts are opaque and differ between the adapters; the rest must not."""
        expected = self.loop.run_until_complete(self.memory.receive(0))
        actual = self.loop.run_until_complete(self.redis.receive(0))
        bare = [None if d is None else (d.task, d.receive_count) for d in (actual, expected)]
        assert bare[0] == bare[1], f"redis answered {actual!r}, memory {expected!r}"
        if expected is not None and actual is not None:
            self.deliveries.append((expected, actual))
            if expected.receive_count == 1:
                assert expected.task.order_id not in self.first_deliveries, "sent twice"
                self.first_deliveries.add(expected.task.order_id)

    def each(self, pick: int, op: Callable[[FillTaskQueue, FillDelivery], Awaitable[T]]) -> None:
        """``op`` on each side with that side's own delivery number ``pick``."""
        if self.deliveries:
            memory, redis = self.deliveries[pick % len(self.deliveries)]
            expected = self.loop.run_until_complete(_coroutine(op(self.memory, memory)))
            actual = self.loop.run_until_complete(_coroutine(op(self.redis, redis)))
            assert actual == expected, f"redis answered {actual!r}, memory {expected!r}"

    @rule(pick=PICK)
    def ack(self, pick: int) -> None:
        self.each(pick, lambda q, d: q.ack(d))

    @rule(pick=PICK, delay=DELAYS)
    def retry(self, pick: int, delay: float) -> None:
        self.each(pick, lambda q, d: q.retry(d, delay))

    @rule(pick=PICK, reason=st.sampled_from(["pending", 'a "quoted" / reason']))
    def dead_letter(self, pick: int, reason: str) -> None:
        self.each(pick, lambda q, d: q.dead_letter(d, reason))


STATEFUL = settings(settings.get_profile("ci"), stateful_step_count=40)


@pytest.mark.redis
def test_memory_and_redis_give_the_same_answers(redis_url: str) -> None:
    SideBySide.url = redis_url
    run_state_machine_as_test(SideBySide, settings=STATEFUL)


@pytest.mark.redis
def test_memory_and_redis_fifo_queues_give_the_same_answers(redis_url: str) -> None:
    FifoSideBySide.url = redis_url
    run_state_machine_as_test(FifoSideBySide, settings=STATEFUL)
