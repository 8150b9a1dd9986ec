"""The in-memory replay store, rate limiter and alert throttle, on a fake clock."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from tradecore.ports.protection import AlertThrottle, RateLimiter, ReplayStore
from tradecore.testing.clock import FakeClock
from tradecore_adapters.memory.protection import (
    MemoryAlertThrottle,
    MemoryRateLimiter,
    MemoryReplayStore,
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_adapters_implement_the_ports(clock: FakeClock) -> None:
    assert isinstance(MemoryReplayStore(clock), ReplayStore)
    assert isinstance(MemoryRateLimiter(clock), RateLimiter)
    assert isinstance(MemoryAlertThrottle(clock), AlertThrottle)


# --- Replay store ---------------------------------------------------------------------------


async def test_replay_claim_is_set_if_absent(clock: FakeClock) -> None:
    store = MemoryReplayStore(clock)
    assert await store.claim("u1", "fp", 300)
    assert not await store.claim("u1", "fp", 300)
    assert await store.claim("u1", "other", 300)


async def test_replay_key_expires(clock: FakeClock) -> None:
    store = MemoryReplayStore(clock)
    assert await store.claim("u1", "fp", 300)
    clock.advance(299.9)
    assert not await store.claim("u1", "fp", 300)
    clock.advance(0.1)
    assert await store.claim("u1", "fp", 300)


async def test_a_refused_claim_does_not_extend_the_key(clock: FakeClock) -> None:
    store = MemoryReplayStore(clock)
    await store.claim("u1", "fp", 10)
    clock.advance(5)
    assert not await store.claim("u1", "fp", 1000)
    clock.advance(5)
    assert await store.claim("u1", "fp", 10)


async def test_release_frees_the_key_and_is_idempotent(clock: FakeClock) -> None:
    store = MemoryReplayStore(clock)
    await store.claim("u1", "fp", 300)
    await store.release("u1", "fp")
    await store.release("u1", "fp")
    await store.release("u1", "never-claimed")
    assert await store.claim("u1", "fp", 300)


async def test_concurrent_claims_of_one_fingerprint_have_one_winner(clock: FakeClock) -> None:
    store = MemoryReplayStore(clock)
    results = await asyncio.gather(*(store.claim("u1", "fp", 300) for _ in range(50)))
    assert results.count(True) == 1


async def test_expired_replay_keys_do_not_accumulate(clock: FakeClock) -> None:
    store = MemoryReplayStore(clock)
    for i in range(3000):
        await store.claim("u1", f"fp-{i}", 1)
        clock.advance(0.01)
    assert len(store._keys) < 1500  # 3000 without sweeping


# --- Rate limiter ---------------------------------------------------------------------------


async def test_exactly_limit_of_concurrent_hits_are_admitted(clock: FakeClock) -> None:
    limiter = MemoryRateLimiter(clock)
    decisions = await asyncio.gather(*(limiter.hit("u1", 60, 60) for _ in range(120)))
    admitted = [d for d in decisions if d.allowed]
    assert len(admitted) == 60
    assert sorted(d.remaining for d in admitted) == list(range(60))
    refused = [d for d in decisions if not d.allowed]
    assert all(d.retry_after_s == pytest.approx(60) for d in refused)


async def test_users_have_separate_windows(clock: FakeClock) -> None:
    limiter = MemoryRateLimiter(clock)
    for _ in range(3):
        assert (await limiter.hit("u1", 3, 60)).allowed
    assert not (await limiter.hit("u1", 3, 60)).allowed
    assert (await limiter.hit("u2", 3, 60)).allowed


async def test_the_window_slides(clock: FakeClock) -> None:
    limiter = MemoryRateLimiter(clock)
    assert (await limiter.hit("u1", 2, 60)).allowed
    clock.advance(30)
    assert (await limiter.hit("u1", 2, 60)).allowed
    refused = await limiter.hit("u1", 2, 60)
    assert not refused.allowed
    assert refused.retry_after_s == pytest.approx(30)
    clock.advance(30)  # the first hit leaves the window
    assert (await limiter.hit("u1", 2, 60)).allowed
    assert not (await limiter.hit("u1", 2, 60)).allowed


async def test_refused_hits_do_not_extend_the_block(clock: FakeClock) -> None:
    limiter = MemoryRateLimiter(clock)
    assert (await limiter.hit("u1", 1, 60)).allowed
    for _ in range(10):
        clock.advance(5)
        assert not (await limiter.hit("u1", 1, 60)).allowed
    clock.advance(10)
    assert (await limiter.hit("u1", 1, 60)).allowed


class BrokenClock:
    def now(self) -> datetime:
        raise OSError("clock unavailable")


async def test_the_limiter_fails_open() -> None:
    limiter = MemoryRateLimiter(BrokenClock())
    decision = await limiter.hit("u1", 60, 60)
    assert decision.allowed


async def test_nonsense_limits_fail_open_rather_than_raise(clock: FakeClock) -> None:
    limiter = MemoryRateLimiter(clock)
    assert (await limiter.hit("u1", -1, 0)).allowed


async def test_idle_windows_are_dropped(clock: FakeClock) -> None:
    limiter = MemoryRateLimiter(clock)
    for i in range(3000):
        await limiter.hit(f"u{i}", 60, 60)
        clock.advance(0.1)
    assert len(limiter._windows) < 2000  # 3000 without sweeping


# --- Alert throttle -------------------------------------------------------------------------


async def test_one_claim_per_period(clock: FakeClock) -> None:
    throttle = MemoryAlertThrottle(clock)
    assert await throttle.try_claim("u1", 1800)
    clock.advance(1799)
    assert not await throttle.try_claim("u1", 1800)
    assert await throttle.try_claim("u2", 1800)
    clock.advance(1)
    assert await throttle.try_claim("u1", 1800)


async def test_concurrent_claims_have_exactly_one_winner(clock: FakeClock) -> None:
    throttle = MemoryAlertThrottle(clock)
    results = await asyncio.gather(*(throttle.try_claim("u1", 1800) for _ in range(50)))
    assert results.count(True) == 1


async def test_release_gives_the_slot_back(clock: FakeClock) -> None:
    throttle = MemoryAlertThrottle(clock)
    assert await throttle.try_claim("u1", 1800)
    await throttle.release("u1")
    assert await throttle.try_claim("u1", 1800)
    assert not await throttle.try_claim("u1", 1800)
    await throttle.release("nobody")
