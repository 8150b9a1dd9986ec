"""Contract of WebhookAdmission (the webhook's replay claim and rate-limit hit as one step), on
the memory and the Redis adapters alike, and what only the Redis one has: its key layout, one
command per call, and no fail open."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from redis import exceptions as rx
from redis.asyncio import Redis
from redis_fixtures import KvHarness

from tradecore.errors import KeyValueStoreUnavailable
from tradecore.limits import RATE_KEY_TTL_S, RATE_LIMIT_PER_MINUTE, RATE_WINDOW_S
from tradecore.ports.protection import Admission, WebhookAdmission
from tradecore_adapters.redis import RedisRateLimiter, RedisReplayStore, open_connections
from tradecore_adapters.redis.protection import RedisWebhookAdmission

LIMIT = RATE_LIMIT_PER_MINUTE
WINDOW = RATE_WINDOW_S
NOWHERE = "redis://127.0.0.1:1/9"  # nothing listens on port 1
TTL_SLACK_S = 1.0  # a TTL read back may have run down a little (real clock)


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
    assert_ttl(await kv.ttl_s("replay", "fp1"), 600)
    assert not await kv.replay.claim("fp1", 600)  # the ReplayStore's own key


async def test_a_replay_is_refused_without_spending_a_slot(kv: KvHarness) -> None:
    assert (await admit(kv, "fp1", limit=3)).claimed
    assert await kv.replay.claim("fp2", 600)  # claimed outside the admission: a replay too

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
    assert await kv.ttl_s("replay", "fp-61") is None
    resent = await admit(kv, "fp-61")  # the sender's resend is refused the same way
    assert resent.fresh and not resent.claimed
    assert await kv.replay.claim("fp-61", 600)  # the sender's body is still unspent


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
            assert_ttl(await kv.ttl_s("replay", fp), 600)
        else:
            assert answer.rate.retry_after_s is not None
            assert 0 < answer.rate.retry_after_s <= WINDOW
            assert await kv.ttl_s("replay", fp) is None
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
    assert_ttl(await kv.ttl_s("replay", "fp1"), 300)
    assert_ttl(await kv.ttl_s("replay", "short"), 1)

    assert not (await admit(kv, "fp1", ttl_s=900)).fresh
    assert_ttl(await kv.ttl_s("replay", "fp1"), 300)  # a replay does not extend it

    await kv.lapse("replay", "fp1")
    assert (await admit(kv, "fp1")).claimed


async def test_a_released_claim_can_be_admitted_again(kv: KvHarness) -> None:
    assert (await admit(kv, "fp1")).claimed
    await kv.replay.release("fp1")  # a 5xx before the intent was durable
    assert await kv.ttl_s("replay", "fp1") is None
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
    assert await kv.ttl_s("replay", "fp1") is None


@pytest.mark.parametrize(("limit", "window_s"), [(-1, 60.0), (60, 0.0), (60, float("nan"))])
async def test_bad_limits_are_refused_before_anything_is_stored(
    kv: KvHarness, limit: int, window_s: float
) -> None:
    with pytest.raises(ValueError, match=r"limit|window"):
        await admit(kv, "fp1", limit=limit, window_s=window_s)
    assert await kv.ttl_s("replay", "fp1") is None
    assert (await kv.limiter.hit("u1", 3, 60)).remaining == 2


# --- Redis only ------------------------------------------------------------------------------


@pytest.mark.redis
async def test_the_keys_are_the_replay_stores_and_the_limiters(redis_client: Redis) -> None:
    admission = RedisWebhookAdmission(redis_client)
    await asyncio.gather(*(admission.admit(f"fp{n}", 600, "u1", 60, 60) for n in range(10)))
    await admission.admit("fp0", 600, "u1", 60, 60)  # a replay: no eleventh member

    assert await redis_client.zcard("ratelimit:u1") == 10  # unique members
    pttl = await redis_client.pttl("ratelimit:u1")
    assert RATE_KEY_TTL_S * 1000 - 1000 < pttl <= RATE_KEY_TTL_S * 1000
    assert await redis_client.get("webhook:replay:fp3") == "1"
    assert set(await redis_client.keys("*")) == {"ratelimit:u1"} | {
        f"webhook:replay:fp{n}" for n in range(10)
    }
    await RedisReplayStore(redis_client).release("fp3")
    assert not await redis_client.exists("webhook:replay:fp3")
    assert (await RedisRateLimiter(redis_client).hit("u1", 60, 60)).remaining == 49


@pytest.mark.redis
async def test_a_refused_request_does_not_refresh_the_window_ttl(redis_client: Redis) -> None:
    admission = RedisWebhookAdmission(redis_client)
    assert (await admission.admit("fp1", 600, "u1", 1, 60)).claimed
    await redis_client.pexpire("ratelimit:u1", 10_000)
    assert not (await admission.admit("fp2", 600, "u1", 1, 60)).claimed
    assert await redis_client.pttl("ratelimit:u1") <= 10_000


@pytest.mark.redis
async def test_one_admission_is_one_command(
    redis_client: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    admission = RedisWebhookAdmission(redis_client)
    await admission.admit("warm-up", 600, "u0", 60, 60)  # the script is cached from here on
    sent: list[str] = []
    execute = redis_client.execute_command

    async def counted(*args: Any, **options: Any) -> Any:
        sent.append(str(args[0]))
        return await execute(*args, **options)

    monkeypatch.setattr(redis_client, "execute_command", counted)
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
