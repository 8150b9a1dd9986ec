"""Contract of WebhookAdmission (the webhook's replay claim, rate-limit hit and daily count as
one step) and of DailyOrderCounter, on the memory and the Redis adapters alike, and what only
the Redis ones have: their key layout (one hash-tag slot per user), one command per call, and
no fail open."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from redis import exceptions as rx
from redis.asyncio import Redis
from redis_fixtures import KvHarness, MemoryHarness, RedisHarness

from tradecore.errors import KeyValueStoreUnavailable
from tradecore.limits import (
    RATE_KEY_TTL_S,
    RATE_LIMIT_PER_MINUTE,
    RATE_WINDOW_S,
    daily_count_expiry,
    utc_day,
)
from tradecore.orders import AlertAction, OrderHistoryRecord, OrderStatus, OrderType, Source
from tradecore.ports.protection import (
    Admission,
    DailyCount,
    DailyOrderCounter,
    DailyQuota,
    WebhookAdmission,
)
from tradecore.services.orders.daily_orders import DailyOrders
from tradecore_adapters.memory.repositories import MemoryOrderHistory
from tradecore_adapters.redis import RedisRateLimiter, RedisReplayStore, open_connections
from tradecore_adapters.redis.batching import shared_batcher
from tradecore_adapters.redis.protection import RedisDailyOrderCounter, RedisWebhookAdmission

LIMIT = RATE_LIMIT_PER_MINUTE
WINDOW = RATE_WINDOW_S
NOWHERE = "redis://127.0.0.1:1/9"  # nothing listens on port 1
TTL_SLACK_S = 1.0  # a TTL read back may have run down a little (real clock)


TODAY = utc_day(datetime.now(UTC))
"""The quotas' day: any day works (the counter takes the caller's), but a Redis key expires
by the server's clock, so its expiry must lie ahead of the real time."""
COUNTED, CAP_REACHED, UNSEEDED = DailyCount.COUNTED, DailyCount.CAP_REACHED, DailyCount.UNSEEDED


def quota_of(day: date, cap: int | None) -> DailyQuota:
    return DailyQuota(day=day, cap=cap, expires_at=daily_count_expiry(day))


async def lose_the_counters(kv: KvHarness) -> None:
    """What a flushed or failed-over store does to the daily counters."""
    if isinstance(kv, MemoryHarness):
        kv.daily.forget()
    else:
        assert isinstance(kv, RedisHarness)
        await kv.connections.commands.flushdb()


def assert_ttl(left: float | None, expected: float) -> None:
    assert left is not None, "the key is absent"
    assert expected - TTL_SLACK_S < left <= expected


async def admit(
    kv: KvHarness,
    fingerprint: str,
    *,
    user_id: str = "u1",
    ttl_s: int = 600,
    limit: int = LIMIT,
    window_s: float = WINDOW,
) -> Admission:
    return await kv.admission.admit(fingerprint, ttl_s, user_id, limit, window_s)


async def fill_the_window(kv: KvHarness, user_id: str = "u1", limit: int = LIMIT) -> None:
    for n in range(limit):
        admitted = await admit(kv, f"fill-{user_id}-{n}", user_id=user_id, limit=limit)
        assert admitted.claimed


def test_the_adapters_implement_the_port(kv: KvHarness) -> None:
    assert isinstance(kv.admission, WebhookAdmission)


async def test_a_fresh_request_is_counted_and_claimed(kv: KvHarness) -> None:
    admission = await admit(kv, "fp1")

    assert admission.fresh and admission.claimed
    assert admission.rate is not None
    assert (admission.rate.allowed, admission.rate.remaining) == (True, LIMIT - 1)
    assert admission.rate.retry_after_s is None
    assert_ttl(await kv.ttl_s("replay", "u1:fp1"), 600)
    assert not await kv.replay.claim("u1", "fp1", 600)  # the ReplayStore's own key


async def test_a_replay_is_refused_without_spending_a_slot(kv: KvHarness) -> None:
    assert (await admit(kv, "fp1", limit=3)).claimed
    assert await kv.replay.claim("u1", "fp2", 600)  # claimed outside the admission: a replay too

    replays = [await admit(kv, fp, limit=3) for fp in ("fp1", "fp2", "fp1", "fp1", "fp2")]

    assert replays == [Admission(fresh=False, rate=None)] * 5
    # one slot spent of three, by the first admission only (the windows are the limiter's)
    assert (await kv.limiter.hit("u1", 3, 60)).remaining == 1


async def test_a_replay_wins_over_a_full_window(kv: KvHarness) -> None:
    await fill_the_window(kv)
    assert not (await kv.limiter.hit("u1", LIMIT, WINDOW)).allowed

    assert await admit(kv, "fill-u1-0") == Admission(fresh=False, rate=None)


async def test_the_61st_request_is_refused_with_retry_after_and_no_replay_key(
    kv: KvHarness,
) -> None:
    await fill_the_window(kv)

    refused = await admit(kv, "fp-61")

    assert refused.fresh and not refused.claimed
    assert refused.rate is not None and not refused.rate.allowed
    assert refused.rate.remaining == 0
    assert refused.rate.retry_after_s is not None
    assert WINDOW - TTL_SLACK_S < refused.rate.retry_after_s <= WINDOW
    assert await kv.ttl_s("replay", "u1:fp-61") is None
    resent = await admit(kv, "fp-61")  # the sender's resend is refused the same way
    assert resent.fresh and not resent.claimed
    assert await kv.replay.claim("u1", "fp-61", 600)  # the sender's body is still unspent


async def test_exactly_the_limit_of_concurrent_distinct_requests_is_admitted(
    kv: KvHarness,
) -> None:
    fingerprints = [f"fp-{n}" for n in range(2 * LIMIT)]

    answers = await asyncio.gather(*(admit(kv, fp) for fp in fingerprints))

    assert all(a.fresh and a.rate is not None for a in answers)
    admitted = [fp for fp, a in zip(fingerprints, answers, strict=True) if a.claimed]
    assert len(admitted) == LIMIT
    remaining = sorted(a.rate.remaining for a in answers if a.claimed and a.rate)
    assert remaining == list(range(LIMIT))
    for fp, answer in zip(fingerprints, answers, strict=True):
        assert answer.rate is not None
        if answer.claimed:
            assert_ttl(await kv.ttl_s("replay", f"u1:{fp}"), 600)
        else:
            assert answer.rate.retry_after_s is not None
            assert 0 < answer.rate.retry_after_s <= WINDOW
            assert await kv.ttl_s("replay", f"u1:{fp}") is None
    assert not (await kv.limiter.hit("u1", LIMIT, WINDOW)).allowed


async def test_concurrent_copies_of_one_request_claim_once_and_spend_one_slot(
    kv: KvHarness,
) -> None:
    answers = await asyncio.gather(*(admit(kv, "fp1", limit=3) for _ in range(30)))

    assert sum(a.claimed for a in answers) == 1
    assert sum(not a.fresh for a in answers) == 29
    assert (await kv.limiter.hit("u1", 3, 60)).remaining == 1


async def test_users_have_their_own_windows(kv: KvHarness) -> None:
    await fill_the_window(kv, "u1", limit=2)

    other = await admit(kv, "fp-u2", user_id="u2", limit=2)

    assert other.claimed and other.rate is not None and other.rate.remaining == 1


async def test_the_replay_key_lives_for_its_ttl(kv: KvHarness) -> None:
    assert (await admit(kv, "fp1", ttl_s=300)).claimed
    assert (await admit(kv, "short", ttl_s=0)).claimed  # below one second: one second
    assert_ttl(await kv.ttl_s("replay", "u1:fp1"), 300)
    assert_ttl(await kv.ttl_s("replay", "u1:short"), 1)

    assert not (await admit(kv, "fp1", ttl_s=900)).fresh
    assert_ttl(await kv.ttl_s("replay", "u1:fp1"), 300)  # a replay does not extend it

    await kv.lapse("replay", "u1:fp1")
    assert (await admit(kv, "fp1")).claimed


async def test_a_released_claim_can_be_admitted_again(kv: KvHarness) -> None:
    assert (await admit(kv, "fp1")).claimed
    await kv.replay.release("u1", "fp1")  # a 5xx before the intent was durable
    assert await kv.ttl_s("replay", "u1:fp1") is None
    again = await admit(kv, "fp1")
    assert again.claimed and again.rate is not None and again.rate.remaining == LIMIT - 2


async def test_hits_leave_the_window_and_refused_requests_are_not_counted(
    kv: KvHarness,
) -> None:
    window = 0.2
    assert (await admit(kv, "A", limit=2, window_s=window)).claimed
    await kv.pass_time(window / 2)
    assert (await admit(kv, "B", limit=2, window_s=window)).claimed
    refused = await admit(kv, "C", limit=2, window_s=window)  # not recorded, not claimed
    assert not refused.claimed and refused.rate is not None
    assert refused.rate.retry_after_s is not None and 0 < refused.rate.retry_after_s <= window
    await kv.pass_time(window / 2)
    # A left the window, B is still in it: had C been counted, its resend would be refused.
    assert (await admit(kv, "C", limit=2, window_s=window)).claimed


async def test_a_zero_limit_refuses_with_the_whole_window(kv: KvHarness) -> None:
    refused = await admit(kv, "fp1", limit=0, window_s=60)
    assert refused.fresh and refused.rate is not None
    assert (refused.rate.allowed, refused.rate.remaining, refused.rate.retry_after_s) == (
        False,
        0,
        60,
    )
    assert await kv.ttl_s("replay", "u1:fp1") is None


@pytest.mark.parametrize(("limit", "window_s"), [(-1, 60.0), (60, 0.0), (60, float("nan"))])
async def test_bad_limits_are_refused_before_anything_is_stored(
    kv: KvHarness, limit: int, window_s: float
) -> None:
    with pytest.raises(ValueError, match=r"limit|window"):
        await admit(kv, "fp1", limit=limit, window_s=window_s)
    assert await kv.ttl_s("replay", "u1:fp1") is None
    assert (await kv.limiter.hit("u1", 3, 60)).remaining == 2


# --- The daily count -------------------------------------------------------------------------


def test_the_daily_counters_implement_the_port(kv: KvHarness) -> None:
    assert isinstance(kv.daily, DailyOrderCounter)


async def test_an_unseeded_counter_stores_and_counts_nothing(kv: KvHarness) -> None:
    quota = quota_of(TODAY, cap=5)

    answer = await kv.admission.admit("fp1", 600, "u1", LIMIT, WINDOW, quota)

    assert answer == Admission(fresh=True, rate=None, daily=UNSEEDED)
    assert answer.unseeded and not answer.claimed
    assert await kv.ttl_s("replay", "u1:fp1") is None  # no replay key
    assert (await kv.limiter.hit("u1", LIMIT, WINDOW)).remaining == LIMIT - 1  # no hit
    assert await kv.daily.take("u1", quota) is UNSEEDED  # still absent


async def test_a_replay_is_a_replay_before_the_counter_is_looked_at(kv: KvHarness) -> None:
    assert await kv.replay.claim("u1", "fp1", 600)
    answer = await kv.admission.admit("fp1", 600, "u1", LIMIT, WINDOW, quota_of(TODAY, 5))
    assert answer == Admission(fresh=False, rate=None)


async def test_admitted_requests_count_up_to_the_cap(kv: KvHarness) -> None:
    quota = quota_of(TODAY, cap=3)
    assert await kv.daily.seed("u1", quota, 1)

    answers = [
        await kv.admission.admit(f"fp{n}", 600, "u1", LIMIT, WINDOW, quota) for n in range(4)
    ]

    assert [a.daily for a in answers] == [COUNTED, COUNTED, CAP_REACHED, CAP_REACHED]
    # the capped ones were still admitted by the limiter and claimed (the checks refuse them)
    assert all(a.claimed for a in answers)
    assert await kv.daily.take("u1", quota) is CAP_REACHED
    assert await kv.daily.take("u2", quota) is UNSEEDED  # per user


async def test_replays_and_rate_refusals_are_not_counted(kv: KvHarness) -> None:
    quota = quota_of(TODAY, cap=3)
    assert await kv.daily.seed("u1", quota, 0)
    assert (await kv.admission.admit("fp1", 600, "u1", 2, WINDOW, quota)).daily is COUNTED
    assert not (await kv.admission.admit("fp1", 600, "u1", 2, WINDOW, quota)).fresh
    assert (await kv.admission.admit("fp2", 600, "u1", 2, WINDOW, quota)).daily is COUNTED
    refused = await kv.admission.admit("fp3", 600, "u1", 2, WINDOW, quota)

    assert refused.rate is not None and not refused.rate.allowed and refused.daily is None
    assert await kv.daily.take("u1", quota) is COUNTED  # the third of three
    assert await kv.daily.take("u1", quota) is CAP_REACHED


async def test_an_uncapped_quota_counts_without_refusing(kv: KvHarness) -> None:
    assert await kv.daily.seed("u1", quota_of(TODAY, None), 10_000)
    assert await kv.daily.take("u1", quota_of(TODAY, None)) is COUNTED
    assert await kv.daily.take("u1", quota_of(TODAY, 10_001)) is CAP_REACHED


async def test_a_seed_never_overwrites_a_counter(kv: KvHarness) -> None:
    quota = quota_of(TODAY, cap=6)
    assert await kv.daily.seed("u1", quota, 5)
    assert not await kv.daily.seed("u1", quota, 0)
    assert await kv.daily.take("u1", quota) is COUNTED
    assert await kv.daily.take("u1", quota) is CAP_REACHED


async def test_a_release_gives_one_back_never_below_zero_and_never_creates(
    kv: KvHarness,
) -> None:
    quota = quota_of(TODAY, cap=1)
    await kv.daily.release("u1", TODAY)  # absent: stays absent
    assert await kv.daily.take("u1", quota) is UNSEEDED
    assert await kv.daily.seed("u1", quota, 0)
    await kv.daily.release("u1", TODAY)  # at zero: stays zero
    assert await kv.daily.take("u1", quota) is COUNTED
    assert await kv.daily.take("u1", quota) is CAP_REACHED
    await kv.daily.release("u1", TODAY)
    assert await kv.daily.take("u1", quota) is COUNTED
    assert await kv.daily.take("u1", quota) is CAP_REACHED


async def test_concurrent_requests_race_for_the_last_slot_and_one_wins(kv: KvHarness) -> None:
    quota = quota_of(TODAY, cap=10)
    assert await kv.daily.seed("u1", quota, 9)

    admissions, takes = await asyncio.gather(
        asyncio.gather(
            *(kv.admission.admit(f"fp{n}", 600, "u1", LIMIT, WINDOW, quota) for n in range(20))
        ),
        asyncio.gather(*(kv.daily.take("u1", quota) for _ in range(20))),
    )

    answers = [a.daily for a in admissions] + list(takes)
    assert answers.count(COUNTED) == 1
    assert answers.count(CAP_REACHED) == 39


async def test_the_counter_is_the_callers_day(kv: KvHarness) -> None:
    """Each day has its own counter, named by the day the caller passes (on Redis the server's
    clock never picks it: a day a month ahead works the same)."""
    today, later = quota_of(TODAY, cap=1), quota_of(TODAY + timedelta(days=30), cap=1)
    assert await kv.daily.seed("u1", today, 1)
    assert await kv.daily.take("u1", today) is CAP_REACHED
    assert await kv.admission.admit("fp1", 600, "u1", LIMIT, WINDOW, later) == Admission(
        fresh=True, rate=None, daily=UNSEEDED
    )
    assert await kv.daily.seed("u1", later, 0)
    assert (await kv.admission.admit("fp1", 600, "u1", LIMIT, WINDOW, later)).daily is COUNTED
    assert await kv.daily.take("u1", today) is CAP_REACHED
    await kv.daily.release("u1", later.day)
    assert await kv.daily.take("u1", today) is CAP_REACHED  # a release is the day's own


async def test_a_day_counter_lives_past_the_days_end_then_goes() -> None:
    """On the memory adapter's clock: the counter of a day outlives midnight by the grace, so a
    late request of that day still finds it, then it goes (a new day's counter is seeded)."""
    kv = MemoryHarness()
    day = utc_day(kv.clock.now())
    quota = quota_of(day, cap=1)
    assert await kv.daily.seed("u1", quota, 1)
    kv.clock.set(datetime.combine(day + timedelta(days=1), datetime.min.time(), tzinfo=UTC))
    assert await kv.daily.take("u1", quota) is CAP_REACHED  # the day's end: still there
    kv.clock.set(quota.expires_at)
    assert await kv.daily.take("u1", quota) is UNSEEDED


def order_row(n: int, created_at: datetime, user_id: str = "u1") -> OrderHistoryRecord:
    return OrderHistoryRecord(
        id=f"o-{n}-{user_id}",
        user_id=user_id,
        trading_account_id="acct",
        broker_name="paper",
        symbol="BTCUSDT",
        action=AlertAction.BUY,
        quantity=Decimal("0.01"),
        order_type=OrderType.ENTRY,
        source=Source.WEBHOOK,
        simulation=True,
        status=OrderStatus.CANCELLED if n % 2 else OrderStatus.FILLED,  # every row counts
        created_at=created_at,
        request_id=f"req-{n}-{user_id}",
    )


async def test_a_lost_counter_is_seeded_from_the_order_history(kv: KvHarness) -> None:
    """After the store lost its data the day's orders are counted again from the history,
    so the user gets no second day's cap."""
    history = MemoryOrderHistory()
    midnight = datetime.combine(TODAY, datetime.min.time(), tzinfo=UTC)
    for n, at in enumerate(
        [midnight - timedelta(seconds=1), midnight, midnight + timedelta(hours=3)]
    ):
        await history.add(order_row(n, at))
    await history.add(order_row(9, midnight, user_id="u2"))
    daily = DailyOrders(kv.daily, history)
    quota = quota_of(TODAY, cap=3)
    assert await daily.take("u1", quota) is COUNTED  # seeded at 2 (the day's two rows), then 3
    await history.add(order_row(3, midnight + timedelta(hours=4)))

    await lose_the_counters(kv)

    assert await daily.take("u1", quota) is CAP_REACHED  # seeded at 3 again, not at 0
    answer = await kv.admission.admit("fp1", 600, "u1", LIMIT, WINDOW, quota)
    assert answer.daily is CAP_REACHED


# --- Redis only ------------------------------------------------------------------------------


@pytest.mark.redis
async def test_the_keys_are_the_replay_stores_the_limiters_and_the_counters(
    redis_client: Redis,
) -> None:
    admission = RedisWebhookAdmission(redis_client)
    counter = RedisDailyOrderCounter(redis_client)
    quota = quota_of(TODAY, cap=100)
    assert await counter.seed("u1", quota, 5)
    await asyncio.gather(*(admission.admit(f"fp{n}", 600, "u1", 60, 60, quota) for n in range(10)))
    await admission.admit("fp0", 600, "u1", 60, 60, quota)  # a replay: no eleventh member

    assert await redis_client.zcard("ratelimit:{u1}") == 10  # unique members
    pttl = await redis_client.pttl("ratelimit:{u1}")
    assert RATE_KEY_TTL_S * 1000 - 1000 < pttl <= RATE_KEY_TTL_S * 1000
    assert await redis_client.get("webhook:replay:{u1}:fp3") == "1"
    day_key = f"orders:daily:{{u1}}:{TODAY.isoformat()}"
    assert await redis_client.get(day_key) == "15"
    assert set(await redis_client.keys("*")) == {"ratelimit:{u1}", day_key} | {
        f"webhook:replay:{{u1}}:fp{n}" for n in range(10)
    }
    # every key of one script is in the user's slot (a Redis Cluster runs it on one node)
    tags = {k[k.index("{") : k.index("}") + 1] for k in await redis_client.keys("*")}
    assert tags == {"{u1}"}
    expiry_s = await redis_client.expiretime(day_key)
    assert expiry_s == math.ceil(daily_count_expiry(TODAY).timestamp())
    await RedisReplayStore(redis_client).release("u1", "fp3")
    assert not await redis_client.exists("webhook:replay:{u1}:fp3")
    assert (await RedisRateLimiter(redis_client).hit("u1", 60, 60)).remaining == 49


@pytest.mark.redis
async def test_a_refused_request_does_not_refresh_the_window_ttl(redis_client: Redis) -> None:
    admission = RedisWebhookAdmission(redis_client)
    assert (await admission.admit("fp1", 600, "u1", 1, 60)).claimed
    await redis_client.pexpire("ratelimit:{u1}", 10_000)
    assert not (await admission.admit("fp2", 600, "u1", 1, 60)).claimed
    assert await redis_client.pttl("ratelimit:{u1}") <= 10_000


@pytest.mark.redis
async def test_one_admission_is_one_command(
    redis_client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    admission = RedisWebhookAdmission(redis_client)
    await admission.admit("warm-up", 600, "u0", 60, 60)  # the script is cached from here on
    sent: list[str] = []
    batcher = shared_batcher(redis_client)  # every call of the adapter goes through it
    send = batcher._send

    async def counted(commands: list[tuple[Any, ...]]) -> list[Any]:
        sent.extend(str(command[0]) for command in commands)
        return await send(commands)

    monkeypatch.setattr(batcher, "_send", counted)
    await admission.admit("fp1", 600, "u1", 60, 60)
    await admission.admit("fp1", 600, "u1", 60, 60)

    assert sent == ["EVALSHA", "EVALSHA"]


async def _unavailable(call: Callable[[], Awaitable[object]]) -> None:
    with pytest.raises(KeyValueStoreUnavailable) as caught:
        await call()
    assert isinstance(caught.value.__cause__, rx.ConnectionError)


async def test_an_unreachable_server_raises_and_does_not_fail_open() -> None:
    connections = open_connections(NOWHERE, socket_timeout_s=0.5, connect_timeout_s=0.5)
    try:
        admission = RedisWebhookAdmission(connections.commands)
        await _unavailable(lambda: admission.admit("fp", 600, "u1", 60, 60))
    finally:
        await connections.aclose()
