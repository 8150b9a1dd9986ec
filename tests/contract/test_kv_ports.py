"""Contract of the key-value ports, on the memory and the Redis adapters alike.

ReplayStore, RateLimiter, AlertThrottle, and the API <-> worker bus (OrderQueue with
WorkerDirectory). Waits that a correct adapter cuts short are given a generous timeout; the
test then checks what came back, never how long it took.
"""

from __future__ import annotations

import asyncio

import attrs
from redis_fixtures import SHORT_TTL_S, KvHarness, order_request, order_result

from tradecore.limits import RATE_LIMIT_PER_MINUTE, RATE_WINDOW_S
from tradecore.ports.messaging import OrderQueue, WorkerDirectory
from tradecore.ports.protection import AlertThrottle, RateLimiter, ReplayStore

NEVER_S = 5.0  # a wait a correct adapter cuts short
TTL_SLACK_S = 1.0  # a TTL read back may have run down a little (real clock)


def test_adapters_implement_the_ports(kv: KvHarness) -> None:
    assert isinstance(kv.replay, ReplayStore)
    assert isinstance(kv.limiter, RateLimiter)
    assert isinstance(kv.throttle, AlertThrottle)
    assert isinstance(kv.queue, OrderQueue)
    assert isinstance(kv.directory, WorkerDirectory)


def assert_ttl(left: float | None, expected: float) -> None:
    assert left is not None, "the key is absent"
    assert expected - TTL_SLACK_S < left <= expected


# --- Replay store ----------------------------------------------------------------------------


async def test_a_fingerprint_is_claimed_once(kv: KvHarness) -> None:
    assert await kv.replay.claim("u1", "fp1", 600)
    assert not await kv.replay.claim("u1", "fp1", 600)
    assert await kv.replay.claim("u1", "fp2", 600)


async def test_a_claim_lives_for_its_ttl(kv: KvHarness) -> None:
    await kv.replay.claim("u1", "fp1", 600)
    assert_ttl(await kv.ttl_s("replay", "u1:fp1"), 600)
    await kv.replay.claim("u1", "short", 0)  # below one second: one second
    assert_ttl(await kv.ttl_s("replay", "u1:short"), 1)
    await kv.lapse("replay", "u1:fp1")
    assert await kv.replay.claim("u1", "fp1", 600)


async def test_a_failed_claim_does_not_extend_the_ttl(kv: KvHarness) -> None:
    await kv.replay.claim("u1", "fp1", 100)
    assert not await kv.replay.claim("u1", "fp1", 900)
    assert_ttl(await kv.ttl_s("replay", "u1:fp1"), 100)


async def test_release_frees_the_fingerprint_and_is_idempotent(kv: KvHarness) -> None:
    await kv.replay.claim("u1", "fp1", 600)
    await kv.replay.release("u1", "fp1")
    await kv.replay.release("u1", "fp1")
    await kv.replay.release("u1", "never-claimed")
    assert await kv.ttl_s("replay", "u1:fp1") is None
    assert await kv.replay.claim("u1", "fp1", 600)


async def test_concurrent_claims_of_one_fingerprint_admit_exactly_one(kv: KvHarness) -> None:
    claims = await asyncio.gather(*(kv.replay.claim("u1", "fp1", 600) for _ in range(30)))
    assert sorted(claims) == [False] * 29 + [True]


# --- Rate limiter ----------------------------------------------------------------------------


async def test_concurrent_hits_on_an_empty_window_admit_exactly_the_limit(kv: KvHarness) -> None:
    limit = RATE_LIMIT_PER_MINUTE
    decisions = await asyncio.gather(
        *(kv.limiter.hit("u1", limit, RATE_WINDOW_S) for _ in range(2 * limit))
    )
    admitted = [d for d in decisions if d.allowed]
    refused = [d for d in decisions if not d.allowed]
    assert len(admitted) == limit
    assert sorted(d.remaining for d in admitted) == list(range(limit))
    assert all(d.retry_after_s is None for d in admitted)
    for decision in refused:
        assert decision.remaining == 0
        assert decision.retry_after_s is not None
        assert 0 < decision.retry_after_s <= RATE_WINDOW_S


async def test_remaining_counts_down_and_users_are_independent(kv: KvHarness) -> None:
    answers = [await kv.limiter.hit("u1", 3, 60) for _ in range(4)]
    assert [(a.allowed, a.remaining) for a in answers] == [
        (True, 2),
        (True, 1),
        (True, 0),
        (False, 0),
    ]
    other = await kv.limiter.hit("u2", 3, 60)
    assert (other.allowed, other.remaining) == (True, 2)


async def test_retry_after_is_the_time_until_the_oldest_hit_leaves(kv: KvHarness) -> None:
    assert (await kv.limiter.hit("u1", 1, 60)).allowed
    refused = await kv.limiter.hit("u1", 1, 60)
    assert not refused.allowed
    assert refused.retry_after_s is not None
    assert 60 - TTL_SLACK_S < refused.retry_after_s <= 60


async def test_a_zero_limit_refuses_with_the_whole_window(kv: KvHarness) -> None:
    refused = await kv.limiter.hit("u1", 0, 60)
    assert (refused.allowed, refused.remaining, refused.retry_after_s) == (False, 0, 60)


async def test_hits_leave_the_window_and_refused_hits_are_not_counted(kv: KvHarness) -> None:
    window = 0.2
    assert (await kv.limiter.hit("u1", 2, window)).allowed  # A
    await kv.pass_time(window / 2)
    assert (await kv.limiter.hit("u1", 2, window)).allowed  # B
    refused = await kv.limiter.hit("u1", 2, window)  # C, not recorded
    assert not refused.allowed
    assert refused.retry_after_s is not None
    assert 0 < refused.retry_after_s <= window
    await kv.pass_time(window / 2)
    # A left the window; B is still in it. Had C been counted, D would be refused.
    assert (await kv.limiter.hit("u1", 2, window)).allowed  # D


# --- Alert throttle --------------------------------------------------------------------------


async def test_one_alert_slot_per_user_per_period(kv: KvHarness) -> None:
    assert await kv.throttle.try_claim("u1", 3600)
    assert not await kv.throttle.try_claim("u1", 3600)
    assert await kv.throttle.try_claim("u2", 3600)
    assert_ttl(await kv.ttl_s("throttle", "u1"), 3600)
    await kv.lapse("throttle", "u1")
    assert await kv.throttle.try_claim("u1", 3600)


async def test_a_released_slot_can_be_claimed_again(kv: KvHarness) -> None:
    assert await kv.throttle.try_claim("u1", 3600)
    await kv.throttle.release("u1")
    await kv.throttle.release("u1")
    assert await kv.throttle.try_claim("u1", 3600)


async def test_a_zero_period_never_blocks(kv: KvHarness) -> None:
    assert await kv.throttle.try_claim("u1", 0)
    assert await kv.throttle.try_claim("u1", 0)


async def test_concurrent_claims_of_one_slot_give_exactly_one(kv: KvHarness) -> None:
    claims = await asyncio.gather(*(kv.throttle.try_claim("u1", 3600) for _ in range(50)))
    assert claims.count(True) == 1


# --- Order queue and worker directory --------------------------------------------------------


async def hold(kv: KvHarness, user_id: str = "u1", holder: str = "h1", ttl_s: float = 30) -> int:
    """Take the user's lease for ``holder`` and return its fencing token."""
    token = await kv.directory.acquire(user_id, holder, ttl_s)
    assert token is not None, f"{holder} could not take the lease of {user_id}"
    return token


async def test_push_needs_the_active_mark(kv: KvHarness) -> None:
    assert not await kv.queue.push(order_request("r1"))
    assert await kv.queue.take("u1", 0) is None
    await hold(kv, "u1")
    assert await kv.queue.push(order_request("r1"))
    assert await kv.queue.take("u1", 0) == order_request("r1")


async def test_a_parked_request_waits_for_a_worker_and_is_an_orphan_until_one_comes(
    kv: KvHarness,
) -> None:
    await kv.queue.park(order_request("r1"))  # no lease: no worker runs for u1
    assert await kv.directory.orphaned_users() == ["u1"]
    await hold(kv, "u1")
    assert await kv.directory.orphaned_users() == []
    assert await kv.queue.take("u1", 0) == order_request("r1")


async def test_requests_are_taken_in_push_order_per_user(kv: KvHarness) -> None:
    await hold(kv, "u1")
    await hold(kv, "u2")
    pushed = [
        order_request("a1"),
        order_request("b1", "u2"),
        order_request("a2"),
        order_request("b2", "u2"),
    ]
    for request in pushed:
        assert await kv.queue.push(request)

    async def ids(user_id: str) -> list[str]:
        taken = [await kv.queue.take(user_id, 0) for _ in range(3)]
        return [t.request_id if t else "-" for t in taken]

    assert await ids("u2") == ["b1", "b2", "-"]
    assert await ids("u1") == ["a1", "a2", "-"]


async def test_take_waits_for_a_push(kv: KvHarness) -> None:
    await hold(kv, "u1")
    taker = asyncio.create_task(kv.queue.take("u1", NEVER_S))
    await asyncio.sleep(0.01)
    assert not taker.done()
    assert await kv.queue.push(order_request("r1"))
    assert await taker == order_request("r1")


async def test_many_waiting_takes_each_get_their_users_request(kv: KvHarness) -> None:
    users = [f"u{i}" for i in range(20)]
    for user in users:
        await hold(kv, user)
    takers = [asyncio.create_task(kv.queue.take(user, NEVER_S)) for user in users]
    await asyncio.sleep(0.01)
    for user in reversed(users):
        assert await kv.queue.push(order_request(f"r-{user}", user))
    taken = await asyncio.gather(*takers)
    assert taken == [order_request(f"r-{user}", user) for user in users]


async def test_take_gives_up_after_its_timeout(kv: KvHarness) -> None:
    await hold(kv, "u1")
    assert await kv.queue.take("u1", 0.05) is None
    assert await kv.queue.take("u1", 0) is None


async def test_a_crashed_workers_requests_stay_in_flight_oldest_first(kv: KvHarness) -> None:
    await hold(kv, "u1")
    for rid in ("r1", "r2", "r3"):
        await kv.queue.push(order_request(rid))
    first = await kv.queue.take("u1", 0)
    second = await kv.queue.take("u1", 0)
    assert first is not None and second is not None
    # The worker dies here: nothing completes. A new worker finds both, oldest first.
    assert await kv.queue.in_flight("u1") == [order_request("r1"), order_request("r2")]
    assert await kv.queue.in_flight("u2") == []

    await kv.queue.complete(first, order_result(first))
    assert await kv.queue.in_flight("u1") == [order_request("r2")]
    await kv.queue.complete(second, order_result(second))
    assert await kv.queue.in_flight("u1") == []
    assert await kv.queue.take("u1", 0) == order_request("r3")


async def test_a_request_pushed_to_an_idle_worker_is_handed_over_and_taken_first(
    kv: KvHarness,
) -> None:
    """Pushed while nothing waits and nothing is in flight, r1 is handed over: it waits for
    every view but the take's (no crashed worker's request to recover, no retiring)."""
    token = await hold(kv, "u1")
    assert await kv.queue.push(order_request("r1"))
    assert await kv.queue.push(order_request("r2"))  # r1 in the worker's hands: r2 waits
    assert await kv.queue.in_flight("u1") == []
    assert not await kv.directory.retire("u1", token)
    assert await kv.queue.take("u1", 0) == order_request("r1")
    assert await kv.queue.in_flight("u1") == [order_request("r1")]
    assert await kv.queue.take("u1", 0) == order_request("r2")
    assert await kv.queue.take("u1", 0) is None
    assert await kv.queue.in_flight("u1") == [order_request("r1"), order_request("r2")]


async def test_users_whose_host_died_are_found_orphaned(kv: KvHarness) -> None:
    token = await hold(kv, "u1")
    await kv.queue.push(order_request("r1", user_id="u1"))
    await kv.queue.push(order_request("r2", user_id="u1"))
    assert await kv.queue.take("u1", 0) is not None  # r1 in flight, r2 waiting
    other = await hold(kv, "u2")
    await kv.queue.push(order_request("r3", user_id="u2"))
    assert await kv.directory.orphaned_users() == []  # both leases held

    await kv.directory.release("u1", token)  # as when u1's host died and its lease lapsed

    assert await kv.directory.orphaned_users() == ["u1"]
    await kv.directory.release("u2", other)
    assert sorted(await kv.directory.orphaned_users()) == ["u1", "u2"]
    assert len(await kv.directory.orphaned_users(limit=1)) == 1


async def test_a_hosts_record_lapses_once_unless_renewed_or_removed(kv: KvHarness) -> None:
    await kv.directory.host_alive("h-dead", SHORT_TTL_S)
    await kv.directory.host_alive("h-renewed", SHORT_TTL_S)
    await kv.directory.host_alive("h-renewed", 30)
    await kv.directory.host_alive("h-stopped", SHORT_TTL_S)
    await kv.directory.host_gone("h-stopped")
    await kv.directory.host_gone("h-stopped")  # idempotent
    await kv.directory.host_gone("h-never-seen")
    assert await kv.directory.lapsed_hosts() == []  # nothing ran out yet

    await kv.pass_time(4 * SHORT_TTL_S)

    assert await kv.directory.lapsed_hosts() == ["h-dead"]
    assert await kv.directory.lapsed_hosts() == []  # returned once, then forgotten
    await kv.directory.host_alive("h-dead", 30)  # a host that comes back records itself again
    assert await kv.directory.lapsed_hosts() == []


async def test_concurrent_looks_give_a_lapsed_host_to_one_caller(kv: KvHarness) -> None:
    for holder in ("h1", "h2", "h3"):
        await kv.directory.host_alive(holder, SHORT_TTL_S)
    await kv.pass_time(4 * SHORT_TTL_S)

    looks = await asyncio.gather(*(kv.directory.lapsed_hosts() for _ in range(8)))

    assert sorted(h for look in looks for h in look) == ["h1", "h2", "h3"]


async def test_a_reply_that_came_before_the_wait_is_returned_once(kv: KvHarness) -> None:
    await hold(kv, "u1")
    await kv.queue.push(order_request("r1"))
    taken = await kv.queue.take("u1", 0)
    assert taken is not None
    await kv.queue.complete(taken, order_result(taken))
    assert await kv.queue.wait_result("r1", 0) == order_result(taken)
    assert await kv.queue.wait_result("r1", 0) is None


async def test_a_second_completion_replaces_the_reply(kv: KvHarness) -> None:
    request = order_request("r1")
    await kv.queue.park(request)  # the waiter is the process that handed the request over
    first = order_result(request)
    second = attrs.evolve(first, broker_refs=("b-2",))
    await kv.queue.complete(request, first)
    await kv.queue.complete(request, second)
    assert await kv.queue.wait_result("r1", 0) == second
    assert await kv.queue.wait_result("r1", 0) is None


async def test_wait_result_wakes_on_the_reply(kv: KvHarness) -> None:
    await hold(kv, "u1")
    await kv.queue.push(order_request("r1"))
    waiter = asyncio.create_task(kv.queue.wait_result("r1", NEVER_S))
    await asyncio.sleep(0.01)
    taken = await kv.queue.take("u1", 0)
    assert taken is not None
    await kv.queue.complete(taken, order_result(taken))
    assert await waiter == order_result(taken)


async def test_wait_result_returns_none_after_its_timeout(kv: KvHarness) -> None:
    assert await kv.queue.wait_result("nobody", 0.05) is None
    assert await kv.queue.wait_result("nobody", 0) is None


async def test_an_uncollected_reply_expires(kv: KvHarness) -> None:
    request = order_request("r1")
    await kv.queue.park(request)
    await kv.queue.complete(request, order_result(request))
    assert_ttl(await kv.ttl_s("reply", "r1"), 60)
    await kv.lapse("reply", "r1")
    assert await kv.queue.wait_result("r1", 0) is None


async def test_the_lease_is_the_active_mark_and_lives_for_its_ttl(kv: KvHarness) -> None:
    assert not await kv.directory.is_active("u1")
    await hold(kv, "u1", "h1", 30)
    assert await kv.directory.is_active("u1")
    assert not await kv.directory.is_active("u2")
    assert_ttl(await kv.ttl_s("mark", "u1"), 30)
    await kv.lapse("mark", "u1")
    assert not await kv.directory.is_active("u1")
    assert not await kv.queue.push(order_request("r1"))


async def test_a_held_lease_is_refused_to_another_holder(kv: KvHarness) -> None:
    token = await hold(kv, "u1", "h1", 30)
    assert await kv.directory.acquire("u1", "h2", 90) is None
    assert_ttl(await kv.ttl_s("mark", "u1"), 30)  # the refusal changed nothing
    assert await kv.directory.renew("u1", token, 30)  # h1 still holds it
    assert await hold(kv, "u2", "h2") >= 1  # other users are independent


async def test_concurrent_acquires_of_one_user_grant_exactly_one_lease(kv: KvHarness) -> None:
    tokens = await asyncio.gather(*(kv.directory.acquire("u1", f"h{i}", 30) for i in range(20)))
    granted = [t for t in tokens if t is not None]
    assert len(granted) == 1
    assert await kv.directory.renew("u1", granted[0], 30)


async def test_the_same_holder_re_acquires_its_lease_with_the_same_token(kv: KvHarness) -> None:
    token = await hold(kv, "u1", "h1", 30)
    assert await kv.directory.acquire("u1", "h1", 90) == token
    assert_ttl(await kv.ttl_s("mark", "u1"), 90)  # refreshed
    assert await kv.directory.renew("u1", token, 30)


async def test_holder_names_may_contain_colons_and_digits(kv: KvHarness) -> None:
    holder = "host-7:4242:9"  # hostname:pid:random
    token = await hold(kv, "u1", holder)
    assert await kv.directory.acquire("u1", holder, 30) == token
    assert await kv.directory.acquire("u1", "host-7:4242", 30) is None
    assert await kv.directory.acquire("u1", "9", 30) is None
    assert not await kv.directory.renew("u1", 9, 30)  # a digit of the name is no token
    assert not await kv.directory.renew("u1", 4242, 30)
    assert await kv.directory.renew("u1", token, 30)


async def test_fencing_tokens_strictly_increase_across_releases_and_expiry(
    kv: KvHarness,
) -> None:
    tokens = [await hold(kv, "u1", "h1")]
    await kv.directory.release("u1", tokens[-1])
    tokens.append(await hold(kv, "u1", "h2", SHORT_TTL_S))
    await kv.outlive("mark", "u1")
    tokens.append(await hold(kv, "u1", "h1"))  # the same holder again: still a new lease
    await kv.lapse("mark", "u1")
    tokens.append(await hold(kv, "u1", "h3"))
    await kv.directory.release("u1", tokens[-1])
    tokens.append(await hold(kv, "u1", "h1"))
    assert tokens == sorted(set(tokens)), f"tokens {tokens} are not strictly increasing"


async def test_renew_extends_only_the_lease_that_carries_the_token(kv: KvHarness) -> None:
    token = await hold(kv, "u1", "h1", 30)
    assert await kv.directory.renew("u1", token, 90)
    assert_ttl(await kv.ttl_s("mark", "u1"), 90)
    assert not await kv.directory.renew("u1", token + 1, 300)
    assert not await kv.directory.renew("u2", token, 300)
    assert_ttl(await kv.ttl_s("mark", "u1"), 90)
    assert not await kv.directory.is_active("u2")


async def test_renew_is_false_after_expiry_and_revives_nothing(kv: KvHarness) -> None:
    token = await hold(kv, "u1", "h1", SHORT_TTL_S)
    await kv.outlive("mark", "u1")
    assert not await kv.directory.renew("u1", token, 30)
    assert not await kv.directory.is_active("u1")
    assert not await kv.queue.push(order_request("r1"))


async def test_renew_is_false_after_a_takeover_and_leaves_the_new_lease_alone(
    kv: KvHarness,
) -> None:
    stale = await hold(kv, "u1", "h1", SHORT_TTL_S)
    await kv.outlive("mark", "u1")
    fresh = await hold(kv, "u1", "h2", 30)
    assert fresh > stale
    assert not await kv.directory.renew("u1", stale, 300)
    assert_ttl(await kv.ttl_s("mark", "u1"), 30)
    assert await kv.directory.acquire("u1", "h1", 30) is None  # h2 holds it now
    assert await kv.directory.renew("u1", fresh, 30)


async def test_renew_many_renews_each_lease_that_carries_its_token(kv: KvHarness) -> None:
    mine = await hold(kv, "u1", "h1", 30)
    expired = await hold(kv, "u2", "h1", SHORT_TTL_S)
    taken = await hold(kv, "u3", "h1", SHORT_TTL_S)
    also_mine = await hold(kv, "u5", "h1", 30)
    await kv.outlive("mark", "u2")
    await kv.outlive("mark", "u3")
    successor = await hold(kv, "u3", "h2", 30)

    lost = await kv.directory.renew_many(
        {"u1": mine, "u2": expired, "u3": taken, "u4": 7, "u5": also_mine + 1}, 90
    )

    assert lost == {"u2", "u3", "u4", "u5"}
    assert_ttl(await kv.ttl_s("mark", "u1"), 90)
    assert not await kv.directory.is_active("u2")  # an expired lease is not revived
    assert_ttl(await kv.ttl_s("mark", "u3"), 30)  # the successor's lease is left alone
    assert await kv.directory.renew("u3", successor, 30)
    assert_ttl(await kv.ttl_s("mark", "u5"), 30)  # a wrong token renews nothing
    assert await kv.directory.renew_many({}, 30) == set()


async def test_renew_many_covers_more_leases_than_one_batch(kv: KvHarness) -> None:
    tokens = {f"user-{n}": await hold(kv, f"user-{n}", "h1", 30) for n in range(450)}
    tokens["user-7"] += 1
    lost = await kv.directory.renew_many(tokens, 90)
    assert lost == {"user-7"}
    assert_ttl(await kv.ttl_s("mark", "user-449"), 90)


async def test_release_removes_only_the_lease_that_carries_the_token(kv: KvHarness) -> None:
    stale = await hold(kv, "u1", "h1")
    await kv.lapse("mark", "u1")
    fresh = await hold(kv, "u1", "h2")
    await kv.directory.release("u1", stale)
    await kv.directory.release("u2", fresh)
    assert await kv.directory.is_active("u1")
    assert await kv.directory.renew("u1", fresh, 30)
    await kv.directory.release("u1", fresh)
    assert not await kv.directory.is_active("u1")
    await kv.directory.release("u1", fresh)  # idempotent
    assert not await kv.directory.is_active("u1")
    assert await hold(kv, "u1", "h1") > fresh


async def test_start_requests_are_fifo_and_deduplicated_while_pending(kv: KvHarness) -> None:
    await kv.directory.request_start("u1")
    await kv.directory.request_start("u2")
    await kv.directory.request_start("u1")
    assert await kv.directory.next_start_request(0) == "u1"
    await kv.directory.request_start("u1")  # no longer pending: a new request
    assert await kv.directory.next_start_request(0) == "u2"
    assert await kv.directory.next_start_request(NEVER_S) == "u1"
    assert await kv.directory.next_start_request(0.05) is None


async def test_next_start_request_wakes_on_a_request(kv: KvHarness) -> None:
    waiter = asyncio.create_task(kv.directory.next_start_request(NEVER_S))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await kv.directory.request_start("u1")
    assert await waiter == "u1"
    await kv.directory.request_start("u1")  # the pending entry was cleared with the pop
    assert await kv.directory.next_start_request(0) == "u1"


async def test_concurrent_start_requests_of_one_user_queue_one(kv: KvHarness) -> None:
    await asyncio.gather(*(kv.directory.request_start("u1") for _ in range(20)))
    assert await kv.directory.next_start_request(0) == "u1"
    assert await kv.directory.next_start_request(0) is None


async def test_wait_active_wakes_on_the_mark(kv: KvHarness) -> None:
    waiters = [asyncio.create_task(kv.directory.wait_active("u1", NEVER_S)) for _ in range(2)]
    await asyncio.sleep(0.01)
    assert not any(w.done() for w in waiters)
    await hold(kv, "u1")
    assert await asyncio.gather(*waiters) == [True, True]


async def test_wait_active_is_immediate_when_marked_and_false_after_timeout(
    kv: KvHarness,
) -> None:
    assert not await kv.directory.wait_active("u1", 0.05)
    await hold(kv, "u2")
    assert not await kv.directory.wait_active("u1", 0)
    assert await kv.directory.wait_active("u2", 0)


async def test_retire_keeps_the_mark_while_a_request_waits(kv: KvHarness) -> None:
    token = await hold(kv, "u1")
    await kv.queue.push(order_request("r1"))
    assert not await kv.directory.retire("u1", token)
    assert await kv.directory.is_active("u1")
    assert await kv.directory.renew("u1", token, 30)  # the refusal kept the lease as it was
    assert await kv.queue.take("u1", 0) is not None  # in flight now, not waiting
    assert await kv.directory.retire("u1", token)
    assert not await kv.directory.is_active("u1")
    assert not await kv.queue.push(order_request("r2"))
    assert not await kv.directory.retire("u1", token)  # nothing left to retire


async def test_retire_needs_the_leases_token(kv: KvHarness) -> None:
    stale = await hold(kv, "u1", "h1")
    await kv.lapse("mark", "u1")
    fresh = await hold(kv, "u1", "h2")
    assert not await kv.directory.retire("u1", stale)
    assert not await kv.directory.retire("u1", fresh + 1)
    assert not await kv.directory.retire("u2", fresh)
    assert await kv.directory.is_active("u1")
    assert await kv.directory.renew("u1", fresh, 30)
    assert await kv.directory.retire("u1", fresh)
    assert not await kv.directory.is_active("u1")


async def test_no_push_is_stranded_by_a_concurrent_retire(kv: KvHarness) -> None:
    token = await hold(kv, "u1")
    requests = [order_request(f"r{i}") for i in range(30)]
    outcomes = await asyncio.gather(
        *(kv.queue.push(r) for r in requests[:15]),
        kv.directory.retire("u1", token),
        *(kv.queue.push(r) for r in requests[15:]),
    )
    pushed = [r for r, ok in zip(requests, outcomes[:15] + outcomes[16:], strict=True) if ok]
    retired = outcomes[15]
    taken = []
    while (request := await kv.queue.take("u1", 0)) is not None:
        taken.append(request)
    # Concurrent pushes have no defined order among themselves; none is lost or left behind.
    assert sorted(r.request_id for r in taken) == sorted(r.request_id for r in pushed)
    assert await kv.queue.take("u1", 0) is None
    # A retire that succeeded saw an empty list, and nothing was pushed after it.
    if retired:
        assert pushed == []
    else:
        assert await kv.directory.is_active("u1")
