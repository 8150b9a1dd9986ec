"""Contract of ``RateLimiter.release`` (the sign-in throttles give back the slot of an attempt
that does not count), on the memory and the Redis adapters alike."""

from __future__ import annotations

from redis_fixtures import KvHarness


async def test_release_gives_back_the_newest_hit(kv: KvHarness) -> None:
    for _ in range(3):
        assert (await kv.limiter.hit("auth-login:ip:192.0.2.1", 3, 60)).allowed
    assert not (await kv.limiter.hit("auth-login:ip:192.0.2.1", 3, 60)).allowed
    await kv.limiter.release("auth-login:ip:192.0.2.1")
    again = await kv.limiter.hit("auth-login:ip:192.0.2.1", 3, 60)
    assert (again.allowed, again.remaining) == (True, 0)
    assert not (await kv.limiter.hit("auth-login:ip:192.0.2.1", 3, 60)).allowed


async def test_release_keeps_the_older_hits_and_their_retry_after(kv: KvHarness) -> None:
    window = 0.2
    assert (await kv.limiter.hit("k", 2, window)).allowed  # A
    await kv.pass_time(window / 2)
    assert (await kv.limiter.hit("k", 2, window)).allowed  # B
    await kv.limiter.release("k")  # B leaves, A stays
    assert (await kv.limiter.hit("k", 2, window)).allowed  # C
    refused = await kv.limiter.hit("k", 2, window)
    assert not refused.allowed
    assert refused.retry_after_s is not None
    assert 0 < refused.retry_after_s <= window / 2 + 0.05  # until A leaves, not B


async def test_release_of_an_empty_or_unknown_window_does_nothing(kv: KvHarness) -> None:
    await kv.limiter.release("nobody")
    await kv.limiter.release("nobody")
    assert (await kv.limiter.hit("nobody", 1, 60)).allowed
    assert (await kv.limiter.hit("other", 1, 60)).allowed
    await kv.limiter.release("nobody")
    await kv.limiter.release("nobody")
    assert (await kv.limiter.hit("nobody", 1, 60)).allowed
    assert not (await kv.limiter.hit("other", 1, 60)).allowed
